"""The deadline guard: exactly once whatever is late, deferral, hedging, hard timeout, resume."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.errors import StuckReadError
from tierfeed.loader import DeadlineOptions, GuardedStream, PrefetchOptions, StreamState

FAST = DeadlineOptions(fixed_ms=15, hard_timeout_s=20)


class Gate:
    """Reads that block until the test opens them; every gate opens at teardown."""

    def __init__(self, held: set[int]) -> None:
        self.events = {i: threading.Event() for i in held}

    def read(self, i: int) -> str:
        if i in self.events:
            self.events[i].wait(timeout=30)
        return f"v{i}"

    def open(self, i: int | None = None) -> None:
        for k, e in self.events.items():
            if i is None or k == i:
                e.set()


@pytest.fixture
def gate() -> Iterator[Callable[[set[int]], Gate]]:
    gates: list[Gate] = []

    def make(held: set[int]) -> Gate:
        gates.append(Gate(held))
        return gates[-1]

    yield make
    for g in gates:
        g.open()


def ids(stream: GuardedStream[str]) -> list[int]:
    return [i for i, _ in stream]


@pytest.mark.timeout(30)
def test_guard_off_gives_the_plans_exact_order() -> None:
    rng = np.random.default_rng(1)
    delays = rng.exponential(0.002, size=200)

    def read(i: int) -> int:
        time.sleep(delays[i])
        return i * 10

    order = list(rng.permutation(200))
    with GuardedStream(order, read, deadline=DeadlineOptions(enabled=False)) as s:
        got = list(s)
    assert [i for i, _ in got] == order
    assert all(v == i * 10 for i, v in got)


@pytest.mark.timeout(30)
def test_stalled_read_is_deferred_then_delivered(gate: Callable[[set[int]], Gate]) -> None:
    g = gate({0})
    stream = GuardedStream(list(range(20)), g.read, deadline=FAST)
    out: list[int] = []
    with stream:
        for i, value in stream:
            assert value == f"v{i}"
            out.append(i)
            if len(out) == 10:
                g.open(0)
                time.sleep(0.05)  # a training step: the released read lands meanwhile
    assert sorted(out) == list(range(20))
    assert out[0] != 0 and out.index(0) == 10  # overtaken, then delivered once it landed
    assert stream.counters.deferred == 1 and stream.counters.late >= 1


@pytest.mark.timeout(30)
def test_a_stuck_read_is_overtaken_by_at_most_the_window(gate: Callable[[set[int]], Gate]) -> None:
    g = gate({3})
    stream = GuardedStream(list(range(50)), g.read, deadline=FAST, prefetch=PrefetchOptions(8))
    out: list[int] = []
    with stream:
        it = iter(stream)
        out.extend(i for i, _ in itertools.islice(it, 10))
        g.open(3)
        out.extend(i for i, _ in it)
    # With a window of 8, positions 0..2 and then at most 7 younger ones go before sample 3.
    assert out[:10] == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10] and out[10] == 3
    assert sorted(out) == list(range(50))


@pytest.mark.timeout(30)
def test_hedge_lands_first(gate: Callable[[set[int]], Gate]) -> None:
    g = gate({5})
    options = DeadlineOptions(fixed_ms=10, hedge_after_ms=20, hard_timeout_s=20)
    stream = GuardedStream(list(range(10)), g.read, hedge=lambda i: f"v{i}", deadline=options)
    with stream:
        got = dict(stream)
        g.open()  # the primary read is still stalled; close() joins the pool's threads
    assert got == {i: f"v{i}" for i in range(10)}
    assert stream.counters.hedges == 1 and stream.counters.hedge_wins == 1


@pytest.mark.timeout(30)
def test_hard_timeout_names_the_stuck_sample(gate: Callable[[set[int]], Gate]) -> None:
    g = gate({2})
    options = DeadlineOptions(fixed_ms=5, hard_timeout_s=0.3)
    stream = GuardedStream(
        [0, 1, 2, 3], g.read, deadline=options, describe=lambda i: f"sample {i} (chunk 7)"
    )
    with stream:
        with pytest.raises(StuckReadError, match=r"sample 2 \(chunk 7\).*hard timeout"):
            list(stream)
        g.open()


@pytest.mark.timeout(30)
def test_read_errors_surface() -> None:
    def read(i: int) -> int:
        if i == 4:
            raise OSError("disk on fire")
        return i

    with GuardedStream(list(range(8)), read, deadline=FAST) as s, pytest.raises(OSError):
        list(s)


@pytest.mark.timeout(30)
def test_resume_with_deferred_samples_in_flight(gate: Callable[[set[int]], Gate]) -> None:
    g = gate({1, 2})
    first = GuardedStream(list(range(30)), g.read, deadline=FAST)
    with first:
        taken = [i for i, _ in itertools.islice(iter(first), 12)]
        state = StreamState.from_dict(first.state().to_dict())
        g.open()  # close() joins the reads still in flight
    assert 1 not in taken and 2 not in taken  # still stalled when we stopped
    with GuardedStream(list(range(30)), g.read, deadline=FAST, state=state) as second:
        rest = ids(second)
    assert sorted(taken + rest) == list(range(30))


def test_local_samples_are_read_on_the_consumers_thread() -> None:
    threads: dict[int, str] = {}

    def read(i: int) -> int:
        threads[i] = threading.current_thread().name
        return i * 10

    local = {0, 3, 4, 9}
    with GuardedStream(list(range(12)), read, local=local.__contains__, deadline=FAST) as s:
        got = list(s)
    assert sorted(got) == [(i, i * 10) for i in range(12)]
    here = threading.current_thread().name
    assert {i for i, name in threads.items() if name == here} == local
    # Switched off, every read goes to the reader threads.
    threads.clear()
    off = PrefetchOptions(inline_local=False)
    with GuardedStream(list(range(12)), read, local=local.__contains__, prefetch=off) as s:
        assert sorted(i for i, _ in s) == list(range(12))
    assert here not in threads.values()


def test_an_inline_read_that_fails_raises_at_its_turn() -> None:
    def read(i: int) -> int:
        if i == 5:
            raise OSError("tier disk on fire")
        return i

    prefetch = PrefetchOptions(window=8)
    got = []
    stream = GuardedStream(list(range(10)), read, local=lambda i: True, prefetch=prefetch)
    with stream, pytest.raises(OSError, match="tier disk on fire"):
        for i, _ in stream:
            got.append(i)
    assert got == [0, 1, 2, 3, 4]  # read ahead, raised when delivered: as on a thread


def test_local_runs_are_read_together_and_fail_alone() -> None:
    runs: list[list[int]] = []

    def read(i: int) -> int:
        if i == 6:
            raise OSError("member 6 unreadable")
        return i

    def read_local(ids: list[int]) -> list[int]:
        runs.append(ids)
        return [read(i) for i in ids]

    local = {0, 1, 2, 3, 5, 6, 7}  # 4 goes to a reader thread
    stream = GuardedStream(
        list(range(9)), read, local=local.__contains__, read_local=read_local, deadline=FAST
    )
    got = []
    with stream, pytest.raises(OSError, match="member 6 unreadable"):
        for i, _ in stream:
            got.append(i)
    assert runs[0] == [0, 1, 2, 3]  # the run up to the first position that is not local
    assert [5, 6, 7] in runs  # failed as a run: each read alone, 5 delivered, 6 raised
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    assert stream.counters.inline == 6  # 0-3 as a run, then 5 and 7 each alone


def test_a_sample_evicted_before_its_turn_goes_to_a_reader_thread() -> None:
    threads: dict[int, str] = {}
    asked: dict[int, int] = {}

    def read(i: int) -> int:
        threads[i] = threading.current_thread().name
        return i

    def local(i: int) -> bool:
        # Sample 3 is local when it enters the window, and evicted when its turn comes.
        asked[i] = asked.get(i, 0) + 1
        return i != 3 or asked[i] == 1

    def read_local(ids: list[int]) -> list[int]:
        return [read(i) for i in ids]

    stream = GuardedStream(list(range(8)), read, local=local, read_local=read_local)
    with stream:
        assert sorted(i for i, _ in stream) == list(range(8))
    here = threading.current_thread().name
    assert threads[3] != here  # read by a thread, under the guard
    assert all(threads[i] == here for i in range(8) if i != 3)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    window=st.integers(1, 16),
    stalls=st.sets(st.integers(0, 59), max_size=5),
    local=st.sets(st.integers(0, 59), max_size=30),
    seed=st.integers(0, 2**16),
    stop=st.integers(0, 60),
)
def test_exactly_once_under_injected_late_reads(n, window, stalls, local, seed, stop) -> None:
    rng = np.random.default_rng(seed)
    delay = rng.exponential(0.0005, size=n)
    for s in stalls:
        if s < n and s not in local:
            delay[s] = 0.03  # a stall: late against the 2 ms deadline below
    for s in local:
        if s < n:
            delay[s] = 0.0  # held locally: read on the consumer's thread

    def read(i: int) -> int:
        time.sleep(delay[i])
        return i

    order = [int(x) for x in rng.permutation(n)]
    options = DeadlineOptions(fixed_ms=2, hard_timeout_s=20)
    prefetch = PrefetchOptions(window=window, threads=8)
    held = local.__contains__
    for runs in (None, lambda many: [read(i) for i in many]):
        kw = {"local": held, "read_local": runs, "deadline": options, "prefetch": prefetch}
        with GuardedStream(order, read, **kw) as s:  # type: ignore[arg-type]
            first = [i for i, _ in itertools.islice(iter(s), stop)]
            state = s.state()
        with GuardedStream(order, read, state=state, **kw) as s:  # type: ignore[arg-type]
            rest = ids(s)  # type: ignore[arg-type]
        assert sorted(first + rest) == list(range(n))
