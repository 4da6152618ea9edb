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
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tierfeed.config import default_cache_dir
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.publish import publish

__all__ = ["STAMP_ABOVE_BYTES", "has_stamp", "stamp"]

# Indexes whose sections total more than this are stamped (smaller ones check in < ~15 ms).
STAMP_ABOVE_BYTES = 16 * 2**20


def _identity(st: os.stat_result, header_checksum: int) -> dict[str, int]:
    return {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "header_checksum": header_checksum,
    }


def _stamp_path(path: Path, st: os.stat_result) -> Path:
    name = checksum_bytes(f"{path}\0{st.st_dev}\0{st.st_ino}".encode())
    return default_cache_dir() / "checked" / f"{name:016x}.json"


def has_stamp(path: Path, st: os.stat_result, header_checksum: int) -> bool:
    """Whether index ``path`` (``st``: the fstat of the descriptor that was mapped) was
    checked in full since it last changed."""
    where = _stamp_path(path, st)
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
    where = _stamp_path(path, st)
    try:
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        publish(where, json.dumps(_identity(st, header_checksum)).encode(), 0o600, fsync=False)
    except OSError:
        return
