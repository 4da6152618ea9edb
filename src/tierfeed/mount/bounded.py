"""Member loads of the mount with a hard bound: a FUSE read answers within ``timeout_s``
whatever the store below does (a tier's copy in flight, a file system's read blocked in the
kernel, an object store's retries), as the loader's guard bounds a sample's read."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from tierfeed.errors import StorageError

__all__ = ["BoundedLoads", "LoadTimeoutError"]


class LoadTimeoutError(StorageError):
    """A member's load did not finish within the mount's timeout."""


class _Job:
    def __init__(self, member: int) -> None:
        self.member = member
        self.done = threading.Event()
        self.data = b""
        self.error: BaseException | None = None
        self.abandoned = False  # the caller stopped waiting: a late result goes to ``late``


class BoundedLoads:
    """Runs ``load(member)`` on a few daemon threads of its own and waits at most
    ``timeout_s`` for it. A load that ends after its caller gave up hands its bytes to
    ``late`` (the verified-member cache keeps them for the next read). Loads stuck for good
    hold their thread (no thread can be taken back from a read blocked in the kernel); when
    every thread is held, later loads wait in the queue and time out like a stuck one.

    Args:
        load: reads and checks one member.
        timeout_s: seconds a caller waits.
        late: takes (member, bytes) of a load that succeeded after its caller gave up.
        threads: loads at once.
    """

    def __init__(
        self,
        load: Callable[[int], bytes],
        timeout_s: float,
        late: Callable[[int, bytes], None],
        threads: int = 16,
    ) -> None:
        self._load, self.timeout_s, self._late = load, timeout_s, late
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._limit = threads
        self._outstanding = 0  # loads queued or running
        self._mutex = threading.Lock()
        self._closed = False

    def __call__(self, member: int) -> bytes:
        """The checked bytes of ``member``; raises what ``load`` raised, or LoadTimeoutError."""
        job = _Job(member)
        self._submit(job)
        if not job.done.wait(self.timeout_s):
            with self._mutex:
                job.abandoned = not job.done.is_set()
            if job.abandoned:
                raise LoadTimeoutError(
                    f"no answer from the store within {self.timeout_s:g} s (the mount's "
                    "--timeout); the store hangs or is very slow: check it, or raise --timeout"
                )
        if job.error is not None:
            raise job.error
        return job.data

    def _submit(self, job: _Job) -> None:
        with self._mutex:
            if self._closed:
                raise StorageError("the mount is closing")
            self._outstanding += 1
            if self._outstanding > len(self._threads) and len(self._threads) < self._limit:
                thread = threading.Thread(
                    target=self._work,
                    name=f"tierfeed-mount-load-{len(self._threads)}",
                    daemon=True,  # one stuck in the kernel must not hold the process at exit
                )
                self._threads.append(thread)
                thread.start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job.data = self._load(job.member)
            except BaseException as exc:  # handed to the caller, raised there
                job.error = exc
            with self._mutex:
                job.done.set()
                late = job.abandoned and job.error is None
                self._outstanding -= 1
            if late:
                self._late(job.member, job.data)

    def close(self) -> None:
        """Stop the threads once their loads end (waits for none: a load may be stuck)."""
        with self._mutex:
            self._closed = True
            threads = len(self._threads)
        for _ in range(threads):
            self._jobs.put(None)
