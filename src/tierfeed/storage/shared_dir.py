"""A disk tier that several processes fill: its placement lock, verification marks and copy claims.

DataLoader workers (and every rank of a node) share one cache directory. Three small files
kept beside the cached chunks let them cooperate without a server:

- ``.tier.lock``: held (flock) while a process decides what to evict and writes a chunk
  (where the tier has room for the whole store nothing is decided: `Holdings.host_lock`);
- ``.verified/KEY``: the (inode, mtime, size) the file at ``KEY`` had when a process checked
  it, so forked workers do not re-read a whole chunk to verify it again;
- ``.claims/KEY``: held (flock) by the one process copying that chunk from the origin, so the
  others take it from the directory once it lands instead of reading the origin again.

Locks are released by the kernel when their process dies: a killed process leaves no lock
or claim that blocks the others. A lock belongs to the open file, which a process forked while
it is held shares: so each is let go explicitly (``LOCK_UN``) before its descriptor is closed,
never by the close alone, or a worker forked at that moment would hold it for as long as it
lives. And the placement lock is waited for at most `LOCK_WAIT_S`: past that the copy is not
placed (the read is served all the same), never waited out without a bound.

``root`` is a descriptor of the checked directory (`tierfeed.cachedir`: every name below it
is opened relative to it, never through a link) or, for tests and tools, its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from tierfeed.cachedir import let_go, lock_within, open_subdir
from tierfeed.publish import publish

__all__ = ["LOCK_WAIT_S", "Root", "copy_claim", "mark", "marked", "placement_lock", "unmark"]

# The longest a process waits for another's placement (an eviction and one chunk's write).
LOCK_WAIT_S = 30.0

_LOCK = ".tier.lock"
_MARKS = ".verified"
_CLAIMS = ".claims"

Root = Path | int  # a directory descriptor, or a path
_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW


def _at(root: Root, name: str) -> tuple[str, int | None]:
    """``name`` in ``root``: (path, dir_fd) for `os.open` and friends."""
    return (name, root) if isinstance(root, int) else (os.path.join(root, name), None)


@contextlib.contextmanager
def _folder(root: Root, name: str, create: bool = False) -> Iterator[tuple[str, int | None]]:
    """The folder ``name`` of ``root`` (made 0700 if ``create``) as (path, dir_fd) of its
    files' parent: below a descriptor, the folder's own descriptor, opened without following
    a link and refused if another user made it (`tierfeed.cachedir.open_subdir`).

    Raises:
        OSError: the folder cannot be made or opened.
    """
    if not isinstance(root, int):
        folder = os.path.join(root, name)
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
        yield folder, None
        return
    fd = open_subdir(root, name, 0o700, create)
    try:
        yield "", fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def placement_lock(root: Root, wait_s: float | None = None) -> Iterator[None]:
    """Serialise placement decisions (evict, then write) on ``root`` across processes.

    Raises:
        TimeoutError: another process held the lock for ``wait_s`` seconds (default
            `LOCK_WAIT_S`); an `OSError`, as a full disk is: the caller leaves this copy
            unplaced.
    """
    path, at = _at(root, _LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o600, dir_fd=at)
    try:
        wait_s = LOCK_WAIT_S if wait_s is None else wait_s
        if not lock_within(fd, wait_s):
            raise TimeoutError(
                f"{path}: another process held the cache's placement lock for {wait_s:g} s;"
                " this chunk is not cached by this process"
            )
        yield
    finally:
        let_go(fd)


@contextlib.contextmanager
def copy_claim(root: Root, key: str) -> Iterator[bool]:
    """Claim the copy of ``key`` into ``root``: yields True for the one process that holds the
    claim, False while another does (without waiting for it).

    The claim file is removed while still locked. A process that opened it just before may
    then lock the removed file and also see True, but by then the chunk is in the directory
    (the holder wrote it before letting go), which the caller checks after claiming.
    """
    with contextlib.ExitStack() as stack:
        try:
            folder, at = stack.enter_context(_folder(root, _CLAIMS, create=True))
            path = os.path.join(folder, key)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o600, dir_fd=at)
        except OSError:
            fd = -1  # no claims possible here (read-only or full): copy as before
        if fd < 0:
            yield True
            return
        stack.callback(let_go, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path, dir_fd=at)


def _fingerprint(root: Root, key: str, fd: int | None = None) -> str | None:
    path, at = _at(root, key)
    try:
        st = os.stat(path, dir_fd=at, follow_symlinks=False) if fd is None else os.fstat(fd)
    except OSError:
        return None
    return f"{st.st_ino} {st.st_mtime_ns} {st.st_size}"


def marked(root: Root, key: str) -> bool:
    """Was this very file (same inode, mtime and size) verified by some process already?"""
    try:
        with _folder(root, _MARKS) as (folder, at):
            fd = os.open(os.path.join(folder, key), os.O_RDONLY | _FLAGS, dir_fd=at)
            try:
                recorded = os.read(fd, 256).decode(errors="replace")
            finally:
                os.close(fd)
    except OSError:
        return False
    return recorded == _fingerprint(root, key)


def mark(root: Root, key: str, fd: int | None = None) -> None:
    """Record that the file now at ``key`` is whole and verified (atomically; best effort);
    or, with ``fd``, the file open as ``fd``, about to be linked in at ``key`` (a link keeps
    its inode, mtime and size): marked before it appears there, no reader finds it unmarked
    and checks it again. A mark of a file that never arrives matches no file at ``key``."""
    fingerprint = _fingerprint(root, key, fd)
    if fingerprint is None:
        return
    with contextlib.suppress(OSError), _folder(root, _MARKS, create=True) as (folder, at):
        # A lost mark costs a re-check.
        publish(os.path.join(folder, key), fingerprint.encode(), fsync=False, dir_fd=at)


def unmark(root: Root, key: str) -> None:
    """Forget the mark of an evicted entry (a later file there is checked anew anyway)."""
    with contextlib.suppress(OSError), _folder(root, _MARKS) as (folder, at):
        os.unlink(os.path.join(folder, key), dir_fd=at)
