"""The conventions PyTorch users expect of a loader: ``len(loader)``, one short batch an epoch
at most (so ``drop_last`` drops at most one), and decode errors that name the sample."""

from __future__ import annotations

import io
import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, UnidentifiedImageError

from tests.format.conftest import write_tree
from tests.torch.conftest import N
from tests.torch.test_loader import PermPlan, decode, slow_store, values, values_of
from tierfeed.errors import ChunkCorruptError, ConfigError, TierfeedError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader import DeadlineOptions, DecodeError, PrefetchOptions, decode_sample
from tierfeed.loader.batching import batch_count, worker_positions
from tierfeed.loader.compose import open_store
from tierfeed.loader.readers import Readers
from tierfeed.storage import DirectoryChunks
from tierfeed.storage.store import Sample, Store
from tierfeed.torch import Dataset, ImageFolder, Loader

# --- whole batches to workers (pure) ------------------------------------------------------


@given(
    n=st.integers(0, 300),
    batch=st.integers(1, 40),
    workers=st.integers(1, 6),
    drop_last=st.booleans(),
)
def test_workers_are_dealt_whole_batches(n: int, batch: int, workers: int, drop_last: bool) -> None:
    slices = [worker_positions(n, batch, w, workers, drop_last) for w in range(workers)]
    used = np.sort(np.concatenate(slices))
    expected = batch_count(n, batch, drop_last)
    assert used.tolist() == list(range(min(n, expected * batch)))  # each position once
    counts = []
    for w, positions in enumerate(slices):
        # A worker's positions are whole batches w, w + W, ...: cutting them every `batch`
        # positions gives batches of the rank's order.
        cuts = [positions[i : i + batch] for i in range(0, len(positions), batch)]
        for k, cut in enumerate(cuts):
            b = w + k * workers
            assert cut.tolist() == list(range(b * batch, min(n, (b + 1) * batch)))
        counts.append(len(cuts))
    assert sum(counts) == expected  # len(loader), whatever the number of workers
    assert max(counts) - min(counts) <= 1
    short = [len(c) for p in slices for c in np.split(p, range(batch, len(p), batch)) if len(c)]
    assert sum(1 for s in short if s < batch) <= (0 if drop_last else 1)


# --- len(loader) and the one short batch ----------------------------------------------------

CASES = [(120, 16), (117, 29), (3, 16), (64, 16), (50, 7)]


def check_epoch(
    loader: Loader, store_dir: Path, plan: PermPlan, epoch: int, batch: int, drop_last: bool
) -> None:
    n = plan.n
    expected = n // batch if drop_last else -(-n // batch)
    assert len(loader) == expected  # before the epoch, as LR schedulers and tqdm ask
    batches = list(loader)
    assert len(batches) == expected
    sizes = [len(x) for x, _ in batches]
    assert all(0 < s <= batch for s in sizes)
    assert sum(s < batch for s in sizes) <= (0 if drop_last else 1)
    got = values(batches)
    # Exactly once; with drop_last the dropped ones are the plan's tail (its short batch).
    order = plan.order(epoch, 0, 1)
    assert sorted(got) == values_of(store_dir, order[: len(got)])
    assert len(got) == (expected * batch if drop_last else n)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_len_is_what_an_epoch_yields(store_dir: Path, workers: int, drop_last: bool) -> None:
    for n, batch in CASES:
        plan = PermPlan(n)
        ds = Dataset(store_dir, plan, batch_size=batch, decode=decode, drop_last=drop_last)
        with Loader(ds, num_workers=workers) as loader:
            for epoch in range(2):  # the workers run on into the second epoch
                check_epoch(loader, store_dir, plan, epoch, batch, drop_last)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_len_holds_while_the_guard_defers(store_dir: Path, workers: int, drop_last: bool) -> None:
    # Reads of chunk 1 are late: the guard defers them, possibly past the end of their
    # batch into the same worker's next one. The count, the single short batch and
    # exactly-once still hold.
    deferred = 0
    for n, batch in [(120, 8), (117, 10)]:
        plan = PermPlan(n)
        ds = Dataset(
            lambda: slow_store(store_dir),
            plan,
            batch_size=batch,
            decode=decode,
            drop_last=drop_last,
            prefetch=PrefetchOptions(window=16, threads=4),
            deadline=DeadlineOptions(fixed_ms=5),
        )
        with Loader(ds, num_workers=workers) as loader:
            for epoch in range(2):
                check_epoch(loader, store_dir, plan, epoch, batch, drop_last)
                assert loader.last_epoch is not None
                deferred += int(loader.last_epoch["guard"]["deferred"])
    assert deferred > 0  # the guard did reorder


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 3])
def test_guard_off_batches_are_the_plans_batches(store_dir: Path, workers: int) -> None:
    # As DataLoader with a batch sampler: batch b is order[b*B:(b+1)*B], the last one short.
    plan = PermPlan(N)
    ds = Dataset(
        store_dir, plan, batch_size=16, decode=decode, deadline=DeadlineOptions(enabled=False)
    )
    with Loader(ds, num_workers=workers) as loader:
        got = [[int(v) for v in x] for x, _ in loader]
    order = values_of_in_order(store_dir, plan.order(0, 0, 1))
    assert got == [order[i : i + 16] for i in range(0, N, 16)]


def values_of_in_order(store_dir: Path, samples: np.ndarray) -> list[int]:
    with open_store(store_dir) as s:
        return [int(s.index.key(int(i)).split("s")[-1]) for i in samples]


@pytest.mark.timeout(120)
def test_len_after_a_resume_and_a_state_of_another_batch_size(store_dir: Path) -> None:
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode)
    first = Loader(ds, num_workers=2)
    seen = values(list(itertools.islice(iter(first), 3)))
    state = first.state_dict()
    first.close()
    assert state["batch_size"] == 16 and state["drop_last"] is False
    second = Loader(Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode), num_workers=2)
    second.load_state_dict(state)
    assert len(second) == 8  # a whole epoch's batches, as DataLoader's len
    rest = list(second)
    assert sorted(seen + values(rest)) == list(range(N))
    assert len(rest) == 8 - 3
    second.close()
    other = Loader(Dataset(store_dir, PermPlan(N), batch_size=8, decode=decode), num_workers=2)
    with pytest.raises(ConfigError, match="batch_size=16"):
        other.load_state_dict(state)
    old = {k: v for k, v in state.items() if k not in ("batch_size", "drop_last")}
    with pytest.raises(ConfigError, match="older tierfeed"):
        second.load_state_dict(old)  # its workers' slices were another layout


# --- decode errors name the sample ----------------------------------------------------------


def jpeg(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4 + value, 3), (value, 0, 0)).save(out, format="JPEG")
    return out.getvalue()


def decode_image(sample: Sample) -> tuple[torch.Tensor, int]:
    with Image.open(io.BytesIO(sample.fields["jpg"])) as img:
        return torch.tensor(img.size), sample.label


@pytest.fixture(scope="module")
def image_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("img")
    files = {f"good/{i:03d}.jpg".encode(): jpeg(i) for i in range(6)}
    files[b"good/004.jpg"] = b"\xff\xd8 not a jpeg after all"  # a corrupt JPEG
    write_tree(root / "src", files)
    pack(root / "src", root / "store", PackOptions(chunk_size=8192, progress=False))
    return root / "store"


@pytest.mark.timeout(120)
def test_a_corrupt_jpeg_names_its_key_and_chunk(image_store: Path) -> None:
    ds = Dataset(image_store, "global", batch_size=2, decode=decode_image)
    with Loader(ds) as loader, pytest.raises(DecodeError) as caught:
        list(loader)
    err = caught.value
    assert err.key == "good/004" and err.chunk is not None
    assert err.chunk.startswith(str(image_store / "chunks")) and err.chunk in str(err)
    assert "'good/004'" in str(err) and "UnidentifiedImageError" in str(err)
    assert "cannot identify image file" in str(err)
    assert isinstance(err.__cause__, UnidentifiedImageError)
    # Code written for the decoder's own error (OSError for PIL, ValueError for most
    # others), or for tierfeed's, still catches it.
    assert isinstance(err, OSError) and isinstance(err, ValueError)
    assert isinstance(err, TierfeedError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.key, again.chunk, str(again)) == (err.key, err.chunk, str(err))


@pytest.mark.timeout(120)
def test_a_stray_file_points_to_the_selection(tmp_path: Path) -> None:
    # A root README in an image tree (issue 33, friction 7): the error says how to leave it out.
    files = {f"good/{i:03d}.jpg".encode(): jpeg(i) for i in range(4)}
    files[b"README"] = b"images of good things\n"
    write_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "store", PackOptions(chunk_size=8192, progress=False))
    ds = Dataset(tmp_path / "store", "global", batch_size=2, decode=decode_image)
    with Loader(ds) as loader, pytest.raises(DecodeError) as caught:
        list(loader)
    assert "'README'" in str(caught.value)
    assert "samples=ImageFolder(" in str(caught.value) and "sample_ids" in str(caught.value)
    # What it says works: the selection leaves the README out.
    chosen = ImageFolder(tmp_path / "store").sample_ids
    ds = Dataset(tmp_path / "store", "global", batch_size=2, decode=decode_image, samples=chosen)
    with Loader(ds) as loader:
        assert sum(len(batch[0]) for batch in loader) == 4


@pytest.mark.timeout(120)
def test_a_decode_error_in_a_worker_names_its_key_and_chunk(image_store: Path) -> None:
    ds = Dataset(image_store, "global", batch_size=2, decode=decode_image)
    with Loader(ds, num_workers=2) as loader, pytest.raises(DecodeError) as caught:
        list(loader)
    # DataLoader re-creates the error from its message, which carries the whole traceback.
    text = str(caught.value)
    assert "'good/004'" in text and str(image_store / "chunks") in text
    assert "UnidentifiedImageError" in text


def test_hedged_reads_and_tierfeed_errors(image_store: Path) -> None:
    def corrupt(sample: Sample) -> object:
        raise ChunkCorruptError("chunk x: damaged")

    with open_store(image_store) as store:
        bad = next(i for i in range(len(store)) if store.index.key(i) == "good/004")
        readers = Readers(1, decode_image)
        try:
            ix = store.index
            hedge = readers.hedge_reader(
                lambda: Store(ix, DirectoryChunks(ix.path.parent, ix.chunks(), ix.path))
            )
            assert hedge is not None
            with pytest.raises(DecodeError, match="good/004"):
                hedge(bad)
        finally:
            readers.close()
        # An error tierfeed raised itself already names the chunk: it passes unchanged.
        with pytest.raises(ChunkCorruptError, match="chunk x"):
            decode_sample(corrupt, store, 0)
