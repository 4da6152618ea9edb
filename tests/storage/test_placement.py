"""Placement decisions on small known sequences, and quotas under random access (hypothesis)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.storage.placement import Clairvoyant, FillTop, Lru, Placement, make_policy


def run(
    policy: Placement, accesses: list[int], quota: int, sizes: list[int] | None = None
) -> tuple[int, list]:
    """Misses of a read sequence through one tier, and the evictions in order.

    Chunk c has sizes[c] bytes (1 when not given); the quota is checked after every step.
    """
    cached: dict[int, int] = {}
    misses, evicted = 0, []
    for chunk in accesses:
        size = sizes[chunk] if sizes is not None else 1
        policy.accessed(chunk)
        if chunk in cached:
            continue
        misses += 1
        ok, victims = policy.choose(cached, chunk, size, quota)
        assert ok or not victims
        for v in victims:
            evicted.append(v)
            del cached[v]
        if ok:
            cached[chunk] = size
        assert sum(cached.values()) <= quota
    return misses, evicted


def test_fill_top_never_evicts() -> None:
    assert run(FillTop(), [1, 2, 3, 1, 2, 3], quota=2) == (4, [])


def test_lru_evicts_least_recent() -> None:
    misses, evicted = run(Lru(), [1, 2, 1, 3, 2, 4], quota=2)
    assert evicted == [2, 1, 3] and misses == 5


def test_clairvoyant_evicts_furthest_next_use() -> None:
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    policy = Clairvoyant()
    policy.set_future(seq)
    misses, evicted = run(policy, seq, quota=2)
    # Belady: 3 is never needed again, so it is not even cached; 4 likewise.
    assert evicted == [] and misses == 4
    lru_misses, _ = run(Lru(), seq, quota=2)
    assert misses < lru_misses


def test_clairvoyant_prefetch_takes_the_next_chunks_that_fit() -> None:
    policy = Clairvoyant()
    policy.set_future([5, 6, 5, 7, 8])
    assert list(policy.prefetch({}, quota=2, sizes=dict.fromkeys(range(10), 1))) == [5, 6]


@settings(max_examples=200)
@given(
    name=st.sampled_from(["fill-top", "lru", "clairvoyant"]),
    accesses=st.lists(st.integers(0, 12), min_size=1, max_size=80),
    quota=st.integers(0, 8),
    sizes=st.lists(st.integers(1, 4), min_size=13, max_size=13),
)
def test_quota_is_never_exceeded(name: str, accesses: list[int], quota: int, sizes) -> None:
    policy = make_policy(name)
    if isinstance(policy, Clairvoyant):
        policy.set_future(accesses)
    run(policy, accesses, quota, sizes)  # asserts the quota after every step


@settings(max_examples=100)
@given(accesses=st.lists(st.integers(0, 9), min_size=1, max_size=60), quota=st.integers(1, 6))
def test_clairvoyant_never_displaces_for_a_chunk_not_read_again(accesses, quota) -> None:
    policy = Clairvoyant()
    policy.set_future(accesses)
    cached: dict[int, int] = {}
    for chunk in accesses:
        policy.accessed(chunk)
        if chunk in cached:
            continue
        room = len(cached) < quota
        ok, victims = policy.choose(cached, chunk, 1, quota)
        if policy.next_use(chunk) == float("inf"):  # free room only, nothing displaced
            assert ok == room and victims == []
        if ok:
            # Belady: every victim is needed later than the chunk that displaces it.
            assert all(policy.next_use(v) > policy.next_use(chunk) for v in victims)
            for v in victims:
                del cached[v]
            cached[chunk] = 1


def test_clairvoyant_keeps_a_fetched_chunk_that_no_longer_pays_for_its_copy() -> None:
    # Chunk 0 is read 3 more times; a copy of it costs 10 reads (size 10, one read 1 byte).
    policy = Clairvoyant()
    policy.set_future([0, 0, 0], read_bytes=1.0)
    assert policy.choose({}, 0, 10, 100) == (False, [])  # not worth fetching for 3 reads
    # Once its bytes have arrived (a miss fetched it anyway), keeping it costs nothing.
    assert policy.choose({}, 0, 10, 100, fetched=True) == (True, [])
    # But it still displaces nothing that is read again sooner than it pays back.
    policy.set_future([0, 1, 1, 1], read_bytes=1.0)
    assert policy.choose({1: 100}, 0, 10, 100, fetched=True) == (False, [])


@settings(max_examples=50)
@given(seed=st.integers(0, 2**16), window=st.integers(2, 64))
def test_clairvoyant_clock_survives_reads_out_of_plan_order(seed: int, window: int) -> None:
    # A loader reads up to a window ahead with many threads: reads land out of order. After
    # one epoch of such reads, every chunk is still needed in the two epochs that follow.
    rng = np.random.default_rng(seed)
    epochs = [rng.integers(0, 12, size=300) for _ in range(3)]
    policy = Clairvoyant()
    policy.set_future(np.concatenate(epochs))
    first = epochs[0].copy()
    for start in range(0, len(first), window):  # shuffled inside each window
        rng.shuffle(first[start : start + window])
    for chunk in first.tolist():
        policy.accessed(chunk)
    later = set(np.concatenate(epochs[1:]).tolist())
    assert all(policy.next_use(c) != float("inf") for c in later)
    assert all(policy.next_use(c) >= len(first) for c in later)


def test_clairvoyant_takes_free_room_for_a_chunk_not_read_again_and_gives_it_up_first() -> None:
    # Chunk 0 is not read again in the known future (this process's share of this epoch): it
    # takes free room (the next epoch, or another process sharing the tier, may read it) ...
    policy = Clairvoyant()
    policy.set_future([0, 1, 2, 1, 2])
    policy.accessed(0)
    assert policy.choose({}, 0, 1, 2) == (True, [])
    assert policy.choose({5: 1, 6: 1}, 0, 1, 2) == (False, [])  # ... but displaces nothing
    # ... and is the first victim, free of cost: chunk 1, read twice, displaces it at once.
    assert policy.choose({0: 1, 2: 1}, 1, 1, 2) == (True, [0])


def test_the_prefetch_look_runs_outside_the_holdings_mutex(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look over the future is O(horizon) in Python: held through it, the mutex every read
    takes held those reads for as long as the look's GIL switches took on a crowded machine.
    The look works on a copy of what is taken, and chooses what it chose before."""
    from tierfeed.format.chunkref import ChunkInfo
    from tierfeed.storage.disktier import Tier
    from tierfeed.storage.foresight import Foresight
    from tierfeed.storage.holdings import Holdings
    from tierfeed.storage.memory import MemoryDriver

    chunks = [ChunkInfo(i, f"chunks/{i:06d}.tar", 100, i) for i in range(4)]
    holdings = Holdings(chunks, [Tier(MemoryDriver(), quota=250, name="ram")], "clairvoyant", False)
    held_in_look: list[bool] = []
    real = Clairvoyant.prefetch

    def look(self: Clairvoyant, *args: Any, **kwargs: Any) -> Any:
        held_in_look.append(holdings.mutex.locked())
        yield from real(self, *args, **kwargs)

    monkeypatch.setattr(Clairvoyant, "prefetch", look)
    foresight = Foresight(holdings)
    foresight.set_future([2, 0, 2, 1, 3, 0], read_bytes=100.0)
    assert foresight.chosen(set(), 6) == [2, 0]  # room for two of 100 bytes in 250
    assert held_in_look == [False]


def test_a_prefetch_look_judges_each_chunk_ahead_once() -> None:
    """A chunk refused at its first read ahead is not judged again at each later read of it
    in the same look (each judgement ranked every held chunk: a look over 8,192 reads of a
    few refused chunks took a large share of a worker's CPU)."""
    policy = Clairvoyant()
    policy.set_future([0, 1, 0, 1, 0, 1, 2, 2, 3], read_bytes=1.0)
    judged: list[int] = []
    real = policy.choose

    def choose(cached: Any, chunk: int, size: int, quota: int, fetched: bool = False) -> Any:
        judged.append(chunk)
        return real(cached, chunk, size, quota, fetched)

    policy.choose = choose  # type: ignore[method-assign]
    sizes = {0: 100, 1: 100, 2: 100, 3: 1}
    # Three reads of 0 and of 1 do not pay for a copy of 100 bytes read a byte at a time; 3
    # is read once and costs one read; 2, read twice, is not worth 100 either.
    assert list(policy.prefetch({}, 1000, sizes, horizon=9)) == [3]
    assert judged == [0, 1, 2, 3]
