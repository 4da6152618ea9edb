"""Local files: the bounded descriptor cache and the path check.

Every POSIX byte path goes through here: `PosixDriver` reads with `FdCache` and
`tierfeed.pread`, and `DirectoryChunks` reads through a `PosixDriver`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence

from tierfeed.format.relpath import path_under, safe_chunk_path

__all__ = ["FdCache", "path_under", "safe_chunk_path"]

_STOP_POLL_S = 0.1  # how often a wait for another thread's open looks whether it was closed
_CLOSE_WAIT_S = 0.05  # `close` waits this long for an open ahead that is running
# An open of a file that has run this long is tried again by a thread waiting for it (a
# stalled lookup or open, which a second request of the same file often gets past), up to
# `_OPEN_TRIES` opens of one file at once.
_OPEN_AGAIN_S = 0.25
_OPEN_TRIES = 3


class _Opening:
    """An open of a file in progress: set when it ends; when it began; which try it is."""

    __slots__ = ("done", "started", "tries")

    def __init__(self, tries: int) -> None:
        self.done, self.started, self.tries = threading.Event(), time.monotonic(), tries


class _Fd:
    __slots__ = ("evicted", "fd", "refs")

    def __init__(self, fd: int) -> None:
        self.fd, self.refs, self.evicted = fd, 0, False


class FdCache:
    """Open file descriptors by path, at most ``max_open``, reference-counted.

    A descriptor is never closed while a thread reads through it, so its number cannot be
    reused under a reader. Opens happen outside the lock: an open that hangs on slow storage
    does not stall reads of files already open. Each path is opened by one thread at a time;
    others wanting it wait for that open, so the origin sees one open per file, not one per
    thread that raced for it; but an open that has hung for `_OPEN_AGAIN_S` is made again by
    one of them (a hedged open: the first to end is kept, the other closed), so that a stalled
    open holds the file's reads for a bounded time, not the reader threads for its own. With
    ``dir_fd`` (a checked cache directory), paths are relative to that descriptor and a link
    at their last component is not followed.
    """

    def __init__(
        self,
        max_open: int = 128,
        flags: int = os.O_RDONLY | os.O_CLOEXEC,
        dir_fd: int | None = None,
    ) -> None:
        self.max_open = max_open
        self.flags = flags | (os.O_NOFOLLOW if dir_fd is not None else 0)
        self.dir_fd = dir_fd
        self.opens = 0
        self._open: OrderedDict[str, _Fd] = OrderedDict()
        self._opening: dict[str, _Opening] = {}  # path -> its latest open in progress
        self._mutex = threading.Lock()
        self._ahead: threading.Thread | None = None  # opening ``_waiting``, while there are
        self._waiting: deque[str] = deque()
        self._stop = threading.Event()

    def open_ahead(self, paths: Sequence[str]) -> None:
        """Open ``paths`` in order on a background thread (after any still waiting), so that a
        lookup or open that hangs on slow storage is paid before a reader needs the file (the
        order is known from the plan). At most ``max_open`` of one call; errors are left for
        the reads to report."""
        with self._mutex:
            if self._stop.is_set():
                return
            self._waiting.extend(paths[: self.max_open])
            if self._ahead is None:
                self._ahead = threading.Thread(
                    target=self._open_waiting, name="tierfeed-open-ahead", daemon=True
                )
                self._ahead.start()

    def _open_waiting(self) -> None:
        while not self._stop.is_set():
            with self._mutex:
                if not self._waiting:
                    self._ahead = None  # the next open_ahead starts a thread anew
                    return
                path = self._waiting.popleft()
            with contextlib.suppress(OSError), self.fd(path):
                pass

    def _open_file(self, path: str) -> int:
        try:
            return os.open(path, self.flags, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self.flags & os.O_DIRECT:
                raise
            self.flags &= ~os.O_DIRECT  # no O_DIRECT on this file system
            return os.open(path, self.flags, dir_fd=self.dir_fd)

    @contextlib.contextmanager
    def fd(self, path: str) -> Iterator[int]:
        """A descriptor of ``path`` for the duration of the block (OSError if it won't open)."""
        entry = self.acquire(path)
        try:
            yield entry.fd
        finally:
            self.release(entry)

    def acquire(self, path: str) -> _Fd:
        """A descriptor entry of ``path``, held until `release` (OSError if it won't open)."""
        while True:
            with self._mutex:
                if self._stop.is_set():  # closed: no file is opened any more
                    raise OSError(errno.ECANCELED, "closed", path)
                entry = self._open.get(path)
                if entry is not None:
                    self._open.move_to_end(path)
                    entry.refs += 1
                    return entry
                opening = self._opening.get(path)
                if opening is None:
                    opening = self._opening[path] = _Opening(1)
                    break
            # Another thread opens it: look again once it is done (or failed); if it hangs,
            # open it again here.
            if self._await(path, opening):
                with self._mutex:
                    if self._opening.get(path) is opening and path not in self._open:
                        opening = self._opening[path] = _Opening(opening.tries + 1)
                        break
        try:
            fd = self._open_file(path)
        except BaseException:
            self._ended(path, opening)
            raise
        return self._opened(path, opening, fd)

    def _await(self, path: str, opening: _Opening) -> bool:
        """Wait for another thread's ``opening`` of ``path``; True when it has hung for
        `_OPEN_AGAIN_S` and this thread is to open the file too. A close ends the wait."""
        while not opening.done.wait(_STOP_POLL_S):
            if self._stop.is_set():
                raise OSError(errno.ECANCELED, "closed while another thread opened", path)
            with self._mutex:
                if self._opening.get(path) is not opening or path in self._open:
                    return False  # a second open took over, or one ended: look again
            hung = time.monotonic() - opening.started > _OPEN_AGAIN_S
            if hung and opening.tries < _OPEN_TRIES:
                return True
        return False

    def _ended(self, path: str, opening: _Opening) -> None:
        """``opening`` of ``path`` is over, whatever came of it."""
        with self._mutex:
            if self._opening.get(path) is opening:
                del self._opening[path]
        opening.done.set()

    def _opened(self, path: str, opening: _Opening, fd: int) -> _Fd:
        """Keep ``fd``, just opened, as ``path``'s descriptor, unless another open of it (a
        hedged one) ended first: then that one is used and ``fd`` closed."""
        try:
            with self._mutex:
                if self._stop.is_set():  # closed while this open hung: nobody is left to close it
                    os.close(fd)
                    raise OSError(errno.ECANCELED, "closed while this file opened", path)
                self.opens += 1
                entry = self._open.get(path)
                if entry is not None:  # the other open of it won
                    os.close(fd)
                else:
                    entry = self._open[path] = _Fd(fd)
                entry.refs += 1
                while len(self._open) > self.max_open:
                    _, old = self._open.popitem(last=False)
                    old.evicted = True
                    if old.refs == 0:
                        os.close(old.fd)
                return entry
        finally:
            self._ended(path, opening)

    def release(self, entry: _Fd) -> None:
        """Give back an entry from `acquire` (its descriptor closes if evicted meanwhile)."""
        with self._mutex:
            entry.refs -= 1
            if entry.evicted and entry.refs == 0:
                os.close(entry.fd)

    def forget(self, path: str) -> None:
        """Drop a cached descriptor (the file was deleted or replaced)."""
        with self._mutex:
            entry = self._open.pop(path, None)
            if entry is not None:
                entry.evicted = True
                if entry.refs == 0:
                    os.close(entry.fd)

    def close(self) -> None:
        """Stop opening ahead and close every descriptor not in use (those in use close on
        release). Waits at most `_CLOSE_WAIT_S` for an open ahead in progress: one the file
        system holds is left to its daemon thread, which closes what it opens late."""
        with self._mutex:
            self._stop.set()
            ahead = self._ahead
        if ahead is not None:
            ahead.join(_CLOSE_WAIT_S)
        with self._mutex:
            for entry in self._open.values():
                entry.evicted = True
                if entry.refs == 0:
                    os.close(entry.fd)
            self._open.clear()
