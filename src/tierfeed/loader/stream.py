"""The prefetch window with a deadline guard: dynamic I/O replacement that never drops a sample.

Reads of the plan's next samples run ahead on a thread pool. The consumer gets samples in
plan order while they arrive in time. When the sample due next misses its deadline, or most
reads ahead are ready while it is not, the oldest sample that is ready takes its place and
the late one is deferred: its read goes on and it is delivered as soon as it lands, ahead of
anything younger. While nothing is ready to take its place, it is read a second way (a
hedge) and the first read to land is delivered. The window spans ``window`` positions from
the oldest sample not yet delivered, so a sample is overtaken by at most ``window - 1``
others, and the epoch ends only when every position of the order has been delivered exactly
once, or with an error naming the read that exceeded the hard timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from tierfeed.daemonpool import DaemonPool
from tierfeed.errors import StuckReadError
from tierfeed.hedging import Hedges
from tierfeed.loader.latency import DeadlineOptions, LatencyTracker
from tierfeed.loader.replay import replayed_position
from tierfeed.loader.streamstate import (
    Entry,
    PrefetchOptions,
    StreamCounters,
    StreamState,
    overtaken,
)

__all__ = ["GuardedStream", "PrefetchOptions", "StreamCounters", "StreamState"]

T = TypeVar("T")
_POLL_S = 0.005  # how often a blocked wait re-checks hedges and the hard timeout


class GuardedStream(Generic[T]):
    """Iterate ``(sample id, value)`` over ``order`` with read-ahead and the deadline guard.

    Args:
        order: sample ids in plan order.
        read: reads one sample (called on the pool's threads).
        hedge: a second, independent way to read a sample (another tier, or the origin);
            used by ``deadline.hedge_after_ms`` and ``deadline.hedge_blocked``.
        local: says a sample is held on this host (a tier holds its chunk): with
            ``prefetch.inline_local``, such a sample is read on the consumer's thread, and
            only the others go to the reader threads.
        read_local: reads several local samples at once (in their order); with it, a local
            sample's position waits in the window as ready, and when it is taken it is read
            together with the run of local positions that follow it. A failure of the run
            reads each of its samples alone, so an error is raised at its own position.
        size_of: bytes a sample will take, for the byte bound of the window.
        describe: names a sample in errors (e.g. its key and chunk).
        prefetch: window and thread settings.
        deadline: guard settings.
        state: where to resume in ``order`` (deliveries, as `swaps` number them, go on).
        pool: a shared reader pool; by default the stream owns one. With a shared pool,
            `close` does not wait for reads already running; an owned pool (a `DaemonPool`)
            waits a bounded time for them.
        hedge_pool: where hedges run (by default the stream's own `Hedges`).
        replay: deliver exactly the order of an earlier run of the same stream: the
            positions it delivered out of turn, by delivery number (its `swaps`); every other
            delivery takes the oldest position not yet delivered. Late reads are waited for
            (and hedged), not deferred.

    `swaps` records the positions delivered out of turn, ``(delivery number, position)``: few
    (what the guard deferred), and enough to replay the order."""

    def __init__(
        self,
        order: Sequence[int] | npt.NDArray[np.integer[Any]],
        read: Callable[[int], T],
        *,
        hedge: Callable[[int], T] | None = None,
        local: Callable[[int], bool] | None = None,
        read_local: Callable[[list[int]], list[T]] | None = None,
        size_of: Callable[[int], int] | None = None,
        describe: Callable[[int], str] | None = None,
        prefetch: PrefetchOptions | None = None,
        deadline: DeadlineOptions | None = None,
        state: StreamState | None = None,
        pool: Executor | None = None,
        hedge_pool: Executor | None = None,
        replay: Mapping[int, int] | None = None,
    ) -> None:
        self.order = order
        self._replay = replay
        self.swaps: list[tuple[int, int]] = []
        self._read, self._hedge = read, hedge
        self.prefetch = prefetch or PrefetchOptions()
        self._local = local if self.prefetch.inline_local else None
        self._read_local = read_local
        self._size_of = size_of or (lambda _: 1)
        self._describe = describe or (lambda i: f"sample {i}")
        self.deadline = deadline or DeadlineOptions()
        self.tracker = LatencyTracker(self.deadline)
        state = state or StreamState()
        self.counters = StreamCounters(delivered=state.cursor + len(state.ahead))
        self._sent = 0  # swaps handed out by `new_swaps`
        self._cursor = state.cursor
        self._done: set[int] = set(state.ahead)  # delivered positions >= cursor
        self._next = state.cursor  # next position to submit
        self._window: dict[int, Entry[T]] = {}
        self._inflight_bytes = 0
        self._deferred: set[int] = set()
        self._due: dict[int, float] = {}  # position -> when it became late; fixed once set
        self._own_pool = pool is None
        self._pool = pool or DaemonPool(self.prefetch.threads, "tierfeed-read")
        # Hedges get threads of their own: queued behind the window they would land late.
        d = self.deadline
        hedging = hedge is not None and (d.hedge_after_ms is not None or d.hedge_blocked)
        self._own_hedge_pool = hedging and hedge_pool is None
        self._hedge_pool = None if not hedging else hedge_pool or Hedges()
        self._closed = threading.Event()

    # --- bookkeeping ------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        """Samples of the order not yet delivered (0: the last one has been)."""
        return len(self.order) - self._cursor - len(self._done)

    def new_swaps(self) -> tuple[tuple[int, int], ...]:
        """The `swaps` made since the last call (a batch's, as its worker sends them)."""
        new, self._sent = tuple(self.swaps[self._sent :]), len(self.swaps)
        return new

    def state(self) -> StreamState:
        """The position to resume from: exactly the positions delivered so far are skipped."""
        return StreamState(self._cursor, tuple(sorted(self._done)))

    def _submit(
        self, entry: Entry[T], pos: int, fn: Callable[[int], T], pool: Executor
    ) -> Future[T]:
        sample = int(self.order[pos])

        def timed() -> T:
            # Latency counts from the moment a thread starts the read, not from the queue.
            started = time.monotonic()
            if entry.running_since is None:
                entry.running_since = started
            try:
                return fn(sample)
            finally:
                self.tracker.observe(time.monotonic() - started)

        return entry.watch(pool.submit(timed))

    def _fill(self) -> None:
        p = self.prefetch
        # The window spans positions [cursor, cursor + window): a stuck sample holds the span,
        # so it is overtaken by at most window - 1 others before the stream waits for it.
        end = min(len(self.order), self._cursor + p.window)
        while self._next < end:
            if self._window and self._inflight_bytes >= p.window_bytes:
                break
            pos = self._next
            self._next += 1
            if pos in self._done:
                continue
            sample = int(self.order[pos])
            nbytes = self._size_of(sample)
            entry: Entry[T] = Entry(nbytes)
            if self._local is not None and self._local(sample):
                if self._read_local is not None:
                    entry.pending = True  # read when taken, with its run
                else:
                    self._read_inline(entry, sample)
            else:
                entry.primary = self._submit(entry, pos, self._read, self._pool)
            self._window[pos] = entry
            self._inflight_bytes += nbytes

    def _read_inline(self, entry: Entry[T], sample: int) -> None:
        """Read a local sample here; a failure is kept for its delivery, as a thread's is."""
        entry.running_since = entry.submitted
        try:
            entry.value, entry.inline = self._read(sample), True
            self.counters.inline += 1
        except Exception as exc:
            failed: Future[T] = Future()
            failed.set_exception(exc)
            entry.primary = failed

    def _settle(self, pos: int) -> None:
        """Read the pending local position ``pos`` together with the pending ones right after
        it. A sample no longer local when its turn comes (its copy evicted meanwhile) goes to
        a reader thread and the guard like any other read, and ends the run."""
        assert self._local is not None and self._read_local is not None  # pending needs both
        run: list[Entry[T]] = []
        samples: list[int] = []
        while (entry := self._window.get(pos + len(run))) is not None and entry.pending:
            entry.pending = False
            sample = int(self.order[pos + len(run)])
            if not self._local(sample):
                entry.submitted = time.monotonic()
                entry.primary = self._submit(entry, pos + len(run), self._read, self._pool)
                break
            run.append(entry)
            samples.append(sample)
        if not run:
            return
        try:
            values = self._read_local(samples)
        except Exception:
            for entry, sample in zip(run, samples, strict=True):
                self._read_inline(entry, sample)  # each alone: an error at its own position
            return
        now = time.monotonic()
        for entry, value in zip(run, values, strict=True):
            entry.value, entry.inline, entry.running_since = value, True, now
        self.counters.inline += len(run)

    def _take(self, pos: int) -> tuple[int, T]:
        if pos != self._cursor:
            self.swaps.append((self.counters.delivered, pos))
        entry = self._window.pop(pos)
        self._due.pop(pos, None)
        self._inflight_bytes -= entry.nbytes
        self._done.add(pos)
        while self._cursor in self._done:
            self._done.discard(self._cursor)
            self._cursor += 1
        value = self._result(entry)
        self.counters.delivered += 1
        if pos in self._deferred:
            self._deferred.discard(pos)
            self.counters.deferred += 1
        return int(self.order[pos]), value

    def _result(self, entry: Entry[T]) -> T:
        if entry.inline:
            return entry.value  # type: ignore[return-value]  # set with inline
        ok = [f for f in entry.futures() if f.done() and f.exception() is None]
        if ok:
            if ok[0] is entry.hedge or (entry.hedge is not None and entry.primary not in ok):
                self.counters.hedge_wins += 1
            return ok[0].result()
        return entry.primary.result()  # both failed: raise the primary read's error

    # --- waiting ------------------------------------------------------------------------

    def _hedge_late(self, now: float) -> None:
        """Issue a second read for reads that have been running longer than hedge_after."""
        after = self.tracker.hedge_after()
        if after is None or self._hedge is None or self._hedge_pool is None:
            return
        for pos, entry in self._window.items():
            since = entry.running_since  # the clock first: most reads are young, a done() locks
            if since is None or now - since <= after or entry.hedge is not None:
                continue
            if not entry.landed and not entry.primary.done():
                entry.hedge = self._submit(entry, pos, self._hedge, self._hedge_pool)
                self.counters.hedges += 1

    def _check_stuck(self, head: int, now: float) -> None:
        entry = self._window[head]
        if now - entry.submitted > self.deadline.hard_timeout_s:
            raise StuckReadError(
                f"{self._describe(int(self.order[head]))}: read not done after "
                f"{self.deadline.hard_timeout_s:.0f} s (hard timeout); the storage holding it "
                "hangs - check it, or raise the hard timeout"
            )

    def _wait(self, entries: list[Entry[T]], timeout: float) -> None:
        futures = [f for e in entries for f in e.futures()]
        wait(futures, timeout=max(0.0, timeout), return_when=FIRST_COMPLETED)

    def _overtaken(self, entry: Entry[T], now: float) -> bool:
        """Whether the sample due (``entry``) is late before its deadline: it has run longer
        than most reads (the tracked quantile; a read a little slower than the others is
        waited for) and `overtaken_share` of the reads ahead are ready, or it is all the
        window holds (the batch waits on it alone: `hedge_blocked`)."""
        typical = self.tracker.typical()
        if typical is None or now - (entry.running_since or entry.submitted) < typical:
            return False
        alone = len(self._window) == 1 and self.deadline.hedge_blocked
        return alone or overtaken(self._window.values(), self.deadline.overtaken_share)

    def _next_ready(self) -> int | None:
        for pos in sorted(self._window):
            entry = self._window[pos]
            if entry.pending:
                self._settle(pos)
            if entry.done():
                return pos
        return None

    def _pick(self) -> int:
        """The position to deliver next: the head if in time, else the oldest ready one."""
        # The window holds exactly the positions of [cursor, next) not yet delivered, and the
        # cursor is never a delivered one: the head is the cursor (no scan of the window).
        head = self._cursor
        if self._replay is not None:
            head = replayed_position(self._replay, self.counters.delivered, head, self._window)
        entry = self._window[head]
        if entry.pending:
            self._settle(head)
        if entry.done():
            return head  # in time (the common case): no deadline to work out
        # A deadline counts from the read's start (or now, if queued) and is set once: a head
        # declared late is not waited on again while younger samples are ready.
        if head not in self._due:
            since = entry.running_since
            self._due[head] = (
                time.monotonic() if since is None else since
            ) + self.tracker.deadline()
        if not self.deadline.enabled or self._replay is not None:  # an order given: wait
            while not entry.done():
                now = time.monotonic()
                self._check_stuck(head, now)
                self._hedge_late(now)
                if now >= self._due[head]:
                    self._hedge_blocked(head, entry)  # past its deadline, it holds the batch
                self._wait([entry], _POLL_S * 20)
            return head
        return head if self._in_time(head, entry) else self._instead(head, entry)

    def _in_time(self, head: int, entry: Entry[T]) -> bool:
        """Wait for the head until its deadline, or until the reads ahead overtook it."""
        due = self._due[head]
        while not entry.done():
            now = time.monotonic()
            self._hedge_late(now)
            if now >= due or self._overtaken(entry, now):
                break
            # Overtaking: the reads ahead counted every `_POLL_S` (not a wait on them all).
            poll = _POLL_S if self.deadline.overtaken_share is not None else _POLL_S * 20
            self._wait([entry], min(due - now, poll))
        return entry.done()

    def _instead(self, head: int, entry: Entry[T]) -> int:
        """The late head's replacement: the oldest ready read; while none is, the head is
        hedged (the batch waits on it alone) and the first read to land is taken."""
        self.counters.late += 1
        while True:
            ready = self._next_ready()
            if ready is not None:
                if ready != head:
                    self._deferred.add(head)
                return ready
            now = time.monotonic()
            self._check_stuck(head, now)
            self._hedge_late(now)
            self._hedge_blocked(head, entry)
            self._wait(list(self._window.values()), _POLL_S * 20)

    def _hedge_blocked(self, pos: int, entry: Entry[T]) -> None:
        """Read the sample the batch waits on alone a second way, once (`hedge_blocked`)."""
        pool, read = self._hedge_pool, self._hedge
        if entry.hedge is None and self.deadline.hedge_blocked and pool and read:
            entry.hedge = self._submit(entry, pos, read, pool)
            self.counters.hedges += 1

    # --- iteration ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the window's reads now, before iteration (the next epoch's, say)."""
        self._fill()

    def __iter__(self) -> Iterator[tuple[int, T]]:
        try:
            self._fill()
            while self._window:
                asked = time.monotonic()
                pos = self._pick()
                self.counters.waits.append(time.monotonic() - asked)
                item = self._take(pos)
                self._fill()
                yield item
        finally:
            self._cancel_pending()

    def _cancel_pending(self) -> None:
        for f in [f for entry in self._window.values() for f in entry.futures()]:
            f.cancel()

    def close(self) -> None:
        """Cancel reads not started and shut the owned pool down (joins its threads)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._cancel_pending()
        if self._own_pool:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._own_hedge_pool and self._hedge_pool is not None:
            self._hedge_pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> GuardedStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
