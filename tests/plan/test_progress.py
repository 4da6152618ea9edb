"""Resume and elasticity: restarts mid-epoch, with or without a new world size, exactly once."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.plan.test_plans import shapes
from tierfeed.plan import (
    DatasetShape,
    EpochProgress,
    Plan,
    PlanSpec,
    PlanState,
    remaining_order,
    remaining_shares,
)


@settings(max_examples=250)
@given(
    shape=shapes(),
    policy=st.sampled_from(["global", "local", "partial:0.3", "global,chunkwise:2"]),
    worlds=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    cuts=st.lists(st.floats(0, 1), min_size=4, max_size=4),
    seed=st.integers(0, 999),
    epoch=st.integers(0, 3),
)
def test_restarts_deliver_every_sample_exactly_once(
    shape: DatasetShape, policy: str, worlds: list[int], cuts: list[float], seed: int, epoch: int
) -> None:
    plan = Plan(shape, PlanSpec.parse(policy, seed=seed))
    if plan.spec.policy != "global" and worlds[0] > shape.num_chunks:
        return
    progress = EpochProgress()
    delivered: list[int] = []
    for i, m in enumerate(worlds):
        orders = [remaining_order(plan, epoch, r, m, progress) for r in range(m)]
        shares = remaining_shares(plan, epoch, m, progress)
        assert len({len(o) for o in orders}) == 1  # equal counts: padded
        last = i == len(worlds) - 1
        # Ranks run in lockstep: each consumes the same count, then the job stops.
        consumed = len(orders[0]) if last else int(cuts[i] * len(orders[0]))
        for r in range(m):
            assert np.array_equal(orders[r][: len(shares[r])], shares[r])  # padding at the end
            delivered += shares[r][:consumed].tolist()  # real samples, padding excluded
        progress = progress.then(m, consumed)
    assert sorted(delivered) == list(range(shape.num_samples))  # each exactly once


@settings(max_examples=100)
@given(shape=shapes(), seed=st.integers(0, 99), m=st.integers(1, 5), stop=st.floats(0, 1))
def test_resume_same_world_equals_uninterrupted(shape, seed, m, stop) -> None:
    plan = Plan(shape, PlanSpec("global", seed=seed))
    full = [plan.order(2, r, m) for r in range(m)]
    c = int(stop * len(full[0]))
    state = PlanState(plan.spec, 2, EpochProgress().then(m, c))
    back = PlanState.from_state_dict(state.state_dict())
    for r in range(m):
        rest = remaining_order(Plan(shape, back.spec), back.epoch, r, m, back.progress)
        # Same world: the remaining samples are the uninterrupted run's, as a multiset.
        tail = [set(full[q][c:].tolist()) for q in range(m)]
        assert set(rest.tolist()) <= set().union(*tail) | set(full[r].tolist())
    assert np.array_equal(plan.order(2, 0, m), Plan(shape, back.spec).order(2, 0, m))
