"""The guard's bounds on a wait (issue 45): a head that the reads ahead overtook is late before
its deadline, and a late head the batch waits on alone is read a second way at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.conftest import write_tree
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader import DeadlineOptions, GuardedStream, PrefetchOptions
from tierfeed.loader.compose import open_store
from tierfeed.torch import TierConfig

pytestmark = pytest.mark.timeout(30)

LONG = 20_000.0  # ms: a deadline no wait in these tests reaches
MARGIN_S = 2.0  # scheduling on a busy 2-core machine, a thread pool's start


class Held:
    """Reads of ``held`` block until released (at the latest at teardown); others return."""

    def __init__(self, held: set[int]) -> None:
        self.held, self.release = held, threading.Event()
        self.primary: list[int] = []

    def read(self, i: int) -> str:
        self.primary.append(i)
        if i in self.held:
            self.release.wait(30)
        return f"v{i}"


@pytest.fixture
def held() -> Iterator[Held]:
    made = Held(set())
    yield made
    made.release.set()


def test_a_head_overtaken_by_the_reads_ahead_is_late_before_its_deadline(held: Held) -> None:
    """With a deadline far away (a cold epoch's, which follows reads that wait for copies),
    the reads ahead ready and the head not: the ready ones go first, the head after."""
    held.held = {0}
    options = DeadlineOptions(fixed_ms=LONG, hard_timeout_s=60, hedge_blocked=False, warmup=8)
    stream = GuardedStream(list(range(16)), held.read, deadline=options)
    out: list[int] = []
    started = time.monotonic()
    with stream:
        for i, _ in stream:
            out.append(i)
            if len(out) == 15:
                took = time.monotonic() - started
                held.release.set()
    assert out[:15] == list(range(1, 16)) and out[15] == 0
    assert took < MARGIN_S  # not the 20 s deadline
    assert stream.counters.deferred == 1


def test_a_head_only_a_little_slower_than_the_reads_ahead_is_waited_for() -> None:
    """Overtaken by half the reads ahead, but not slower than most reads (the tracked
    quantile): it is waited for, and the order holds."""

    def read(i: int) -> str:
        time.sleep(0.15 if i == 0 else 0.05 if i % 2 else 0.25)
        return f"v{i}"

    options = DeadlineOptions(fixed_ms=LONG, hard_timeout_s=60, hedge_blocked=False, warmup=8)
    warm = GuardedStream(list(range(1, 12)), read, deadline=options)
    with warm:
        list(warm)  # reads of 0.05 and 0.25 s observed: the quantile is 0.25 s
    stream = GuardedStream(list(range(12)), read, deadline=options)
    stream.tracker = warm.tracker
    with stream:  # at 0.05 s half the reads ahead are ready; sample 0 lands at 0.15 s
        assert next(i for i, _ in stream) == 0


def test_without_the_overtaking_rule_the_head_waits_its_deadline(held: Held) -> None:
    held.held = {0}
    options = DeadlineOptions(
        fixed_ms=300, hard_timeout_s=60, overtaken_share=None, hedge_blocked=False
    )
    stream = GuardedStream(list(range(16)), held.read, deadline=options)
    started = time.monotonic()
    with stream:
        first, _ = next(iter(stream))
        waited = time.monotonic() - started
        held.release.set()
    assert first == 1 and waited >= 0.3  # deferred at its deadline, not before


def test_half_the_window_ready_is_enough(held: Held) -> None:
    """Overtaken at the share: with reads 0 and 1..7 held and 8..15 ready (8 of the 15 ahead
    of sample 0), sample 8 comes first, long before the deadline."""
    held.held = set(range(8))
    options = DeadlineOptions(fixed_ms=LONG, hard_timeout_s=60, hedge_blocked=False, warmup=8)
    stream = GuardedStream(list(range(16)), held.read, deadline=options)
    started = time.monotonic()
    with stream:
        it = iter(stream)
        first, _ = next(it)
        took = time.monotonic() - started
        held.release.set()
        rest = [i for i, _ in it]
    assert first == 8 and took < MARGIN_S
    assert sorted([first, *rest]) == list(range(16))


@pytest.mark.parametrize("window", [1, 8])
def test_a_late_head_the_batch_waits_on_alone_is_hedged_at_once(held: Held, window: int) -> None:
    """Nothing ready to take its place (a window of one, or every read ahead held too): the
    late head is read the second way at its deadline, and that read is delivered."""
    held.held = set(range(16))
    options = DeadlineOptions(fixed_ms=50, hard_timeout_s=60)
    stream = GuardedStream(
        list(range(16)), held.read, hedge=lambda i: f"h{i}", deadline=options,
        prefetch=PrefetchOptions(window=window),
    )  # fmt: skip
    waits: list[float] = []
    with stream:
        asked = time.monotonic()
        got = []
        for i, value in stream:
            waits.append(time.monotonic() - asked)
            got.append((i, value))
            asked = time.monotonic()
    assert sorted(i for i, _ in got) == list(range(16))  # each once
    assert all(value == f"h{i}" for i, value in got)  # every read held: the hedges won
    assert stream.counters.hedges == 16 and stream.counters.hedge_wins == 16
    assert max(waits) < 0.05 + MARGIN_S  # the deadline and one read, not the held read


def test_the_exact_order_hedges_a_late_head_and_keeps_the_order(held: Held) -> None:
    held.held = {3}
    options = DeadlineOptions(enabled=False, fixed_ms=50, hard_timeout_s=60)
    stream = GuardedStream(list(range(10)), held.read, hedge=lambda i: f"h{i}", deadline=options)
    started = time.monotonic()
    with stream:
        got = list(stream)
    assert [i for i, _ in got] == list(range(10))  # the plan's order
    assert got[3] == (3, "h3") and stream.counters.hedges == 1
    assert time.monotonic() - started < 0.05 + MARGIN_S


def test_blocked_hedges_off_wait_for_the_read(held: Held) -> None:
    held.held = {0}
    options = DeadlineOptions(fixed_ms=20, hard_timeout_s=60, hedge_blocked=False)
    stream = GuardedStream([0], held.read, hedge=lambda i: f"h{i}", deadline=options)
    threading.Timer(0.3, held.release.set).start()
    with stream:
        assert list(stream) == [(0, "v0")]
    assert stream.counters.hedges == 0


def test_no_blocked_hedges_from_an_object_store() -> None:
    """A read from an object store waits for its copy's piece by design (a request is
    billed); the copy hedges its own late requests."""
    options = DeadlineOptions()
    assert options.hedge_blocked and options.hedges
    assert not options.for_origin(costly_requests=True).hedge_blocked
    assert not options.for_origin(costly_requests=True).hedges
    assert options.for_origin(costly_requests=False) == options
    with_after = DeadlineOptions(hedge_after_ms=100).for_origin(costly_requests=True)
    assert with_after.hedges and not with_after.hedge_blocked


def test_no_blocked_hedges_without_a_second_way() -> None:
    """A job's namespace has no second way to its chunks known (its chunk files hold what
    its node holds, samples sent away punched out): no blocked hedge reads them."""
    options = DeadlineOptions()
    assert not options.for_origin(costly_requests=False, second_way=False).hedge_blocked
    assert options.for_origin(costly_requests=False, second_way=True) is options


def test_a_store_by_path_has_a_second_way_and_a_callers_source_none(tmp_path: Path) -> None:
    """The blocked hedge's second way to a store opened by path: its chunk files read
    straight, the same bytes; a store over a caller's source (a job's namespace) has none."""
    write_tree(tmp_path / "tree", {f"{i:02d}.bin".encode(): bytes([i]) * 3000 for i in range(20)})
    pack(tmp_path / "tree", tmp_path / "store", PackOptions(chunk_size=16384, progress=False))
    with open_store(tmp_path / "store", tiers=TierConfig(ram_bytes=1 << 20)) as store:
        assert store.second_source is not None
        second = store.second_source()
        try:
            for chunk in range(len(store.chunks)):
                size = store.chunks[chunk].size
                assert second.read_range(chunk, 0, size) == store.source.read_range(chunk, 0, size)
        finally:
            second.close()
        with open_store(tmp_path / "store", source=store.source) as theirs:
            assert theirs.second_source is None
