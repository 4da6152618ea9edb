"""Background copies: a bounded queue of chunks, the set in flight, and the threads that copy.

A copy is a plain job, a chunk id: the `Filler` queues it here, and a copy thread runs it with
the function the copier was given (`tierfeed.storage.placing.Copies.copy`), which calls back
into neither. The copier only decides when a copy runs and on which thread. A chunk is queued
once while in flight; a full queue refuses (the caller has served its read already and a
later miss asks again). A copy that raises is reported to ``failed`` and its thread goes on
with the next one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from tierfeed.errors import StorageError

__all__ = ["Copier"]

_log = logging.getLogger("tierfeed.tiers")


def _log_failure(chunk: int, exc: Exception) -> None:
    _log.warning("copy of chunk %d failed: %r", chunk, exc)


class Copier:
    """Runs ``copy(chunk)`` on named background threads, once per chunk in flight.

    Args:
        copy: copies one chunk; any exception it raises goes to ``failed``.
        threads: copy threads, named ``{name}-0``, ``{name}-1``, ...
        queue_size: the most chunks waiting; `schedule` refuses further ones.
        name: prefix of the threads' names.
        failed: told of every copy that raised (count it, log it); must not raise.
        urgent_threads: the most urgent copies started beside the ``threads`` when all of
            them are busy, each on a thread of its own that ends with it (0: an urgent copy
            waits for a free thread, at the head of the queue).
    """

    def __init__(
        self,
        copy: Callable[[int], None],
        threads: int,
        queue_size: int,
        name: str = "tierfeed-copy",
        *,
        failed: Callable[[int, Exception], None] = _log_failure,
        urgent_threads: int = 0,
    ) -> None:
        self._copy = copy
        self._name = name
        self._urgent_threads = urgent_threads
        self._extra: list[threading.Thread] = []  # urgent copies' own threads, while they run
        self._failed = failed
        self._lock = threading.Lock()  # guards the in-flight, running and urgent sets
        self._inflight: set[int] = set()  # queued or running
        self._running: set[int] = set()
        self._urgent: set[int] = set()  # queued ahead of the others
        self._order = itertools.count()  # first come, first copied, within a priority
        self._queue: queue.PriorityQueue[tuple[int, int, int]] = queue.PriorityQueue(queue_size)
        self._closed = False
        self._started = False
        # Started with the first copy: a stack opened before a fork runs no thread across it.
        self.threads = [
            threading.Thread(target=self._worker, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]

    @property
    def closed(self) -> bool:
        """Whether `close` was called: `schedule` refuses from then on."""
        return self._closed

    @property
    def inflight(self) -> int:
        """How many chunks are queued or being copied."""
        with self._lock:
            return len(self._inflight)

    def pending(self, chunk: int) -> bool:
        """Whether ``chunk`` is queued or being copied."""
        with self._lock:
            return chunk in self._inflight

    def schedule(self, chunk: int, urgent: bool = False) -> bool:
        """Queue a copy of ``chunk``; False if it is in flight, the queue is full, or the
        copier is closed. An ``urgent`` copy (a read waits for it) goes ahead of the others,
        and moves a queued copy of the chunk ahead (then True). Whether the chunk is wanted
        is the caller's to ask first (and the copy's own to ask again when it runs)."""
        if self._closed:
            return False
        with self._lock:
            again = chunk in self._inflight
            if again and (not urgent or chunk in self._running or chunk in self._urgent):
                return False
            self._inflight.add(chunk)
            if urgent:
                self._urgent.add(chunk)
        try:
            if urgent and self._start_beside(chunk):
                return True
            self._queue.put_nowait((0 if urgent else 1, next(self._order), chunk))
            self._start_threads()
        except queue.Full:
            if not again:
                self._done(chunk)
            return False
        except BaseException:
            self._done(chunk)
            raise
        return True

    def _start_threads(self) -> None:
        """Start the copy threads, once (with the first copy queued)."""
        with self._lock:  # held while they start: `close` joins them only once started
            if self._started or self._closed:
                return
            self._started = True
            for t in self.threads:
                t.start()

    def _start_beside(self, chunk: int) -> bool:
        """Run an urgent copy at once on a thread of its own when every copy thread is busy
        and fewer than ``urgent_threads`` such copies run (a queued twin is then skipped).
        A read waits for it: behind copies of whole chunks it waited their time (a global
        shuffle's first batches ask for every chunk at once), and gave up for the origin."""
        with self._lock:
            if chunk in self._running:  # a thread took its queued twin meanwhile: begun
                return True
            self._extra = [t for t in self._extra if t.is_alive()]
            busy = len(self._running) - len(self._extra)
            if self._closed or busy < len(self.threads) or len(self._extra) >= self._urgent_threads:
                return False
            self._running.add(chunk)
            thread = threading.Thread(
                target=self._run, args=(chunk,), name=f"{self._name}-urgent", daemon=True
            )
            self._extra.append(thread)
        thread.start()
        return True

    def _run(self, chunk: int) -> None:
        try:
            self._copy(chunk)
        except Exception as exc:  # the read path still serves from the origin
            try:
                self._failed(chunk, exc)
            except Exception:
                _log.exception("reporting a failed copy of chunk %d failed", chunk)
        finally:
            self._done(chunk)

    def _done(self, chunk: int) -> None:
        with self._lock:
            self._inflight.discard(chunk)
            self._running.discard(chunk)
            self._urgent.discard(chunk)

    def _worker(self) -> None:
        while True:
            _, _, chunk = self._queue.get()
            if chunk < 0:
                return
            with self._lock:
                if chunk in self._running or chunk not in self._inflight:
                    continue  # the queued twin of a copy moved ahead: it ran already
                self._running.add(chunk)
            self._run(chunk)

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until queued copies are done, at most ``timeout`` seconds; returns at once when
        closed.

        Raises:
            StorageError: copies are still running after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._inflight or self._closed:
                    return
            time.sleep(0.005)
        raise StorageError(f"tier copies still running after {timeout} s")

    def close(self, wait_s: float | None = None) -> None:
        """Drop the queued copies, let the running ones finish, and join the threads, for at
        most ``wait_s`` seconds (None: as long as they take); idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(queue.Empty):  # queued copies are dropped, not waited for
            while True:
                _, _, dropped = self._queue.get_nowait()
                with self._lock:
                    if dropped not in self._running:
                        self._inflight.discard(dropped)
        with self._lock:
            started = self._started
            self._started = True  # no thread starts from now on
        threads = self.threads if started else []
        for _ in threads:
            self._queue.put((2, next(self._order), -1))  # after anything queued meanwhile
        self.join(wait_s)

    def join(self, wait_s: float | None = None) -> None:
        """Wait for the copy threads to end, at most ``wait_s`` seconds in all."""
        with self._lock:
            threads = [t for t in [*self.threads, *self._extra] if t.ident is not None]
        until = None if wait_s is None else time.monotonic() + wait_s
        for t in threads:
            t.join(None if until is None else max(0.0, until - time.monotonic()))

    def __enter__(self) -> Copier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
