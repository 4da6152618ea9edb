"""Hedges: second requests for late reads, on one pool of threads per process.

A hedge is a second request for a read that runs late, made on threads of their own so that it
does not queue behind the requests it hedges. tierfeed hedges at two levels: a sample read
that misses its deadline (`tierfeed.loader.stream`: the second read goes another way to the
sample) and a piece of a chunk copy that stalls (`tierfeed.storage.piecefetch`: the second
request goes to the origin through a way of its own). Both submit to the process's one pool
through a `Hedges`, which keeps its own requests: closing it cancels those still queued and
waits a bounded time for those running (a hedge stuck in the kernel is left to its thread).

Where no guard stands over a read (the index a process opens before its first batch),
`first_to_end` makes the call again beside itself when it hangs: a mount that never answers
one request holds the thread that made it in the kernel, where no timeout reaches it, while a
second request of the same bytes is answered at once (NFS, a FUSE server, a Lustre OST now
and then).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_for
from typing import Any, Generic, TypeVar

from tierfeed.daemonpool import DaemonPool
from tierfeed.errors import StuckReadError

__all__ = ["HEDGE_THREADS", "Hedges", "first_to_end"]

HEDGE_THREADS = 4  # at most this many hedges run at once in a process, both levels together
CLOSE_WAIT_S = 1.0  # closing an owner waits this long for its hedges running

T = TypeVar("T")

_pool: DaemonPool | None = None
_pool_lock = threading.Lock()


def _process_pool() -> DaemonPool:
    """The process's hedge threads, made on first use (a forked child makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = DaemonPool(HEDGE_THREADS, "tierfeed-hedge")
        return _pool


def _forget_pool() -> None:
    """After fork: the parent's threads are not in the child."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class Hedges(Executor):
    """One owner's hedges on the process's hedge threads (an `Executor`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mine: set[Future[Any]] = set()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a hedge thread.

        Raises:
            RuntimeError: after `close`.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot hedge after close")
            future = _process_pool().submit(fn, *args, **kwargs)
            self._mine.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._mine.discard(future)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more hedges; cancel the queued ones (``cancel_futures``) and wait for the rest
        (``wait``), at most `CLOSE_WAIT_S`: a hedge the origin holds (a hung mount) is left
        to its thread, its result unread. The process's threads stay for other owners."""
        with self._lock:
            self._closed = True
            mine = list(self._mine)
        if cancel_futures:
            for future in mine:
                future.cancel()
        if wait:
            wait_for(mine, timeout=CLOSE_WAIT_S)

    def close(self) -> None:
        """Cancel this owner's queued hedges and wait for its running ones; idempotent."""
        self.shutdown(wait=True, cancel_futures=True)


class _Race(Generic[T]):
    """The tries of one call, and what the first of them to end gave."""

    def __init__(self, discard: Callable[[T], None] | None) -> None:
        self.cond = threading.Condition()
        self.running = 0
        self.done = False
        self.result: T | None = None
        self.errors: list[BaseException] = []
        self._discard = discard

    def run(self, job: Callable[[int], T], attempt: int) -> None:
        try:
            result = job(attempt)
        except BaseException as exc:  # handed to the caller, if no other try answers
            with self.cond:
                self.running -= 1
                self.errors.append(exc)
                self.cond.notify_all()
            return
        with self.cond:
            self.running -= 1
            late = self.done
            if not late:
                self.done, self.result = True, result
                self.cond.notify_all()
        if late and self._discard is not None:
            self._discard(result)  # a later try's answer: nobody takes it


def first_to_end(
    job: Callable[[int], T],
    *,
    again_after_s: float,
    tries: int,
    bound_s: float,
    what: str,
    discard: Callable[[T], None] | None = None,
) -> T:
    """``job(attempt)`` (``attempt`` 0, 1, ...: a try after the first may read another way),
    made again on a thread of its own each time the latest try has run ``again_after_s``
    without ending, ``tries`` at most; the first try to return is the answer. A try that
    raises is an answer only when no other is running and no more may start: then the first
    error is raised.

    Raises:
        StuckReadError: no try ended within ``bound_s`` (``what`` names the call; a
            `TimeoutError`).
    """
    race: _Race[T] = _Race(discard)
    started = last = time.monotonic()
    attempt = 0
    with race.cond:
        while True:
            now = time.monotonic()
            if attempt == 0 or (attempt < tries and now - last >= again_after_s):
                race.running += 1
                thread = threading.Thread(
                    target=race.run, args=(job, attempt), name="tierfeed-again", daemon=True
                )
                thread.start()
                attempt, last = attempt + 1, now
            if race.done:
                return race.result  # type: ignore[return-value]
            if race.running == 0:  # every try raised (an error is an answer, not a hang)
                raise race.errors[0]
            if now - started >= bound_s:
                raise StuckReadError(
                    f"{what}: no answer in {bound_s:g} s ({attempt} tries at once); "
                    "the file system does not answer: check the mount"
                )
            wake = started + bound_s
            if attempt < tries:
                wake = min(wake, last + again_after_s)
            race.cond.wait(max(wake - now, 0.001))
