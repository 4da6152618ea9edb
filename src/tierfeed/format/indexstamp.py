"""Stamps of index files checked in full, so that opening one again on this host is O(1).

Opening an index checks every invariant readers rely on (`indexcheck.check_invariants`):
O(samples) (docs/BENCHMARKS.md, "Larger: the index, one rank's plan and the fetch schedule at
scale", gives the time). Every DataLoader worker and every rank opens the index, so a large one
would be checked again and again. Once a large index has passed, a stamp in the user's cache
directory records the file's identity: device, inode, size, mtime and ctime (any write to the
file changes its ctime, which no user can set) and its header checksum.
An open that finds a stamp matching the file it mapped skips the O(N) checks; any other open
runs them. A stamp is trusted only if this user owns it and nobody else may write it; stamps
and locks are opened relative to their checked folder (`tierfeed.cachedir.CacheFolder`). File
times tick with the kernel's coarse clock (a few ms); only indexes whose checks take longer
than that are stamped, so a change after a stamp always moves the ctime.
`tierfeed verify` never trusts stamps: bit rot changes no ctime.

Every rank of a node opens the index at the same moment when a job starts: `one_checker` lets
one of this user's processes check an unstamped index while the others wait for its stamp
(a lock that the kernel lets go if the checker dies), instead of every rank checking at once.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from tierfeed.cachedir import CacheFolder, let_go, lock_within, open_own_file
from tierfeed.config import default_cache_dir
from tierfeed.errors import TierfeedError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.publish import publish

__all__ = ["CHECKER_WAIT_S", "STAMP_ABOVE_BYTES", "has_stamp", "one_checker", "stamp"]

# Indexes whose sections total more than this are stamped (smaller ones check quickly: a stamp
# would spare little).
STAMP_ABOVE_BYTES = 16 * 2**20
# How long a process waits for another one's check of the same index before checking itself
# (many times what the checks of the largest indexes take, docs/BENCHMARKS.md, "Larger: the
# index, ..."; a checker stuck on its storage is not waited for forever).
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


@contextlib.contextmanager
def _stamps(folder: str) -> Iterator[int | None]:
    """This user's ``folder`` of stamps or locks in the user's cache, open (made 0700, checked
    with the cache directory above it, `tierfeed.cachedir.CacheFolder`): every stamp and lock
    is then used relative to it; None where there is none to trust (unusable or another
    user's): stamps only save time, so the checks then simply run."""
    try:
        fd: int | None = CacheFolder(default_cache_dir(), (folder,)).open()
    except TierfeedError:
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _stamp_name(path: Path, st: os.stat_result) -> str:
    name = checksum_bytes(f"{path}\0{st.st_dev}\0{st.st_ino}".encode())
    return f"{name:016x}"


def _own_file(folder_fd: int, name: str, flags: int) -> int | None:
    """The file ``name`` in the folder open as ``folder_fd``, opened never through a link, if
    it is a regular file of this user's that nobody else may write (`open_own_file`); else
    None: a stamp or lock another hand made is not used."""
    try:
        return open_own_file(folder_fd, name, flags, Path(name))
    except (OSError, TierfeedError):
        return None


def has_stamp(path: Path, st: os.stat_result, header_checksum: int) -> bool:
    """Whether index ``path`` (``st``: the fstat of the descriptor that was mapped) was
    checked in full since it last changed."""
    with _stamps("checked") as folder:
        if folder is None:
            return False
        fd = _own_file(folder, f"{_stamp_name(path, st)}.json", os.O_RDONLY)
    if fd is None:
        return False
    try:
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
    with _stamps("checked") as folder:
        if folder is None:
            return
        data = json.dumps(_identity(st, header_checksum)).encode()
        with contextlib.suppress(OSError):
            publish(f"{_stamp_name(path, st)}.json", data, 0o600, fsync=False, dir_fd=folder)


@contextlib.contextmanager
def one_checker(path: Path, st: os.stat_result, wait_s: float | None = None) -> Iterator[None]:
    """Hold this user's right to check index ``path`` on this host, waiting (at most
    ``wait_s``, default `CHECKER_WAIT_S`) while another process holds it. The caller then looks
    for a stamp again before checking. A lock that cannot be made (no cache directory), is not
    this user's own file, or is held past the bound lets the caller check on its own: never
    worse than without it."""
    with _stamps("checking") as folder:
        fd = None
        if folder is not None:
            fd = _own_file(folder, f"{_stamp_name(path, st)}.lock", os.O_RDWR | os.O_CREAT)
    if fd is None:
        yield
        return
    try:
        with contextlib.suppress(OSError):  # not lockable: check on our own
            lock_within(fd, CHECKER_WAIT_S if wait_s is None else wait_s)
        yield
    finally:
        let_go(fd)
