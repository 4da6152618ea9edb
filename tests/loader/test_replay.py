"""The guard's swaps: recorded as they happen, and enough to replay the delivered order exactly,
whatever the storage's timing is the second time."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.errors import ConfigError
from tierfeed.loader import DeadlineOptions, GuardedStream, PrefetchOptions

GUARD = DeadlineOptions(fixed_ms=3, hard_timeout_s=20)
WINDOW = PrefetchOptions(window=8, threads=4)


def slowed(delays: dict[int, float]) -> object:
    def read(i: int) -> int:
        time.sleep(delays.get(i, 0.0))
        return i * 10

    return read


@pytest.mark.timeout(60)
def test_a_late_read_is_recorded_and_the_order_replays_under_other_timing() -> None:
    order = list(range(40))
    with GuardedStream(order, slowed({5: 0.15, 17: 0.1}), prefetch=WINDOW, deadline=GUARD) as s:
        first = [i for i, _ in s]
        swaps = list(s.swaps)
    assert sorted(first) == order and first != order  # deferred, nothing dropped
    assert swaps and all(first[k] == pos for k, pos in swaps)  # positions = ids here
    # The second time other reads are slow: the replay still delivers the first run's order.
    again = GuardedStream(
        order, slowed({3: 0.1, 30: 0.1}), prefetch=WINDOW, deadline=GUARD, replay=dict(swaps)
    )
    with again:
        assert [i for i, _ in again] == first
        assert again.swaps == swaps


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    late=st.lists(st.integers(0, 59), max_size=4, unique=True),
    seed=st.integers(0, 2**16),
)
@pytest.mark.timeout(300)
def test_any_recorded_order_replays_exactly_and_once(n: int, late: list[int], seed: int) -> None:
    order = list(np.random.default_rng(seed).permutation(n))
    delays = {order[p]: 0.03 for p in late if p < n}
    with GuardedStream(order, slowed(delays), prefetch=WINDOW, deadline=GUARD) as s:
        first = [i for i, _ in s]
        swaps = dict(s.swaps)
    assert sorted(first) == sorted(order)
    with GuardedStream(order, slowed({}), prefetch=WINDOW, deadline=GUARD, replay=swaps) as r:
        assert [i for i, _ in r] == first


@pytest.mark.timeout(60)
def test_a_replay_waits_for_a_late_read_instead_of_deferring_it() -> None:
    gate = threading.Event()

    def read(i: int) -> int:
        if i == 2:
            gate.wait(timeout=20)
        return i

    stream = GuardedStream(list(range(10)), read, prefetch=WINDOW, deadline=GUARD, replay={})
    threading.Timer(0.2, gate.set).start()
    with stream:
        assert [i for i, _ in stream] == list(range(10))
    assert stream.swaps == [] and stream.counters.deferred == 0


def test_a_replay_of_another_window_is_refused() -> None:
    stream = GuardedStream(list(range(40)), int, prefetch=WINDOW, replay={0: 30})
    with stream, pytest.raises(ConfigError, match="cannot replay: position 30"):
        list(stream)
