"""`Dataset(samples=...)`: the fast path over a selection of a store's samples (what
`ImageFolder.sample_ids` picks from a tree with stray files): each selected sample once an
epoch and no other, whatever the plan, ranks, workers, caches or restarts."""

from __future__ import annotations

import collections
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.format.conftest import write_tree
from tests.torch.conftest import N
from tierfeed.config import world_for
from tierfeed.errors import ConfigError
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, ImageFolder, Loader, TierConfig
from tierfeed.torch.dataset import feed_of

pytestmark = pytest.mark.timeout(120)

PLANS = ["global", "local", "partial:0.3", "global,chunkwise:2", "local,chunkwise:3"]


def key(sample: Sample) -> str:
    return sample.key


def keys(batch: list[str]) -> list[str]:
    return batch


def keys_of(store_dir: Path, ids: np.ndarray) -> list[str]:
    with Index(store_dir) as index:
        return sorted(index.key(int(i)) for i in ids)


def delivered(loader: Loader, limit: int | None = None) -> list[str]:
    return [k for batch in itertools.islice(iter(loader), limit) for k in batch]


def check_once(got: list[str], wanted: list[str], world_size: int) -> None:
    """Each wanted key delivered, none other; repeats only where a plan pads its ranks to
    equal lengths (DistributedSampler's padding: fewer than one sample per rank)."""
    assert set(got) == set(wanted)
    assert len(got) - len(wanted) < world_size
    assert max(collections.Counter(got).values()) <= (2 if world_size > 1 else 1)


# --- the plan reads the selection -------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    mask=st.lists(st.booleans(), min_size=N, max_size=N).filter(any),
    plan=st.sampled_from(PLANS),
    world_size=st.integers(1, 4),
    epoch=st.integers(0, 3),
)
def test_every_rank_together_reads_each_selected_sample_once(
    store_dir: Path, mask: list[bool], plan: str, world_size: int, epoch: int
) -> None:
    ids = np.flatnonzero(mask)
    got: list[int] = []
    for rank in range(world_size):
        ds = Dataset(store_dir, plan, batch_size=8, samples=ids, world=world_for(rank, world_size))
        ds.set_epoch(epoch)
        got += feed_of(ds).rank_order().tolist()
    assert set(got) == set(ids.tolist())
    assert len(got) - len(ids) < world_size  # padding only
    # The same selection given as a mask, shuffled ids or a list plans the same order.
    rng = np.random.default_rng(epoch)
    for same in (np.asarray(mask), rng.permutation(ids), ids.tolist()):
        ds = Dataset(store_dir, plan, batch_size=8, samples=same, world=world_for(0, world_size))
        ds.set_epoch(epoch)
        first = Dataset(store_dir, plan, batch_size=8, samples=ids, world=world_for(0, world_size))
        first.set_epoch(epoch)
        assert feed_of(ds).rank_order().tolist() == feed_of(first).rank_order().tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_hold_the_selection_once_per_epoch(store_dir: Path, workers: int) -> None:
    ids = np.arange(N)[np.arange(N) % 5 != 0]  # a sample in five left out
    ds = Dataset(store_dir, "global", batch_size=16, decode=key, collate=keys, samples=ids)
    with Loader(ds, num_workers=workers) as loader:
        assert len(loader) == -(-len(ids) // 16)
        for epoch in range(2):
            loader.set_epoch(epoch)
            got = delivered(loader)
            assert sorted(got) == keys_of(store_dir, ids)


def test_a_disk_tier_holds_only_the_chunks_the_selection_reads(
    store_dir: Path, tmp_path: Path
) -> None:
    with Index(store_dir) as index:
        chunk = index.sample_chunk.astype(np.int64)
        sizes = [c.size for c in index.chunks()]
    ids = np.flatnonzero(chunk % 2 == 0)  # the samples of every other chunk
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**8, policy="clairvoyant")
    ds = Dataset(store_dir, "global", batch_size=8, decode=key, collate=keys, samples=ids,
                 tiers=tiers)  # fmt: skip
    copied = 0
    with Loader(ds, num_workers=2) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(delivered(loader)) == keys_of(store_dir, ids)
            # Pieces of copies: each worker's head (first batch, read at once) is not in them.
            # A copy still landing as the first epoch ends counts in the second's.
            copied += loader.last_epoch["tiers"].get("fetch", {}).get("piece_bytes", 0)
    # The chunks it reads, copied once over both epochs; none of the others.
    assert 0 < copied <= sum(s for c, s in enumerate(sizes) if c % 2 == 0)


# --- a messy tree: the images, as torchvision selects them --------------------------------------


def test_imagefolder_sample_ids_let_the_fast_path_skip_stray_files(tmp_path: Path) -> None:
    files = {
        b"README.txt": b"top level",
        b"cat/.DS_Store": b"\0\0",
        b"cat/notes.txt": b"not an image",
        b"cat/a.jpg": b"a",
        b"cat/sub/b.PNG": b"b",
        b"dog/c.v2.jpeg": b"c",
        b"dog/d.json": b"{}",
        b"fish/e.webp": b"e",
    }
    write_tree(tmp_path / "tree", files)
    pack(tmp_path / "tree", tmp_path / "store", PackOptions(progress=False))
    folder = ImageFolder(tmp_path / "store")
    ids = folder.sample_ids
    ds = Dataset(tmp_path / "store", "global", batch_size=2, decode=key, collate=keys, samples=ids)
    with Loader(ds, num_workers=2) as loader:
        got = sorted(delivered(loader))
    assert got == ["cat/a", "cat/sub/b", "dog/c.v2", "fish/e"]
    assert [p for p, _ in folder.samples] == ["cat/a.jpg", "cat/sub/b.PNG", "dog/c.v2.jpeg",
                                              "fish/e.webp"]  # fmt: skip


def test_imagefolder_sample_ids_name_whole_samples_of_a_store_grouped_by_key(
    tmp_path: Path,
) -> None:
    files = {b"cat/x.jpg": b"1", b"cat/x.json": b"{}", b"cat/y.txt": b"2", b"dog/z.png": b"3"}
    write_tree(tmp_path / "tree", files)
    pack(tmp_path / "tree", tmp_path / "store", PackOptions(progress=False, group_by="key"))
    ids = ImageFolder(tmp_path / "store").sample_ids
    with Index(tmp_path / "store") as index:
        assert [index.key(int(i)) for i in ids] == ["cat/x", "dog/z"]
    fields = []
    ds = Dataset(tmp_path / "store", "global", batch_size=4, collate=keys, samples=ids)
    for batch in ds:
        fields += [sorted(k for k in s if not k.startswith("__")) for s in batch]
    assert sorted(fields) == [["jpg", "json"], ["png"]]  # the sample whole, sidecar included


# --- restarts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_reads_the_rest_of_the_selection(store_dir: Path, workers: int) -> None:
    ids = np.arange(3, N, 2)

    def make(samples: np.ndarray | None = ids) -> Loader:
        ds = Dataset(store_dir, "global", batch_size=8, decode=key, collate=keys, samples=samples)
        return Loader(ds, num_workers=workers)

    with make() as first:
        first.set_epoch(4)
        seen = delivered(first, 3)
        state = first.state_dict()
    with make() as second:
        second.load_state_dict(state)
        rest = delivered(second)
    assert sorted(seen + rest) == keys_of(store_dir, ids)
    with make(None) as everything, pytest.raises(ConfigError, match="selection of 59 samples"):
        everything.load_state_dict(state)  # positions of another order: refused
    with make(ids[1:]) as other, pytest.raises(ConfigError, match="same samples="):
        other.load_state_dict(state)
    with make() as selected, make(None) as plain:
        plain.set_epoch(4)
        next(iter(plain))
        with pytest.raises(ConfigError, match="saved reading every sample of the store"):
            selected.load_state_dict(plain.state_dict())


def test_a_job_of_another_size_resumes_the_selection(store_dir: Path) -> None:
    ids = np.flatnonzero(np.arange(N) % 3 != 1)

    def make(rank: int, size: int) -> Loader:
        ds = Dataset(store_dir, "global", batch_size=4, decode=key, collate=keys, samples=ids,
                     world=world_for(rank, size))  # fmt: skip
        return Loader(ds, num_workers=0)

    seen: list[str] = []
    states = []
    for rank in range(2):
        with make(rank, 2) as loader:
            loader.set_epoch(1)
            seen += delivered(loader, 3)
            states.append(loader.state_dict())
    rest: list[str] = []
    for rank in range(3):
        with make(rank, 3) as loader:
            loader.load_state_dict(states)
            rest += delivered(loader)
    check_once(seen + rest, keys_of(store_dir, ids), 3)


# --- what it refuses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "match"),
    [
        ([0, N], f"names sample {N}; the store's ids are 0 to {N - 1}"),
        ([-1, 2], "names sample -1"),
        ([4, 2, 4], "sample 4 more than once"),
        ([], "selects no sample"),
        (np.zeros(N, dtype=bool), "selects no sample"),
        (np.ones(N - 1, dtype=bool), f"mask of {N - 1} entries; the store has {N} samples"),
        ([0.5, 1.0], "sample ids \\(integers\\) or a mask \\(booleans\\), got float64"),
        (["a"], "got <U1"),
        ([[0, 1]], "one-dimensional"),
    ],
)
def test_a_bad_selection_is_one_clear_error(store_dir: Path, samples: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Dataset(store_dir, "global", samples=samples)  # type: ignore[arg-type]


def test_a_selection_needs_a_plan_spec_and_no_exchange(store_dir: Path) -> None:
    class Plan:
        def order(self, epoch: int, rank: int, world_size: int) -> np.ndarray:
            return np.arange(N)

    with pytest.raises(ConfigError, match="plan as its text"):
        Dataset(store_dir, Plan(), samples=[1, 2])
    with pytest.raises(ConfigError, match="exchange"):
        Dataset(store_dir, "global", samples=[1, 2], exchange=object())  # type: ignore[arg-type]
