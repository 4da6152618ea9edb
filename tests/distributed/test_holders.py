"""SampleHolders under partitions balanced to the sample: every sample staged by exactly one rank,
the rank whose first partition holds it; at most M - 1 chunks split into parts (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.distributed.holders import SPLIT, SampleHolders
from tierfeed.distributed.schedule import fetch_transfers
from tierfeed.plan import DatasetShape, Plan, PlanSpec
from tierfeed.world import World


@st.composite
def cases(draw: st.DrawFn) -> tuple[DatasetShape, int, int]:
    sizes = draw(st.lists(st.integers(1, 120), min_size=1, max_size=40))
    chunk = np.repeat(np.arange(len(sizes)), sizes)
    shape = DatasetShape(chunk, np.full(len(chunk), 100, dtype=np.int64))
    m = draw(st.integers(1, min(24, shape.num_samples)))
    per_node = draw(st.sampled_from([d for d in (1, 2, 4) if m % d == 0]))
    return shape, m, per_node


@settings(max_examples=200, deadline=None)
@given(case=cases(), policy=st.sampled_from(["local", "partial:0.5"]))
def test_each_sample_is_staged_once_by_its_first_partitions_rank(case, policy) -> None:
    shape, m, per_node = case
    spec = PlanSpec.parse(policy)
    sizes = np.bincount(shape.sample_chunk) * 100
    holdings = SampleHolders.of(shape, sizes, spec, World(0, m, 0, per_node))
    plan = Plan(shape, spec)
    staged = np.full(shape.num_samples, -1)
    starts = shape.chunk_starts()
    for r in range(m):
        for c in holdings.staged_by(r).tolist():
            assert np.all(staged[starts[c] : starts[c + 1]] == -1)
            staged[starts[c] : starts[c + 1]] = r
        for part in holdings.parts_of(r):
            assert holdings.holder[part.chunk] == SPLIT
            assert np.all(shape.sample_chunk[part.first : part.end] == part.chunk)
            assert np.all(staged[part.first : part.end] == -1)
            staged[part.first : part.end] = r
    assert np.all(staged >= 0)  # every sample, exactly once
    assert np.sum(holdings.holder == SPLIT) <= m - 1
    everything = np.arange(shape.num_samples)
    assert np.array_equal(holdings.sample_holder(everything), staged)
    for r in range(m):
        mine = plan.partition(0, r, m)
        assert np.all(staged[mine] == r)  # a rank stages exactly its first partition
        assert np.all(holdings.local_samples(r, mine))
    if spec.policy == "local":  # a local plan reads only what its rank staged: no transfer
        orders = [plan.order(1, r, m) for r in range(m)]
        assert len(fetch_transfers(orders, 0, len(orders[0]), holdings)) == 0


@settings(max_examples=100, deadline=None)
@given(case=cases())
def test_global_holdings_stay_whole_chunks(case) -> None:
    shape, m, per_node = case
    sizes = np.bincount(shape.sample_chunk) * 100
    holdings = SampleHolders.of(shape, sizes, PlanSpec("global"), World(0, m, 0, per_node))
    assert np.all(holdings.holder >= 0) and all(holdings.parts_of(r) == [] for r in range(m))
    everything = np.arange(shape.num_samples)
    assert np.array_equal(holdings.sample_holder(everything), holdings.holder[shape.sample_chunk])


@settings(max_examples=150, deadline=None)
@given(case=cases(), epoch=st.integers(0, 3), window=st.integers(1, 40), drop_last=st.booleans(),
       chunkwise=st.sampled_from([0, 1, 4]))  # fmt: skip
def test_one_ranks_fetch_schedule_is_its_rows_of_the_whole_one(
    case, epoch, window, drop_last, chunkwise
) -> None:
    """`rank_fetch` (one rank's order, and the inverse shuffle of what it staged) gives the
    rows of `fetch_transfers` (every rank's orders) in which the rank sends or receives, in
    the same order: the all-to-all of each window matches on both ends."""
    from tierfeed.distributed.schedule import num_windows, rank_fetch

    shape, m, per_node = case
    spec = PlanSpec("global", window=chunkwise, drop_last=drop_last, seed=epoch)
    sizes = np.bincount(shape.sample_chunk) * 100
    holdings = SampleHolders.of(shape, sizes, spec, World(0, m, 0, per_node))
    plan = Plan(shape, spec)
    orders = [plan.order(epoch, r, m) for r in range(m)]
    mine = [rank_fetch(plan, holdings, epoch, r, m, window) for r in range(m)]
    for w in range(num_windows(len(orders[0]), window)):
        whole = fetch_transfers(orders, w * window, (w + 1) * window, holdings)
        for r in range(m):
            got = mine[r].transfers(w, holdings)
            want = whole._where((whole.src == r) | (whole.dst == r))
            for a, b in ((got.sample, want.sample), (got.src, want.src), (got.dst, want.dst)):
                assert np.array_equal(a, b)
