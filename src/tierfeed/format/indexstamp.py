"""Stamps of index files checked in full, so that opening one again on this host is O(1).

Opening an index checks every invariant readers rely on (`indexcheck.check_invariants`):
O(samples), ~10 ms per million on 2 cores. Every DataLoader worker and every rank opens the
index, so a large one would be checked again and again. Once a large index has passed, a
stamp in the user's cache directory records the file's identity: device, inode, size, mtime
and ctime (any write to the file changes its ctime, which no user can set) and its header
checksum.
An open that finds a stamp matching the file it mapped skips the O(N) checks; any other open
runs them. A stamp is trusted only if this user owns it and nobody else may write it. File
times tick with the kernel's coarse clock (a few ms); only indexes whose checks take longer
than that are stamped, so a change after a stamp always moves the ctime.
`tierfeed verify` never trusts stamps: bit rot changes no ctime.

Every rank of a node opens the index at the same moment when a job starts: `one_checker` lets
one of this user's processes check an unstamped index while the others wait for its stamp
(a lock that the kernel lets go if the checker dies), instead of every rank checking at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from tierfeed.cachedir import private_dir
from tierfeed.config import default_cache_dir
from tierfeed.errors import TierfeedError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.publish import publish

__all__ = ["CHECKER_WAIT_S", "STAMP_ABOVE_BYTES", "has_stamp", "one_checker", "stamp"]

# Indexes whose sections total more than this are stamped (smaller ones check in < ~15 ms).
STAMP_ABOVE_BYTES = 16 * 2**20
# How long a process waits for another one's check of the same index before checking itself
# (the checks take ~10 s per billion samples and core; a checker stuck on its storage is not
# waited for forever).
CHECKER_WAIT_S = 600.0


def _identity(st: os.stat_result, header_checksum: int) -> dict[str, int]:
    return {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "header_checksum": header_checksum,
    }


def _stamps(folder: str) -> Path | None:
    """This user's ``folder`` of stamps or locks, created 0700 and checked with the cache
    directory above it (`tierfeed.cachedir`); None where there is none to trust (unusable or
    another user's): stamps only save time, so the checks then simply run."""
    try:
        return private_dir(default_cache_dir() / folder)
    except TierfeedError:
        return None


def _stamp_name(path: Path, st: os.stat_result) -> str:
    name = checksum_bytes(f"{path}\0{st.st_dev}\0{st.st_ino}".encode())
    return f"{name:016x}"


def has_stamp(path: Path, st: os.stat_result, header_checksum: int) -> bool:
    """Whether index ``path`` (``st``: the fstat of the descriptor that was mapped) was
    checked in full since it last changed."""
    folder = _stamps("checked")
    if folder is None:
        return False
    where = folder / f"{_stamp_name(path, st)}.json"
    try:
        fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        own = os.fstat(fd)
        if own.st_uid != os.geteuid() or own.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        data = os.read(fd, 4096)
    except OSError:
        return False
    finally:
        os.close(fd)
    try:
        return bool(json.loads(data) == _identity(st, header_checksum))
    except ValueError:
        return False


def stamp(path: Path, st: os.stat_result, header_checksum: int) -> None:
    """Record that index ``path`` passed every check; a cache directory that cannot be
    written only means the next open checks again."""
    folder = _stamps("checked")
    if folder is None:
        return
    where = folder / f"{_stamp_name(path, st)}.json"
    try:
        publish(where, json.dumps(_identity(st, header_checksum)).encode(), 0o600, fsync=False)
    except OSError:
        return


@contextlib.contextmanager
def one_checker(path: Path, st: os.stat_result, wait_s: float | None = None) -> Iterator[None]:
    """Hold this user's right to check index ``path`` on this host, waiting (at most
    ``wait_s``, default `CHECKER_WAIT_S`) while another process holds it. The caller then looks
    for a stamp again before checking. A lock that cannot be made (no cache directory) or is
    held past the bound lets the caller check on its own: never worse than without it."""
    folder = _stamps("checking")
    if folder is None:
        yield
        return
    where = folder / f"{_stamp_name(path, st)}.lock"
    try:
        fd = os.open(where, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + (CHECKER_WAIT_S if wait_s is None else wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # lets the lock go
