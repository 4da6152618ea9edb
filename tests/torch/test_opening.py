"""The first batch read by the Loader's own process while its workers start
(`tierfeed.loader.opening`): worker 0's first batch, in the plan's order, every sample once, a
state after it that resumes exactly, a replay of the run's order, and an error in it said
with its workers stopped."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.torch.conftest import random_store
from tierfeed.errors import StorageError
from tierfeed.loader import DeadlineOptions
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, TierConfig
from tierfeed.torch.dataset import feed_of

pytestmark = pytest.mark.timeout(120)

N = 600
BATCH = 32
EXACT = DeadlineOptions(enabled=False)  # the plan's order, so that it can be compared


def who(sample: Sample) -> tuple[int, int]:
    """The sample's number (its key's) and the process that decoded it."""
    return int(sample.key.rsplit("s", 1)[1]), os.getpid()


def collate(items: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return items


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # ~6 chunks of 512 KiB
    return random_store(tmp_path_factory.mktemp("opening"), N, 3, (2000, 8000), 2**19, seed=5)


def dataset(store: Path, tmp_path: Path, **kw: Any) -> Dataset:
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    kw.setdefault("deadline", EXACT)
    kw.setdefault("decode", who)
    return Dataset(store, "global", batch_size=BATCH, collate=collate, tiers=tiers, **kw)


def numbers(ds: Dataset, epoch: int) -> list[int]:
    """The rank's order of ``epoch``, as the samples' numbers."""
    index = feed_of(ds).plan_index()
    return [int(index.key(int(i)).rsplit("s", 1)[1]) for i in feed_of(ds).rank_order(epoch)]


def test_the_first_batch_is_read_here_and_the_order_is_the_plans(
    store: Path, tmp_path: Path
) -> None:
    ds = dataset(store, tmp_path)
    with Loader(ds, num_workers=2) as loader:
        epochs = [list(loader) for _ in range(2)]
    for epoch, batches in enumerate(epochs):
        got = [n for batch in batches for n, _ in batch]
        assert got == numbers(ds, epoch)  # exactly the plan's order, every sample once
    first = {pid for _, pid in epochs[0][0]}
    assert first == {os.getpid()}  # the first batch: this process's own reads
    later = {pid for batch in epochs[0][1:] for _, pid in batch}
    assert os.getpid() not in later and len(later) == 2  # the rest: the workers'
    # The workers run on into the next epoch: its first batch is worker 0's own.
    assert os.getpid() not in {pid for _, pid in epochs[1][0]}


def test_a_state_after_the_first_batch_resumes_exactly(store: Path, tmp_path: Path) -> None:
    ds = dataset(store, tmp_path)
    order = numbers(ds, 0)
    for taken in (1, 3):
        with Loader(ds, num_workers=2) as loader:
            head = list(itertools.islice(iter(loader), taken))
            state = loader.state_dict()
        with Loader(ds, num_workers=2) as loader:  # a new job: its first batch read here too
            loader.load_state_dict(state)
            rest = list(loader)
        assert {pid for _, pid in rest[0]} == {os.getpid()}
        got = [n for batch in head + rest for n, _ in batch]
        assert got == order, taken  # the epoch once, in its order, across the restart
        ds.set_epoch(0)


def test_a_run_in_the_fast_order_replays_from_its_record(store: Path, tmp_path: Path) -> None:
    ds = dataset(store, tmp_path, deadline=DeadlineOptions())
    with Loader(ds, num_workers=2) as loader:
        ran = [n for batch in loader for n, _ in batch]
        record = loader.last_epoch
    assert record is not None and sorted(ran) == list(range(N))
    with Loader(ds, num_workers=2) as loader:
        loader.set_epoch(0)
        loader.replay(record["order"])
        assert [n for batch in loader for n, _ in batch] == ran


@pytest.mark.parametrize("samples", [BATCH * 2, BATCH * 2 + 1])
def test_no_batch_is_read_here_where_worker_0_has_one_only(
    store: Path, tmp_path: Path, samples: int
) -> None:
    # Two workers, two batches: worker 0's first is its last (not read here); one more
    # sample: a third batch for worker 0, and its first is read here.
    chosen = np.arange(samples, dtype=np.int64)
    ds = dataset(store, tmp_path, samples=chosen)
    with Loader(ds, num_workers=2) as loader:
        batches = list(loader)
    assert [n for batch in batches for n, _ in batch] == numbers(ds, 0)
    here = os.getpid() in {pid for _, pid in batches[0]}
    assert here == (samples > BATCH * 2)


def test_an_error_in_the_first_batch_is_said_and_the_workers_stop(
    store: Path, tmp_path: Path
) -> None:
    ds = dataset(store, tmp_path)
    first = numbers(ds, 0)[:BATCH]
    bad = first[5]

    def fails(sample: Sample) -> tuple[int, int]:
        n, pid = who(sample)
        if n == bad:
            raise StorageError(f"sample {n}: unreadable")
        return n, pid

    ds = dataset(store, tmp_path, decode=fails)
    with Loader(ds, num_workers=2) as loader:
        with pytest.raises(StorageError, match=f"sample {bad}"):
            next(iter(loader))
        assert loader._loader is None  # its workers stopped with the error
