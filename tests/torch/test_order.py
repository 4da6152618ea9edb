"""An order you can reproduce: `seed=`, the unshuffled ``sequential`` plan, and the exact order
(the guard's deferral off) with its hedges still on."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DistributedSampler

from tests.torch.conftest import N
from tierfeed.config import world_for
from tierfeed.errors import ConfigError
from tierfeed.format.index import Index
from tierfeed.loader import DeadlineOptions, GuardedStream
from tierfeed.plan import PlanSpec
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader

pytestmark = pytest.mark.timeout(120)

EXACT = DeadlineOptions(enabled=False)


def key(sample: Sample) -> str:
    return sample.key


def delivered(store_dir: Path, workers: int = 0, epochs: int = 1, **kw: object) -> list[str]:
    ds = Dataset(store_dir, batch_size=8, decode=key, collate=list, deadline=EXACT, **kw)
    out: list[str] = []
    with Loader(ds, num_workers=workers) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out += [k for batch in loader for k in batch]
    return out


def store_order(store_dir: Path) -> list[str]:
    with Index(store_dir) as index:
        return [index.key(i) for i in range(index.num_samples)]


@pytest.mark.parametrize("workers", [0, 2])
def test_sequential_reads_the_store_in_its_order(store_dir: Path, workers: int) -> None:
    assert delivered(store_dir, workers, plan="sequential") == store_order(store_dir)


@pytest.mark.parametrize("world_size", [2, 7])
def test_sequential_deals_ranks_what_distributed_sampler_deals_them(
    store_dir: Path, world_size: int
) -> None:
    keys = store_order(store_dir)
    for rank in range(world_size):
        sampler = DistributedSampler(range(N), num_replicas=world_size, rank=rank, shuffle=False)
        got = delivered(store_dir, plan="sequential", world=world_for(rank, world_size))
        assert got == [keys[i] for i in sampler]


def test_the_same_seed_gives_the_same_order_and_another_seed_another(store_dir: Path) -> None:
    first = delivered(store_dir, workers=2, epochs=2, seed=7)
    assert delivered(store_dir, workers=2, epochs=2, seed=7) == first
    assert delivered(store_dir, workers=0, epochs=2, seed=7) == first  # workers change nothing
    # Epoch 1 of a longer run is epoch 1 of a shorter one (15 batches an epoch: the
    # DataLoader's turn of 2 workers starts epoch 1 at worker 1; the Loader restores the plan's).
    assert delivered(store_dir, workers=2, epochs=3, seed=7)[: 2 * N] == first
    assert sorted(first[:N]) == sorted(first[N:]) == sorted(store_order(store_dir))
    assert first[:N] != first[N:]  # epochs are shuffled anew
    assert delivered(store_dir, epochs=2, seed=8) != first
    assert delivered(store_dir, epochs=2) == delivered(store_dir, epochs=2, seed=0)
    assert delivered(store_dir, plan=PlanSpec(seed=7), epochs=2) == first


@pytest.mark.parametrize(
    ("plan", "seed", "match"),
    [
        ("global", -1, "seed=.*: takes a whole number from 0"),
        ("global", 2**128, "seed=.*: takes a whole number from 0"),
        ("global", True, "seed=.*: takes a whole number from 0"),
        ("global", "7", "seed=.*: takes a whole number from 0"),
        ("sequential,chunkwise:4", None, "sequential plan reads the store's order"),
        ("local,sequential", None, "sequential plan reads the store's order"),
    ],
)
def test_a_bad_seed_or_sequential_mix_is_refused(
    store_dir: Path, plan: str, seed: object, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        Dataset(store_dir, plan=plan, seed=seed)  # type: ignore[arg-type]


def test_a_seed_for_a_plan_of_ones_own_is_refused(store_dir: Path) -> None:
    class Mine:
        def order(self, epoch: int, rank: int, world_size: int) -> list[int]:
            return list(range(N))

    with pytest.raises(ConfigError, match="seed= seeds a plan spec"):
        Dataset(store_dir, plan=Mine(), seed=3)  # type: ignore[arg-type]


def test_a_sequential_run_resumes_where_it_stopped(store_dir: Path) -> None:
    ds = Dataset(store_dir, "sequential", batch_size=8, decode=key, collate=list, deadline=EXACT)
    with Loader(ds, num_workers=0) as loader:
        it = iter(loader)
        head = [k for _ in range(3) for k in next(it)]
        state = loader.state_dict()
    again = Dataset(store_dir, "sequential", batch_size=8, decode=key, collate=list, deadline=EXACT)
    with Loader(again, num_workers=0) as loader:
        loader.load_state_dict(state)
        rest = [k for batch in loader for k in batch]
    assert head + rest == store_order(store_dir)
    assert state["plan"]["spec"] == "sequential"


@pytest.mark.timeout(30)
def test_the_exact_order_still_hedges_a_late_read() -> None:
    stalled = threading.Event()

    def read(i: int) -> str:
        if i == 3:
            stalled.wait(timeout=20)  # the first way to sample 3 hangs
        return f"v{i}"

    options = DeadlineOptions(enabled=False, hedge_after_ms=20, hard_timeout_s=20)
    stream = GuardedStream(list(range(8)), read, hedge=lambda i: f"h{i}", deadline=options)
    with stream:
        got = list(stream)
        stalled.set()
    assert [i for i, _ in got] == list(range(8))  # the plan's order, exactly
    assert dict(got)[3] == "h3" and stream.counters.hedge_wins == 1


def slow_on(name: str) -> Any:
    def decode(sample: Sample) -> str:
        if sample.key == name:
            time.sleep(0.3)  # a read past its deadline: the guard delivers others first
        return sample.key

    return decode


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fast_runs_order_is_recorded_and_replayed_exactly(store_dir: Path, workers: int) -> None:
    guard = DeadlineOptions(fixed_ms=20, hard_timeout_s=30)
    keys = store_order(store_dir)

    def run(slow: str, record: Any = None) -> tuple[list[str], Any]:
        ds = Dataset(store_dir, batch_size=8, decode=slow_on(slow), collate=list, deadline=guard)
        with Loader(ds, num_workers=workers) as loader:
            if record is not None:
                loader.replay(record)
            got = [k for batch in loader for k in batch]
            assert loader.last_epoch is not None
            return got, loader.last_epoch["order"]

    first, record = run(keys[40])
    assert sorted(first) == sorted(keys)
    assert record["swaps"] and record["workers"] == workers and record["batch_size"] == 8
    second, _ = run(keys[70])  # other timing, no replay: another order
    assert second != first
    replayed, again = run(keys[70], json.loads(json.dumps(record)))  # as a run file holds it
    assert replayed == first and again == record


def test_a_record_of_other_workers_or_no_record_is_refused(store_dir: Path) -> None:
    ds = Dataset(store_dir, batch_size=8, decode=key, collate=list)
    record = {"workers": 2, "batch_size": 8, "swaps": {"0": [[3, 5]]}}
    with Loader(ds, num_workers=0) as loader:
        with pytest.raises(ConfigError, match="recorded with 2 workers and batch size 8"):
            loader.replay(record)
        for bad in ({}, {**record, "workers": 0, "swaps": {"0": [[3, -5]]}}, [1, 2]):
            with pytest.raises(ConfigError, match="replay:"):
                loader.replay(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epochs_order_replays_from_its_two_records(store_dir: Path, workers: int) -> None:
    """A checkpoint's state lists the swaps made before it (``order``), the resumed run's
    record those after: a replay of the first, the same batches, the state loaded and a replay
    of the second deliver what the interrupted and the resumed run delivered together."""
    guard = DeadlineOptions(fixed_ms=20, hard_timeout_s=30)
    planned = delivered(store_dir, workers)  # the plan's order, exactly

    def dataset(slow: str) -> Dataset:
        return Dataset(store_dir, batch_size=8, decode=slow_on(slow), collate=list, deadline=guard)

    def take(loader: Loader, batches: int | None = None) -> list[str]:
        got = loader if batches is None else itertools.islice(loader, batches)
        return [k for batch in got for k in batch]

    with Loader(dataset(planned[3]), num_workers=workers) as loader:  # late before the stop
        before = take(loader, 6)
        state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint holds it
    assert before != planned[: len(before)] and state["order"]["swaps"]
    with Loader(dataset(planned[-30]), num_workers=workers) as loader:  # late after it
        loader.load_state_dict(state)
        after = take(loader)
        assert loader.last_epoch is not None
        record = loader.last_epoch["order"]
    assert sorted(before + after) == sorted(planned) and record["swaps"]
    with Loader(dataset(planned[50]), num_workers=workers) as loader:  # other timing
        loader.replay(state["order"])
        again = take(loader, 6)
        loader.load_state_dict(state)
        loader.replay(record)
        again += take(loader)
    assert again == before + after


def test_a_damaged_order_in_a_state_is_refused(store_dir: Path) -> None:
    ds = Dataset(store_dir, batch_size=8, decode=key, collate=list)
    with Loader(ds, num_workers=0) as loader:
        state = loader.state_dict()
        for bad in ([1], {**state["order"], "swaps": {"0": [[1, -2]]}}, {"workers": 0}):
            with pytest.raises(ConfigError, match="loader state's 'order' is damaged"):
                loader.load_state_dict({**state, "order": bad})
