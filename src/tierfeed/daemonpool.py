"""A thread pool that never holds its process: for reads the kernel may keep for as long as a
hung file system likes.

`concurrent.futures.ThreadPoolExecutor` joins its threads in ``shutdown(wait=True)`` and again
when the interpreter exits. A thread blocked in an ``open`` or ``pread`` on a hung mount (NFS,
a FUSE server that never answers) then holds the owner's ``close()`` and the process's exit as
long as the kernel does: a DataLoader worker that raised `StuckReadError` cannot exit, and
PyTorch waits 5 s for each such worker before it kills it, so the error reaches the training
loop long after its bound. `DaemonPool` runs the same jobs on daemon threads that the
interpreter does not join, and its shutdown waits for running jobs at most ``join_s``
seconds; a job still running then is left to finish (or not) on its own thread, its result
unread. Use it only for jobs whose late completion harms nothing: reads whose bytes are
dropped, not writes that must land before the owner closes.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["DaemonPool"]

T = TypeVar("T")

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_Queued = tuple[float, int, _Job | None]  # (rank, order of submission, job; None: stop)


class DaemonPool(Executor):
    """Up to ``threads`` daemon threads named ``<name>_<n>``, started as jobs arrive.

    Args:
        threads: the most jobs that run at once.
        name: the threads' name prefix.
        join_s: how long `shutdown` (with ``wait``) waits for running jobs, all together.
        ranked: jobs start by the rank `submit_ranked` gives them (lowest first; equal ranks
            in order of submission): the pieces of many copies, the one needed soonest first.
            Otherwise in the order they were submitted (a plain FIFO, cheaper per job: the
            reader pools take a job a sample).
    """

    def __init__(self, threads: int, name: str, join_s: float = 0.5, ranked: bool = False) -> None:
        if threads < 1:
            raise ValueError(f"a pool needs at least 1 thread, got {threads}")
        self._most, self._name, self.join_s = threads, name, join_s
        self._jobs: queue.PriorityQueue[_Queued] | queue.SimpleQueue[_Queued] = (
            queue.PriorityQueue() if ranked else queue.SimpleQueue()
        )
        self._submitted = itertools.count()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a job
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a pool thread, after the jobs submitted before it.

        Raises:
            RuntimeError: after `shutdown`.
        """
        return self.submit_ranked(0.0, fn, *args, **kwargs)

    def submit_ranked(
        self, rank: float, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a pool thread, before the queued jobs of a higher
        ``rank`` (in a ``ranked`` pool; otherwise after the jobs submitted before it).

        Raises:
            RuntimeError: after `shutdown`.
        """
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new jobs after shutdown")
            self._jobs.put((rank, next(self._submitted), (future, fn, args, kwargs)))
            if self._idle == 0 and len(self._threads) < self._most:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle = max(0, self._idle - 1)  # that thread takes this job
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()[2]
            if job is None:
                self._stop()  # pass the stop on to the next thread
                return
            future, fn, args, kwargs = job
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del job, future, fn, args, kwargs  # drop references before blocking again
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more jobs; cancel the queued ones (``cancel_futures``); with ``wait``, wait up
        to ``join_s`` for the running ones. Idempotent."""
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    job = self._jobs.get_nowait()[2]
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        self._stop()
        if wait:
            until = time.monotonic() + self.join_s
            for thread in threads:
                thread.join(max(0.0, until - time.monotonic()))

    def _stop(self) -> None:
        """Queue the stop, after every job queued."""
        self._jobs.put((math.inf, next(self._submitted), None))

    def stuck(self) -> int:
        """Threads still running after `shutdown` (each in a job that has not returned)."""
        with self._lock:
            return sum(t.is_alive() for t in self._threads)
