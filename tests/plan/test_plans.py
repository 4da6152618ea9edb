"""Plans: exactly once, determinism, balance, partial(q) movement and bounds (hypothesis)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.errors import ConfigError
from tierfeed.plan import DatasetShape, Plan, PlanSpec


@st.composite
def shapes(draw: st.DrawFn, max_samples: int = 400) -> DatasetShape:
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=max_samples // 10))
    chunk = np.repeat(np.arange(len(sizes)), sizes)
    return DatasetShape(chunk, np.full(len(chunk), 1000, dtype=np.int64))


@st.composite
def unordered_shapes(draw: st.DrawFn, max_samples: int = 400) -> DatasetShape:
    """A chunk column in any order, as an index checked on use may hold: plans read it as
    they read an index's (``ordered``, unchecked), and must stay permutations."""
    n = draw(st.integers(1, max_samples))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    chunk = rng.integers(0, draw(st.integers(1, 40)), n)
    return DatasetShape(chunk, np.full(n, 1000, dtype=np.int64), ordered=True)


any_shapes = st.one_of(shapes(), unordered_shapes())


specs = st.builds(
    PlanSpec,
    policy=st.sampled_from(["global", "local", "partial"]),
    q=st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
    window=st.sampled_from([0, 1, 3]),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
)


def all_orders(plan: Plan, epoch: int, m: int) -> list[np.ndarray]:
    return [plan.order(epoch, r, m) for r in range(m)]


@settings(max_examples=400)
@given(shape=any_shapes, spec=specs, m=st.integers(1, 8), epoch=st.integers(0, 6))
def test_exactly_once_balanced_deterministic(shape, spec, m, epoch) -> None:
    if spec.policy != "global" and m > shape.num_samples:
        with pytest.raises(ConfigError, match=r"only .* samples"):
            Plan(shape, spec).order(epoch, 0, m)
        return
    plan = Plan(shape, spec)
    orders = all_orders(plan, epoch, m)
    assert len({len(o) for o in orders}) == 1  # equal counts on every rank
    assert plan.order_size(epoch, m) == len(orders[0])  # told without computing an order
    counts = Counter(np.concatenate(orders).tolist())
    unpadded = plan.counts(epoch, m)
    if spec.drop_last:
        assert max(counts.values(), default=1) == 1  # never twice
        assert sum(counts.values()) == m * min(unpadded)
    else:
        assert set(counts) == set(range(shape.num_samples))  # every sample at least once
        assert sum(counts.values()) - shape.num_samples == sum(max(unpadded) - u for u in unpadded)
        assert sum(counts.values()) - shape.num_samples <= m - 1  # padding
    if spec.policy != "global":  # partitions balanced to the sample
        assert max(unpadded) - min(unpadded) <= 1
    assert all(
        np.array_equal(a, b) for a, b in zip(orders, all_orders(plan, epoch, m), strict=True)
    )
    if spec.policy != "global":  # local, partial: a rank reads its own partition
        for r, o in enumerate(orders):
            part = plan.partition(epoch, r, m)
            assert set(o.tolist()) <= set(part.tolist())


@settings(max_examples=120)
@given(shape=shapes(), q=st.sampled_from([0.1, 0.25, 0.5, 1.0]), m=st.integers(2, 6),
       seed=st.integers(0, 1000), epochs=st.integers(1, 5))  # fmt: skip
def test_partial_moves_q_and_stays_within_bounds(shape, q, m, seed, epochs) -> None:
    if m > shape.num_samples:
        return
    plan = Plan(shape, PlanSpec("partial", q=q, seed=seed))
    k = plan.exchange_size(m)
    n = plan.counts(0, m)
    assert k == int(q * min(n)) and k <= q * shape.num_samples / m + 1e-9
    for e in range(1, epochs + 1):
        before = [plan.partition(e - 1, r, m) for r in range(m)]
        after = [plan.partition(e, r, m) for r in range(m)]
        assert sorted(np.concatenate(after).tolist()) == list(range(shape.num_samples))
        ex = plan.exchange(e, m, batch_size=4)
        for r in range(m):
            sent = ex.sample[ex.src == r]
            got = ex.sample[ex.dst == r]
            assert len(sent) == len(got) == k and len(after[r]) == n[r]
            expected = (set(before[r].tolist()) - set(sent.tolist())) | set(got.tolist())
            assert expected == set(after[r].tolist())
            # Holding bound: partition plus what arrives before the sent ones leave.
            assert n[r] + len(got) <= max(n) + q * min(n)
            assert np.all(ex.step[ex.src == r] >= 0)
        assert np.all(ex.src != ex.dst)


@settings(max_examples=100)
@given(shape=shapes(), m=st.integers(1, 6), seed=st.integers(0, 99), epoch=st.integers(0, 4))
def test_partial_q0_equals_local(shape, m, seed, epoch) -> None:
    if m > shape.num_samples:
        return
    local = Plan(shape, PlanSpec("local", seed=seed))
    partial = Plan(shape, PlanSpec("partial", q=0.0, seed=seed))
    for r in range(m):
        assert np.array_equal(local.order(epoch, r, m), partial.order(epoch, r, m))


@settings(max_examples=100)
@given(shape=shapes(), spec=specs, m=st.integers(1, 6), epoch=st.integers(0, 3))
def test_chunkwise_reads_windows_of_chunks(shape, spec, m, epoch) -> None:
    if spec.window == 0 or (spec.policy != "global" and m > shape.num_samples):
        return
    plan = Plan(shape, spec)
    for r in range(m):
        order = plan._unpadded(epoch, r, m)
        # Each chunk's samples are contiguous within a window: a chunk, once left behind
        # a window boundary, never comes back more than `window` distinct chunks later.
        chunks = shape.sample_chunk[order]
        seq = chunks[np.r_[True, chunks[1:] != chunks[:-1]]] if len(chunks) else chunks
        first = {}
        for i, c in enumerate(seq.tolist()):
            first.setdefault(c, i)
        distinct_since = [
            len(set(seq[first[c] : i + 1].tolist())) for i, c in enumerate(seq.tolist())
        ]
        assert max(distinct_since, default=0) <= spec.window


def test_partial_one_rank_plan_cost_is_bounded() -> None:
    """10k samples per rank, 1,024 ranks, epoch 50: computed without all ranks' state."""
    shape = DatasetShape.uniform(1024 * 10_000, 1_000)
    plan = Plan(shape, PlanSpec("partial", q=0.3, seed=1))
    order = plan.order(50, 17, 1024)
    assert len(order) == 10_000 and len(np.unique(order)) == 10_000


def test_spec_parse_round_trips() -> None:
    for text in ("global", "local", "partial:0.3", "partial:0.1,chunkwise:4", "global,chunkwise:8"):
        assert str(PlanSpec.parse(text)) == text
    assert PlanSpec.parse("chunkwise:16").window == 16
    with pytest.raises(ConfigError, match="cannot read plan"):
        PlanSpec.parse("random")


def test_golden_values_pin_determinism() -> None:
    """The same (seed, epoch, world) gives these ids on every machine (PCG64 + SeedSequence)."""
    plan = Plan(DatasetShape.uniform(100, 10), PlanSpec("global", seed=7))
    assert plan.order(3, 1, 4)[:6].tolist() == GOLDEN


GOLDEN = [81, 16, 25, 7, 91, 35]


@settings(max_examples=150)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1))
def test_feistel_is_a_permutation(n: int, seed: int) -> None:
    from tierfeed.plan.bijection import feistel_permute

    words = np.random.SeedSequence(seed).generate_state(8, np.uint64)
    perm = feistel_permute(np.arange(n), n, words)
    assert sorted(perm.tolist()) == list(range(n))
    half = feistel_permute(np.arange(n // 2, n), n, words)  # any positions, same values
    assert np.array_equal(half, perm[n // 2 :])


@st.composite
def uniform_shapes(draw: st.DrawFn) -> DatasetShape:
    """Equal chunks, from one sample to larger than a whole partition."""
    n = draw(st.integers(1, 2000))
    return DatasetShape.uniform(n, draw(st.integers(1, 600)), 1000)


@settings(max_examples=150, deadline=None)
@given(shape=uniform_shapes(), m=st.integers(1, 32), q=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
       window=st.sampled_from([0, 1, 4]), epochs=st.integers(0, 3),
       seed=st.integers(0, 99))  # fmt: skip
def test_partitions_balanced_to_the_sample_over_shapes(shape, m, q, window, epochs, seed) -> None:
    """Issue 18: every rank owns floor or ceil of N/M samples, a contiguous run of the store
    at epoch 0; every sample is delivered once per epoch plus at most M - 1 padding; each
    epoch's exchange sends and receives the same count on every rank."""
    n = shape.num_samples
    for policy in ("local", "partial"):
        plan = Plan(shape, PlanSpec(policy, q=q, window=window, seed=seed))
        if m > n:
            with pytest.raises(ConfigError, match="samples"):
                plan.order(0, 0, m)
            continue
        first = [plan.partition(0, r, m) for r in range(m)]
        assert np.array_equal(np.concatenate(first), np.arange(n))  # runs, in store order
        assert {len(p) for p in first} <= {n // m, -(-n // m)}
        for e in range(epochs + 1):
            orders = [plan.order(e, r, m) for r in range(m)]
            assert len({len(o) for o in orders}) == 1
            delivered = np.concatenate(orders)
            assert np.array_equal(np.unique(delivered), np.arange(n))
            assert len(delivered) - n <= m - 1
            parts = [plan.partition(e, r, m) for r in range(m)]
            assert {len(p) for p in parts} <= {n // m, -(-n // m)}
            assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
            if e >= 1:
                ex = plan.exchange(e, m)
                sent = np.bincount(ex.src, minlength=m)
                got = np.bincount(ex.dst, minlength=m)
                k = plan.exchange_size(m)
                assert np.all(sent == k) and np.all(got == k)


@settings(max_examples=150)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1))
def test_feistel_invert_finds_each_values_position(n: int, seed: int) -> None:
    from tierfeed.plan.bijection import feistel_invert, feistel_permute

    words = np.random.SeedSequence(seed).generate_state(8, np.uint64)
    perm = feistel_permute(np.arange(n), n, words)
    assert np.array_equal(feistel_invert(perm, n, words), np.arange(n))
    some = perm[::7]
    assert np.array_equal(feistel_permute(feistel_invert(some, n, words), n, words), some)


@settings(max_examples=200, deadline=None)
@given(shape=any_shapes, m=st.integers(1, 9), epoch=st.integers(0, 3), drop_last=st.booleans(),
       seed=st.integers(0, 99), window=st.sampled_from([0, 1, 3]))  # fmt: skip
def test_readers_are_where_the_orders_read_each_sample(
    shape, m, epoch, drop_last, seed, window
) -> None:
    plan = Plan(shape, PlanSpec("global", window=window, drop_last=drop_last, seed=seed))
    expected = sorted(
        (int(s), r, i) for r in range(m) for i, s in enumerate(plan.order(epoch, r, m).tolist())
    )
    sample, rank, index = plan.readers(epoch, np.arange(shape.num_samples), m)
    assert sorted(zip(sample.tolist(), rank.tolist(), index.tolist(), strict=True)) == expected
    some = np.arange(0, shape.num_samples, 3)
    sample, _, _ = plan.readers(epoch, some, m)
    assert set(sample.tolist()) <= set(some.tolist())


@settings(max_examples=200)
@given(n=st.integers(1, 3000), m=st.integers(1, 40), window=st.sampled_from([0, 2]),
       drop_last=st.booleans())  # fmt: skip
def test_global_counts_are_the_unpadded_positions(n, m, window, drop_last) -> None:
    plan = Plan(DatasetShape.uniform(n, 7), PlanSpec("global", window=window, drop_last=drop_last))
    listed = [int((plan._global_positions(r, m) < n).sum()) for r in range(m)]
    assert plan.counts(0, m) == listed


@settings(max_examples=75)
@given(m=st.integers(2, 300), seed=st.integers(0, 1000), sweep=st.lists(st.integers(0, 10**6),
       min_size=1, max_size=40), q=st.sampled_from([0.01, 0.3, 1.0]))  # fmt: skip
def test_the_closed_form_offsets_are_the_steps_replayed(m, seed, sweep, q) -> None:
    """A slot's offset after c exchanges, read from the tables, is its c steps summed one by
    one; every step moves a slot to another rank (no rank keeps its own)."""
    plan = Plan(DatasetShape.uniform(10**7, 100), PlanSpec("partial", q, seed=seed))
    p = np.asarray(sweep, dtype=np.int64)
    total = np.zeros(len(p), dtype=np.int64)
    for c in range(1, 70):  # more than two periods of the group table
        counts = np.full(len(p), c, dtype=np.int64)
        step = plan._steps(counts, p, m)
        assert np.all((step >= 1) & (step <= m - 1))
        total = (total + step) % m
        assert np.array_equal(plan._offsets(counts, p, m), total)
    mixed = np.arange(len(p), dtype=np.int64) % 70  # counts differing slot by slot
    replayed = [sum(int(plan._steps(np.array([i]), p[j : j + 1], m)[0]) for i in range(1, c + 1))
                for j, c in enumerate(mixed.tolist())]  # fmt: skip
    assert plan._offsets(mixed, p, m).tolist() == [r % m for r in replayed]


@settings(max_examples=60, deadline=None)
@given(m=st.integers(2, 200), n_per=st.integers(1, 60), q=st.sampled_from([0.05, 0.3, 1.0]),
       seed=st.integers(0, 1000), epoch=st.integers(1, 400))  # fmt: skip
def test_every_exchange_sends_k_to_other_ranks_and_few_peers(m, n_per, q, seed, epoch) -> None:
    plan = Plan(DatasetShape.uniform(m * n_per + m // 2, 7), PlanSpec("partial", q, seed=seed))
    k = plan.exchange_size(m)
    ex = plan.exchange(epoch, m)
    assert np.all(ex.src != ex.dst)
    assert np.all(np.bincount(ex.src, minlength=m) == k)
    assert np.all(np.bincount(ex.dst, minlength=m) == k)
    for r in range(m):  # a window of the sweep meets at most three blocks: 3 x 32 peers
        assert len(np.unique(ex.src[ex.dst == r])) <= 96
        assert len(np.unique(ex.dst[ex.src == r])) <= 96


def test_a_partial_plan_costs_the_same_at_any_epoch() -> None:
    """No replay: epoch 10,000 is computed as epoch 1 is, and the sweep covers every slot
    exactly ceil or floor of e*k/n_min times."""
    shape = DatasetShape.uniform(64 * 1000, 100)
    plan = Plan(shape, PlanSpec("partial", q=0.3, seed=2))
    slots = [np.concatenate([plan.exchanged_slots(t, 64)[0] for t in range(1, 11)])]
    assert sorted(np.bincount(slots[0], minlength=1000).tolist()) == [3] * 1000
    for epoch in (10_000, 10_001):
        parts = [plan.partition(epoch, r, 64) for r in range(64)]
        assert sorted(np.concatenate(parts).tolist()) == list(range(64 * 1000))


@settings(max_examples=200)
@given(shape=unordered_shapes())
def test_chunk_starts_partition_the_samples_whatever_the_column(shape: DatasetShape) -> None:
    starts = shape.chunk_starts()
    assert starts[0] == 0 and starts[-1] == shape.num_samples
    assert np.all(np.diff(starts) >= 0) and len(starts) == shape.num_chunks + 1
    ordered = DatasetShape(np.sort(shape.sample_chunk))  # sorted: the runs are the column's
    sorted_starts = ordered.chunk_starts()
    assert np.array_equal(
        np.searchsorted(sorted_starts, np.arange(shape.num_samples), "right") - 1,
        ordered.sample_chunk,
    )
