"""Dataset + Loader: batches from workers, exactly once, guard off = plan order, exact resume."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.torch.conftest import N
from tierfeed.format.index import Index
from tierfeed.loader import DeadlineOptions, PrefetchOptions
from tierfeed.storage import DirectoryChunks
from tierfeed.storage.store import Sample, Store
from tierfeed.telemetry import read_records
from tierfeed.torch import Dataset, Loader
from tierfeed.torch.dataset import Batch, feed_of


class PermPlan:
    """A global shuffle: a fresh permutation per epoch, split across ranks."""

    def __init__(self, n: int) -> None:
        self.n = n

    def order(self, epoch: int, rank: int, world_size: int) -> np.ndarray:
        perm = np.random.default_rng(epoch).permutation(self.n)
        return perm[rank::world_size]


class SlowChunks(DirectoryChunks):
    """Chunk reads that stall on chunk 1: late reads for the guard to defer."""

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        if chunk == 1:
            time.sleep(0.05)
        return super().read_range(chunk, offset, length)


def decode(sample: Sample) -> tuple[torch.Tensor, int]:
    return torch.tensor(int(sample.fields["txt"])), sample.label


def slow_store(store_dir: Path) -> Store:
    index = Index(store_dir)
    return Store(index, SlowChunks(index.path.parent, index.chunks(), index.path))


def values_of(store_dir: Path, samples: Iterable[int]) -> list[int]:
    """The values the samples hold, sorted (a sample's value is the number in its key)."""
    with Index(store_dir) as ix:
        return sorted(int(ix.key(i).split("s")[-1]) for i in samples)


def values(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    return [int(v) for x, _ in batches for v in x]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch(store_dir: Path, workers: int) -> None:
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode)
    loader = Loader(ds, num_workers=workers)
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert sorted(values(batches)) == list(range(N))
        assert all(len(x) <= 16 for x, _ in batches)
    assert loader.last_epoch is not None and loader.last_epoch["samples"] == N


@pytest.mark.timeout(60)
def test_guard_off_gives_the_plan_order(store_dir: Path) -> None:
    plan = PermPlan(N)
    ds = Dataset(
        lambda: slow_store(store_dir),
        plan,
        batch_size=7,
        decode=decode,
        deadline=DeadlineOptions(enabled=False),
    )
    got = values(list(Loader(ds)))
    with Index(store_dir) as ix:
        keys = [int(ix.key(i).split("s")[-1]) for i in plan.order(0, 0, 1)]
    assert got == keys


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_with_deferrals(store_dir: Path, workers: int) -> None:
    def make() -> Loader:
        ds = Dataset(
            lambda: slow_store(store_dir),
            PermPlan(N),
            batch_size=8,
            decode=decode,
            prefetch=PrefetchOptions(window=16, threads=4),
            deadline=DeadlineOptions(fixed_ms=5),
        )
        return Loader(ds, num_workers=workers)

    first = make()
    first.set_epoch(1)
    seen = values(list(itertools.islice(iter(first), 6)))
    state = first.state_dict()
    late = sum(c["late"] for c in first._counters.values())
    assert late > 0  # the guard acted before the restart
    second = make()
    second.load_state_dict(state)
    rest = values(list(second))
    assert sorted(seen + rest) == list(range(N))  # exactly once across the restart
    assert second.last_epoch is not None
    assert first.dataset.epoch == 1 and second.dataset.epoch == 2


@pytest.mark.timeout(60)
def test_run_file_records_epochs(store_dir: Path, tmp_path: Path) -> None:
    ds = Dataset(lambda: slow_store(store_dir), PermPlan(N), batch_size=10, decode=decode)
    with Loader(ds, run_file=tmp_path / "run.jsonl", live_every_s=0.0) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            list(loader)
    records = read_records(tmp_path / "run.jsonl")
    epochs = [r for r in records if r["type"] == "epoch"]
    live = [r for r in records if r["type"] == "progress"]
    assert len(live) >= 2 and live[-1]["samples"] <= N  # live records during each epoch
    assert [r["epoch"] for r in epochs] == [0, 1]
    assert all(r["samples"] == N and r["batch_wait"]["count"] == 12 for r in epochs)
    assert "deferred" in epochs[0]["guard"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plan", ["global", "local", "partial:0.5", "global,chunkwise:2"])
def test_real_plans_from_the_store_index(store_dir: Path, plan: str) -> None:
    ds = Dataset(store_dir, plan, batch_size=16, decode=decode, drop_last=False)
    loader = Loader(ds)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sorted(values(list(loader))) == list(range(N))  # one rank: the whole epoch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_tiers_serve_the_second_epoch(store_dir: Path, tmp_path: Path, workers: int) -> None:
    from tierfeed.torch import TierConfig

    tiers = TierConfig(ram_bytes=10**8, disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(store_dir, "global", batch_size=16, decode=decode, tiers=tiers)
    loader = Loader(ds, num_workers=workers)
    origin_bytes, inline = [], []
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sorted(values(list(loader))) == list(range(N))
        assert loader.last_epoch is not None
        origin_bytes.append(loader.last_epoch["tiers"]["origin"]["bytes"])
        inline.append(loader.last_epoch["guard"]["inline"])
        time.sleep(0.2)  # let the last background copies land
    loader.close()
    # Later epochs come from RAM or local disk; a copy that would not pay for itself may be
    # skipped. Epoch 2's first window may still come from the origin: it is read ahead as
    # epoch 1 ends, before that epoch's last copies have landed.
    assert origin_bytes[0] > 0 and origin_bytes[2] <= origin_bytes[0] // 10
    # What the tiers hold is read on the consumer's thread, not handed to reader threads.
    assert inline[2] >= 0.8 * N


def test_inline_reads_can_be_switched_off(store_dir: Path, tmp_path: Path) -> None:
    from tierfeed.torch import TierConfig

    tiers = TierConfig(ram_bytes=10**8)
    off = PrefetchOptions(inline_local=False)
    ds = Dataset(store_dir, "global", batch_size=16, decode=decode, tiers=tiers, prefetch=off)
    with Loader(ds) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(values(list(loader))) == list(range(N))
            assert loader.last_epoch is not None and loader.last_epoch["guard"]["inline"] == 0


def test_live_figures_are_served_for_prometheus(store_dir: Path) -> None:
    import urllib.error
    import urllib.request

    ds = Dataset(store_dir, "global", batch_size=8, decode=decode)
    with Loader(ds, num_workers=1, metrics_port=0) as loader:
        url = f"http://127.0.0.1:{loader.metrics.port}"  # type: ignore[union-attr]
        n = 0
        for batch in loader:
            n += len(batch[0])
            if n >= 16:
                break
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        assert "# TYPE tierfeed_batch_wait_seconds summary" in text
        assert 'tierfeed_batch_wait_seconds{quantile="0.9999"}' in text
        samples = [ln for ln in text.splitlines() if ln.startswith("tierfeed_epoch_samples ")]
        assert float(samples[0].split()[1]) == n
        assert "tierfeed_guard_deferred" in text
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{url}/other", timeout=10)
    with pytest.raises(OSError):  # closed with the loader
        urllib.request.urlopen(f"{url}/metrics", timeout=2)


def decode_with_pid(sample: Sample) -> tuple[torch.Tensor, int]:
    return torch.tensor(int(sample.fields["txt"])), os.getpid()


@pytest.mark.timeout(120)
def test_workers_persist_and_follow_set_epoch(store_dir: Path) -> None:
    # Workers outlive an epoch and read the next one's slice ahead; a set_epoch() that is not
    # the next epoch must still give exactly that epoch's order.
    plan = PermPlan(N)
    ds = Dataset(
        store_dir,
        plan,
        batch_size=7,
        decode=decode_with_pid,
        deadline=DeadlineOptions(enabled=False),
    )
    with Index(store_dir) as ix:
        value = np.array([int(ix.key(i).split("s")[-1]) for i in range(N)])
    pids: set[int] = set()
    with Loader(ds, num_workers=2) as loader:
        for epoch in [0, 1, 2, 7, 3]:
            loader.set_epoch(epoch)
            batches = list(loader)
            order = value[plan.order(epoch, 0, 1)]
            # Workers are dealt the order's batches in turn and DataLoader takes batches from
            # its workers in turn (18 batches, 9 a worker): the batches come in plan order.
            assert values(batches) == order.tolist(), epoch
            assert [len(x) for x, _ in batches] == [7] * 17 + [1]
            pids |= {int(p) for _, ps in batches for p in ps}
    assert len(pids) == 2  # the same two worker processes served every epoch


class HeldChunks(DirectoryChunks):
    """The first read of chunk 1 blocks until the test lets it go (a read storage holds)."""

    release = threading.Event()
    held = threading.Event()

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        if chunk == 1 and not HeldChunks.held.is_set():
            HeldChunks.held.set()
            HeldChunks.release.wait(timeout=60)
        return super().read_range(chunk, offset, length)


def hedged(store_dir: Path, source: type[DirectoryChunks], deadline: DeadlineOptions) -> Dataset:
    """A dataset reading through ``source`` (a misbehaving DirectoryChunks), hedged by reads
    of the store's own files."""

    def store() -> Store:
        index = Index(store_dir)
        return Store(index, source(index.path.parent, index.chunks(), index.path))

    return Dataset(
        store,
        PermPlan(N),
        batch_size=8,
        decode=decode,
        deadline=deadline,
        hedge_source=lambda: DirectoryChunks(store_dir, Index(store_dir).chunks(), store_dir),
    )


@pytest.mark.timeout(30)
def test_epoch_ends_without_waiting_for_a_hedged_read(store_dir: Path) -> None:
    # The held read's sample is delivered by its hedge; the epoch (and the next) must not
    # wait for the held read itself, which finishes in the background once storage answers.
    ds = hedged(store_dir, HeldChunks, DeadlineOptions(fixed_ms=5, hedge_after_ms=10))
    loader = Loader(ds)
    try:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(values(list(loader))) == list(range(N))
        assert HeldChunks.held.is_set() and not HeldChunks.release.is_set()
        assert loader.last_epoch is not None
    finally:
        HeldChunks.release.set()
        loader.close()


class CountingDataset(Dataset):
    """Counts, across processes, how often a worker starts iterating."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.starts = multiprocessing.get_context("fork").RawValue("i", 0)

    def __iter__(self) -> Iterator[Batch]:
        self.starts.value += 1
        yield from super().__iter__()


@pytest.mark.timeout(120)
def test_workers_run_on_into_the_next_epoch_exactly_once_each(store_dir: Path) -> None:
    # 117 samples over 4 workers, 29 a batch: worker 0 sends two batches an epoch, the others
    # one, so the others' next-epoch batches arrive before worker 0's last one and are kept.
    n = 117
    ds = CountingDataset(store_dir, PermPlan(n), batch_size=29, decode=decode)
    with Loader(ds, num_workers=4) as loader:
        for epoch in range(4):
            loader.set_epoch(epoch)
            assert sorted(values(list(loader))) == values_of(store_dir, range(n)), epoch
        assert loader._ahead  # the next epoch's batches that came early
    assert ds.starts.value == 4  # each worker started once: no restart between epochs


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("n", "workers", "drop_last"), [(120, 3, True), (3, 4, False)])
def test_epoch_ends_with_drop_last_and_with_idle_workers(
    store_dir: Path, n: int, workers: int, drop_last: bool
) -> None:
    # drop_last: the rank's 120 give 7 batches of 16 (dealt 3, 2, 2 to the workers), the last
    # 8 are dropped. 3 samples over 4 workers: one batch, three workers have none, and the
    # epoch must not wait for them.
    ds = Dataset(store_dir, PermPlan(n), batch_size=16, decode=decode, drop_last=drop_last)
    with Loader(ds, num_workers=workers) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            got = values(list(loader))
            assert len(got) == len(set(got)) == (112 if drop_last else n)
            assert set(got) <= set(values_of(store_dir, range(n)))


@pytest.mark.timeout(120)
def test_an_epoch_left_early_is_read_whole_the_next_time(store_dir: Path) -> None:
    ds = Dataset(store_dir, PermPlan(N), batch_size=8, decode=decode)
    with Loader(ds, num_workers=2) as loader:
        loader.set_epoch(0)
        list(loader)
        part = values(list(itertools.islice(iter(loader), 3)))  # epoch 1, left early
        assert len(part) == 24
        assert loader.epoch == 1
        assert sorted(values(list(loader))) == list(range(N))  # epoch 1 again, whole
        assert loader.epoch == 2
        assert sorted(values(list(loader))) == list(range(N))


class StalledOpen(DirectoryChunks):
    """The first open of chunk 1's file stalls 3 s (a lookup or open the origin holds): every
    read of chunk 1 in this process waits behind that one open."""

    stalled = threading.Event()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fds = self._driver._fds
        plain, target = fds._open_file, os.fspath(self._path(1)[0])

        def open_file(path: str) -> int:
            if path == target and not StalledOpen.stalled.is_set():
                StalledOpen.stalled.set()
                time.sleep(3.0)
            return plain(path)

        fds._open_file = open_file  # type: ignore[method-assign]


@pytest.mark.timeout(60)
def test_hedges_cover_a_stalled_open(store_dir: Path) -> None:
    # Every read of chunk 1 queues behind one stalled open; their hedges open the file on
    # their own (another descriptor cache), so no batch waits for the stall.
    ds = hedged(store_dir, StalledOpen, DeadlineOptions(fixed_ms=20, hedge_after_ms=50))
    with Loader(ds) as loader:
        assert sorted(values(list(loader))) == list(range(N))
        assert StalledOpen.stalled.is_set()  # the open did stall
        assert loader.last_epoch is not None
        assert loader.last_epoch["batch_wait"]["max"] < 1.5  # not the 3 s stall
        assert loader.last_epoch["guard"]["hedge_wins"] > 0


def frozen_and_pid(sample: Sample) -> tuple[int, int]:
    """What the collector of the process that decodes ``sample`` has frozen, and its pid."""
    return gc.get_freeze_count(), os.getpid()


@pytest.mark.timeout(120)
def test_workers_freeze_what_they_inherit_and_the_main_process_is_left_alone(
    store_dir: Path,
) -> None:
    """A full garbage collection in a worker walked every object it inherited (torch's: ~80
    ms holding the GIL, with no read thread able to issue a request) at the start of the
    first epoch; workers freeze what they inherit, the training process is not touched."""
    before = gc.get_freeze_count()
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=frozen_and_pid)
    for workers in (0, 2):
        loader = Loader(ds, num_workers=workers)
        rows = [
            (int(f), int(p)) for frozen, pids in loader for f, p in zip(frozen, pids, strict=True)
        ]
        loader.close()
        assert len(rows) == N
        if workers == 0:
            assert {p for _, p in rows} == {os.getpid()}
            assert all(f == before for f, _ in rows)
        else:
            assert os.getpid() not in {p for _, p in rows}
            assert all(f > 0 for f, _ in rows)  # frozen before its first sample is decoded
    assert gc.get_freeze_count() == before


@pytest.mark.timeout(120)
def test_a_freeze_the_training_process_made_itself_stays(store_dir: Path) -> None:
    gc.freeze()  # as a training script may, before forking its own workers
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        loader = Loader(Dataset(store_dir, PermPlan(N), batch_size=16, decode=frozen_and_pid), 2)
        assert sum(len(f) for f, _ in loader) == N
        loader.close()
        assert gc.get_freeze_count() > frozen // 2  # not unfrozen (freed ones leave it)
    finally:
        gc.unfreeze()


def decode_failing_once(sample: Sample) -> tuple[torch.Tensor, int]:
    """`decode`, but sample 5 fails the first time any worker decodes it."""
    marker = Path(os.environ["TIERFEED_TEST_FAILED_ONCE"])
    if sample.key.endswith("s0005") and not marker.exists():
        marker.touch()
        raise ValueError("sample 5 is bad this once")
    return decode(sample)


@pytest.mark.timeout(60)
def test_a_workers_error_stops_the_workers_at_once(
    store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epoch that meets a worker's error ends with its workers gone, not left for the
    garbage collector (which costs PyTorch 5 s a worker); the next one starts new workers
    and delivers every sample."""
    from tierfeed.errors import DecodeError

    monkeypatch.setenv("TIERFEED_TEST_FAILED_ONCE", str(tmp_path / "failed"))
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode_failing_once)
    loader = Loader(ds, num_workers=2)
    with pytest.raises(DecodeError, match="this once"):
        list(loader)
    assert multiprocessing.active_children() == []  # stopped and joined, at once
    assert sorted(values(list(loader))) == list(range(N))
    loader.close()
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(60)
def test_a_loader_reads_a_view_and_leaves_its_dataset_as_given(store_dir: Path) -> None:
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode)
    with Loader(ds) as loader:
        head = values(list(itertools.islice(iter(loader), 2)))
        state = loader.state_dict()
        loader.load_state_dict(state)
        rest = values(list(loader))
        assert sorted(head + rest) == list(range(N))
        assert feed_of(ds).config.read_across_epochs is False  # the Loader's view runs on
        assert ds.epoch == 1  # the epoch is shared with the view
        # The dataset alone still yields its batches' data, from the start of its epoch.
        assert sorted(values(list(ds))) == list(range(N))
