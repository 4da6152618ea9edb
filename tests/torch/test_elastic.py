"""Elastic resume: a state saved mid-epoch resumes with another number of workers, or in a job
of another world size, and the epoch still delivers every sample once (padding aside)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.plan.test_plans import shapes
from tests.torch.conftest import N
from tests.torch.test_loader import decode, slow_store, values
from tierfeed.errors import ConfigError
from tierfeed.loader import DeadlineOptions, PrefetchOptions, StreamState
from tierfeed.loader.batching import worker_slice
from tierfeed.loader.resume import done_after, run_positions
from tierfeed.plan import (
    DatasetShape,
    Done,
    EpochProgress,
    Plan,
    PlanSpec,
    remaining_order,
    remaining_shares,
)
from tierfeed.plan.plan import PLANS
from tierfeed.torch import Dataset, Loader
from tierfeed.world import World


def loader(
    store_dir: Path, workers: int, plan: str = "global", world: World | None = None
) -> Loader:
    ds = Dataset(
        store_dir,
        plan,
        batch_size=8,
        decode=decode,
        world=world or World(),
        prefetch=PrefetchOptions(window=16, threads=4),
    )
    return Loader(ds, num_workers=workers)


def deferring_loader(store_dir: Path, workers: int) -> Loader:
    """Chunk 1 stalls, so the guard delivers samples out of order before each save."""
    ds = Dataset(
        lambda: slow_store(store_dir),
        PlanSpec("global", seed=3),
        batch_size=8,
        decode=decode,
        prefetch=PrefetchOptions(window=16, threads=4),
        deadline=DeadlineOptions(fixed_ms=5),
    )
    return Loader(ds, num_workers=workers)


@pytest.mark.timeout(240)
def test_two_then_three_then_one_workers_deliver_each_sample_once(store_dir: Path) -> None:
    seen: list[int] = []
    first = deferring_loader(store_dir, 2)
    seen += values(list(itertools.islice(iter(first), 5)))
    state = first.state_dict()
    first.close()
    assert state["num_workers"] == 2 and state["done"][0] <= 5 * 8
    second = deferring_loader(store_dir, 3)
    second.load_state_dict(state)
    assert len(second) == -(-N // 8)  # a whole epoch's batches, as DataLoader's len
    seen += values(list(itertools.islice(iter(second), 4)))
    state = second.state_dict()
    second.close()
    third = deferring_loader(store_dir, 0)
    third.load_state_dict(state)
    rest = list(third)
    seen += values(rest)
    assert sorted(seen) == list(range(N))  # exactly once across both restarts
    assert len(rest) == -(-N // 8) - 9 and third.dataset.epoch == 1
    third.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("plan", "workers"), [("global", 0), ("local", 2), ("partial:0.5", 0)])
def test_two_ranks_resume_as_four_mid_epoch(store_dir: Path, plan: str, workers: int) -> None:
    delivered: list[int] = []
    states = []
    for rank in range(2):  # ranks in lockstep: each delivered 3 batches, then the job stopped
        old = loader(store_dir, workers, plan, World(rank, 2))
        old.set_epoch(1)
        delivered += values(list(itertools.islice(iter(old), 3)))
        states.append(old.state_dict())
        old.close()
    lengths = []
    for rank in range(4):
        new = loader(store_dir, workers, plan, World(rank, 4))
        new.load_state_dict(states)
        rest = values(list(new))
        lengths.append(len(rest))
        delivered += rest
        assert new.dataset.epoch == 2
        new.close()
    assert len(set(lengths)) == 1  # equal batches per rank: DDP stays in lockstep
    assert set(delivered) == set(range(N))  # every sample once ...
    assert len(delivered) - N <= (2 - 1) + (4 - 1)  # ... and at most each world's padding


@pytest.mark.timeout(120)
def test_another_world_needs_every_ranks_state(store_dir: Path) -> None:
    old = loader(store_dir, 0, "global", World(0, 2))
    list(itertools.islice(iter(old), 2))
    state = old.state_dict()
    old.close()
    new = loader(store_dir, 0, "global", World(1, 4))
    with pytest.raises(ConfigError, match="every old rank's state"):
        new.load_state_dict(state)
    new.close()


@pytest.mark.timeout(120)
def test_a_state_names_its_plan_and_another_plan_is_refused(store_dir: Path) -> None:
    old = loader(store_dir, 0, "global")
    list(itertools.islice(iter(old), 2))
    state = old.state_dict()
    old.close()
    assert state["plan"]["spec"] == "global" and state["plan"]["seed"] == 0
    other = Loader(Dataset(store_dir, PlanSpec("global", seed=7), batch_size=8, decode=decode))
    with pytest.raises(ConfigError, match="resume with the same plan"):
        other.load_state_dict(state)  # its positions would name other samples
    other.close()


@pytest.mark.timeout(120)
def test_a_state_of_older_partial_plans_is_refused_a_global_one_resumes(store_dir: Path) -> None:
    cases = (  # (plan, generation saved under (None: not recorded), refused)
        ("partial:0.5", None, True), ("local", None, True), ("global", None, False),
        ("partial:0.5", 2, True), ("local", 2, False),  # 3 changed partial plans only
    )  # fmt: skip
    for spec, generation, refused in cases:
        old = loader(store_dir, 0, spec)
        list(itertools.islice(iter(old), 2))
        state = old.state_dict()
        old.close()
        assert state["plan"]["plans"] == PLANS
        if generation is None:
            del state["plan"]["plans"]  # as a tierfeed before generations were recorded did
        else:
            state["plan"]["plans"] = generation
        new = loader(store_dir, 0, spec)
        if refused:
            with pytest.raises(ConfigError, match=rf"generation {generation or 1}, this is 3"):
                new.load_state_dict(state)
        else:
            new.load_state_dict(state)  # the same plan in both generations
            assert len(list(iter(new))) > 0
        new.close()


# --- the bookkeeping, over shapes (no DataLoader) -----------------------------------------


@st.composite
def worker_states(draw: st.DrawFn, run: np.ndarray, batch: int, workers: int) -> dict:
    """Where each worker stands: a cursor in its slice and a few positions read past it."""
    states = {}
    for w in range(workers):
        mine = len(worker_slice(run, batch, w, workers, False))
        cursor = draw(st.integers(0, mine))
        ahead = (
            draw(st.sets(st.integers(cursor + 1, mine - 1), max_size=3))
            if cursor + 1 < mine
            else set()
        )
        states[w] = StreamState(cursor, tuple(sorted(ahead)))
    return states


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 200),
    batch=st.integers(1, 12),
    workers=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_restarts_with_any_workers_read_each_position_once(
    n: int, batch: int, workers: list[int], drop_last: bool, data: st.DataObject
) -> None:
    done = None
    read: list[int] = []
    for i, w in enumerate(workers):
        run = run_positions(n, batch, drop_last, done)
        states = data.draw(worker_states(run, batch, w))
        if i == len(workers) - 1:  # the last run reads to the end
            states = {k: StreamState(len(worker_slice(run, batch, k, w, False))) for k in range(w)}
        for k, s in states.items():
            mine = worker_slice(run, batch, k, w, False)
            read += mine[: s.cursor].tolist() + mine[list(s.ahead)].tolist()
        done = done_after(n, batch, drop_last, done, w, states)
    used = (n // batch) * batch if drop_last else n
    assert sorted(read) == list(range(used))  # every position once, the dropped batch never


@settings(max_examples=150, deadline=None)
@given(
    shape=shapes(),
    policy=st.sampled_from(["global", "local", "partial:0.3"]),
    worlds=st.lists(st.integers(1, 5), min_size=2, max_size=3),
    data=st.data(),
)
def test_world_changes_with_out_of_order_progress_deliver_once(
    shape: DatasetShape, policy: str, worlds: list[int], data: st.DataObject
) -> None:
    plan = Plan(shape, PlanSpec.parse(policy, seed=5))
    if plan.spec.policy != "global" and worlds[0] > shape.num_chunks:
        return
    progress = EpochProgress()
    real: list[int] = []  # samples delivered at real (not padding) positions
    for i, m in enumerate(worlds):
        orders = [remaining_order(plan, 2, r, m, progress) for r in range(m)]
        shares = remaining_shares(plan, 2, m, progress)
        assert len({len(o) for o in orders}) == 1  # equal counts: every rank as many batches
        dones = []
        for order, share in zip(orders, shares, strict=True):
            flags = data.draw(st.lists(st.booleans(), min_size=len(order), max_size=len(order)))
            mask = np.ones(len(order), bool) if i == len(worlds) - 1 else np.array(flags, bool)
            real += share[mask[: len(share)]].tolist()
            dones.append(Done.of(mask))
        progress = progress.then(m, dones)
    assert sorted(real) == list(range(shape.num_samples))  # each sample exactly once
