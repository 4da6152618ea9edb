"""Every ChunkSource answers every optional ability; a minimal third-party source just works."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch

from tests.format.conftest import write_tree
from tests.storage import chunk_sources
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.storage import (
    MemoryDriver,
    PosixDriver,
    Tier,
    TierStack,
    disk_tier,
)
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.store import Sample, Store
from tierfeed.torch import Dataset, Loader

N = 40  # samples: c{i % 2}/s{i:04d}.txt holding the number i


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("caps")
    write_tree(root / "src", {f"c{i % 2}/s{i:04d}.txt".encode(): b"%d" % i for i in range(N)})
    pack(root / "src", root / "store", PackOptions(chunk_size=4096, progress=False))
    return root / "store"


def number(index: Index, sample: int) -> int:
    """The number sample ``sample`` holds: the one in its key."""
    return int(index.key(sample).split("s")[-1])


def tiered_stack(index: Index, tmp: Path) -> ChunkSource:
    tiers = [Tier(MemoryDriver(), 2**20, name="ram"), disk_tier(tmp / "disk", 2**20)]
    origin = PosixDriver(index.path.parent, read_only=True)
    return TierStack(index.chunks(), origin, tiers, "clairvoyant")


class MinimalSource(ChunkSource):
    """A third-party source: only the two required methods, over the chunk files."""

    def __init__(self, index: Index) -> None:
        self.paths = [index.path.parent / c.name for c in index.chunks()]
        self.closed = False

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        with open(self.paths[chunk], "rb") as fh:
            fh.seek(offset)
            return fh.read(length)

    def close(self) -> None:
        self.closed = True


def minimal(index: Index, tmp: Path) -> ChunkSource:
    return MinimalSource(index)


SOURCES: dict[str, Callable[[Index, Path], ChunkSource]] = {
    "directory": chunk_sources.directory,
    "stack-no-tiers": chunk_sources.stack_no_tiers,
    "stack-tiers": tiered_stack,
    "stack-namespace": chunk_sources.namespace_ram,
    "minimal": minimal,
}


@pytest.fixture(params=sorted(SOURCES))
def source(
    request: pytest.FixtureRequest, store_dir: Path, tmp_path: Path
) -> Iterator[tuple[str, Index, ChunkSource]]:
    index = Index(store_dir)
    made = SOURCES[request.param](index, tmp_path)
    try:
        yield request.param, index, made
    finally:
        made.close()
        made.close()  # idempotent
        index.close()


@pytest.mark.timeout(60)
def test_every_capability_answers(source: tuple[str, Index, ChunkSource]) -> None:
    kind, index, src = source
    chunks = list(range(len(index.chunks())))
    src.begin_epoch()
    src.open_ahead(chunks)
    src.set_future(np.asarray(chunks * 2, dtype=np.int64), read_bytes=100.0)
    assert src.prefetch() >= 0
    assert isinstance(src.schedule(0), bool)
    # Reads still serve the right bytes after every hint.
    store = Store(index, src)
    assert int(store.read_sample(3).fields["txt"]) == number(index, 3)
    src.drain(timeout=10)
    dropped = src.discard(0)  # a cache drops its copy and names it; others hold none
    assert dropped is None or isinstance(dropped, str)
    stats = src.stats()
    assert isinstance(stats, dict)
    if kind.startswith("stack"):
        assert "origin" in stats  # a tier stack always reports: its record has `tiers`
    else:
        assert stats == {}  # nothing to report: callers treat it as "no tiers"
    assert src.uses_future is kind.startswith("stack")


def test_the_base_defaults_are_no_ops(store_dir: Path) -> None:
    with Index(store_dir) as index:
        src = MinimalSource(index)
        src.open_ahead([0])
        src.set_future([0, 0])
        assert src.prefetch() == 0
        assert src.schedule(0) is False
        src.begin_epoch()
        assert src.stats() == {}
        src.drain(0.0)
        assert src.discard(0) is None


def test_a_source_must_implement_the_primitives() -> None:
    class NoClose(ChunkSource):
        def read_range(self, chunk: int, offset: int, length: int) -> bytes:
            return b""

    with pytest.raises(TypeError):
        NoClose()  # type: ignore[abstract]


def test_a_minimal_source_reads_samples(store_dir: Path) -> None:
    index = Index(store_dir)
    store = Store(index, MinimalSource(index))
    try:
        for i in (0, 7, N - 1):
            sample = store.read_sample(i)
            assert int(sample.fields["txt"]) == number(index, i)
    finally:
        store.close()


def _decode(sample: Sample) -> tuple[torch.Tensor, int]:
    return torch.tensor(int(sample.fields["txt"])), sample.label


class _Perm:
    def order(self, epoch: int, rank: int, world_size: int) -> np.ndarray:
        return np.random.default_rng(epoch).permutation(N)[rank::world_size]


@pytest.mark.timeout(60)
def test_a_minimal_source_feeds_a_loader(store_dir: Path) -> None:
    def opener() -> Store:
        index = Index(store_dir)
        return Store(index, MinimalSource(index))

    ds = Dataset(opener, _Perm(), batch_size=8, decode=_decode)
    loader = Loader(ds, num_workers=0)
    try:
        loader.set_epoch(0)
        values = sorted(int(v) for x, _ in loader for v in x)
        assert values == list(range(N))
        assert loader.last_epoch is not None
        assert loader.last_epoch["tiers"] == {}  # no tiers reported, none summed
    finally:
        loader.close()


@pytest.mark.timeout(60)
def test_a_dataset_tells_a_tier_stack_its_reads_before_the_future(
    store_dir: Path, tmp_path: Path
) -> None:
    told: list[tuple[str, int]] = []
    spans: list[tuple[np.ndarray, np.ndarray]] = []

    class Recording(TierStack):
        def set_reads(
            self, chunks: npt.ArrayLike, offsets: npt.ArrayLike, ends: npt.ArrayLike | None = None
        ) -> None:
            told.append(("reads", len(np.asarray(chunks))))
            spans.append((np.asarray(offsets), np.asarray(ends)))
            super().set_reads(chunks, offsets, ends)

        def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
            told.append(("future", len(np.asarray(sequence))))  # its prefetch starts copies
            super().set_future(sequence, read_bytes)

    def opener() -> Store:
        index = Index(store_dir)
        tiers = [disk_tier(tmp_path / "cache", 10**9)]
        return Store(
            index,
            Recording(index.chunks(), PosixDriver(store_dir, read_only=True), tiers, "clairvoyant"),
        )

    ds = Dataset(opener, _Perm(), batch_size=8, decode=_decode)
    loader = Loader(ds, num_workers=0)
    try:
        loader.set_epoch(0)
        assert sorted(int(v) for x, _ in loader for v in x) == list(range(N))
    finally:
        loader.close()
    assert told[0] == ("reads", N)  # the whole rank's epoch, before any copy begins
    assert told[1][0] == "future"
    # Each read's byte range holds every member of its sample (the rank's order: _Perm's).
    index = Index(store_dir)
    starts, ends = spans[0]
    order = _Perm().order(0, 0, 1)
    for sample, lo, hi in zip(order.tolist(), starts.tolist(), ends.tolist(), strict=True):
        for m in index.members(sample):
            offset, length = int(index.member_offset[m]), int(index.member_length[m])
            assert lo <= offset and offset + length <= hi
