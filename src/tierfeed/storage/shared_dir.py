"""A disk tier that several processes fill: its placement lock, verification marks and copy claims.

DataLoader workers (and every rank of a node) share one cache directory. Three small files
kept beside the cached chunks let them cooperate without a server:

- ``.tier.lock``: held (flock) while a process decides what to evict and writes a chunk;
- ``.verified/KEY``: the (inode, mtime, size) the file at ``KEY`` had when a process checked
  it, so forked workers do not re-read a whole chunk to verify it again;
- ``.claims/KEY``: held (flock) by the one process copying that chunk from the origin, so the
  others take it from the directory once it lands instead of reading the origin again.

Locks are released by the kernel when their process dies: a killed process leaves no lock
or claim that blocks the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from tierfeed.publish import publish

__all__ = ["copy_claim", "mark", "marked", "placement_lock", "unmark"]

_LOCK = ".tier.lock"
_MARKS = ".verified"
_CLAIMS = ".claims"


@contextlib.contextmanager
def placement_lock(root: Path) -> Iterator[None]:
    """Serialise placement decisions (evict, then write) on ``root`` across processes."""
    fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def copy_claim(root: Path, key: str) -> Iterator[bool]:
    """Claim the copy of ``key`` into ``root``: yields True for the one process that holds the
    claim, False while another does (without waiting for it).

    The claim file is removed while still locked. A process that opened it just before may
    then lock the removed file and also see True, but by then the chunk is in the directory
    (the holder wrote it before letting go), which the caller checks after claiming.
    """
    claims = root / _CLAIMS
    path = claims / key
    try:
        claims.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        yield True  # no claims possible here (read-only or full): copy as before
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
    finally:
        os.close(fd)


def _fingerprint(root: Path, key: str, fd: int | None = None) -> str | None:
    try:
        st = os.stat(root / key) if fd is None else os.fstat(fd)
    except OSError:
        return None
    return f"{st.st_ino} {st.st_mtime_ns} {st.st_size}"


def marked(root: Path, key: str) -> bool:
    """Was this very file (same inode, mtime and size) verified by some process already?"""
    try:
        recorded = (root / _MARKS / key).read_text()
    except OSError:
        return False
    return recorded == _fingerprint(root, key)


def mark(root: Path, key: str, fd: int | None = None) -> None:
    """Record that the file now at ``key`` is whole and verified (atomically; best effort);
    or, with ``fd``, the file open as ``fd``, about to be linked in at ``key`` (a link keeps
    its inode, mtime and size): marked before it appears there, no reader finds it unmarked
    and checks it again. A mark of a file that never arrives matches no file at ``key``."""
    fingerprint = _fingerprint(root, key, fd)
    if fingerprint is None:
        return
    marks = root / _MARKS
    with contextlib.suppress(OSError):
        marks.mkdir(mode=0o700, exist_ok=True)
        publish(marks / key, fingerprint.encode(), fsync=False)  # a lost mark costs a re-check


def unmark(root: Path, key: str) -> None:
    """Forget the mark of an evicted entry (a later file there is checked anew anyway)."""
    with contextlib.suppress(OSError):
        (root / _MARKS / key).unlink()
