"""The read-only FUSE view of a store: the original tree, answered from the metadata snapshot.

stat, readdir and open never reach the origin: they are answered from the index. A read serves
only bytes that passed the member's checksum: the member is read whole once through
``Store.read_member`` (which drops a bad tier copy and reads the origin again), kept in a small
LRU of verified members bounded in bytes, and the kernel's many 128 KiB requests are sliced
from it. A member that fails its check is an EIO, never bytes. Live counters are served at
``/.tierfeed/stats.json``, which is left out of listings.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import mfusepy

from tierfeed.errors import ChunkCorruptError, NotFoundError, TierfeedError
from tierfeed.format.tree import PathStat
from tierfeed.mount.bounded import BoundedLoads
from tierfeed.mount.members import RepeatedFailureError, VerifiedMembers
from tierfeed.storage.store import Store
from tierfeed.telemetry.histogram import LatencyHistogram

__all__ = [
    "DEFAULT_MEMBER_CACHE_BYTES",
    "STATS_DIR",
    "STATS_FILE",
    "RepeatedFailureError",
    "StoreView",
    "VerifiedMembers",
]

DEFAULT_MEMBER_CACHE_BYTES = 64 * 2**20  # members in flight; the page cache keeps the rest

STATS_DIR = ".tierfeed"
STATS_FILE = "stats.json"
_STATS_FH = 2**62  # stats file handles start here; members use member id + 1
_SNAPSHOTS = 64  # stats snapshots kept for open handles
_log = logging.getLogger("tierfeed.mount")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _erofs(*_args: object) -> int:
    raise mfusepy.FuseOSError(errno.EROFS)


class StoreView(mfusepy.Operations):  # type: ignore[misc]
    """FUSE operations serving ``store`` read-only.

    Args:
        store: the opened store (its ``source`` serves the bytes).
        extra_stats: returns more counters for the stats file (e.g. the tier stack's).
        on_open: called with the chunk id when a file is opened (prefetch hints).
        cache_bytes: bytes of verified members kept for the read requests that follow.
        timeout_s: a read whose member is not loaded within this many seconds is answered
            EIO (the load goes on; its bytes are kept if it ends well). None: no bound here.
    """

    use_ns = True

    def __init__(
        self,
        store: Store,
        extra_stats: Callable[[], dict[str, Any]] | None = None,
        on_open: Callable[[int], None] | None = None,
        cache_bytes: int = DEFAULT_MEMBER_CACHE_BYTES,
        timeout_s: float | None = None,
    ) -> None:
        self.store = store
        self._loads: BoundedLoads | None = None
        load: Callable[[int], bytes] = store.read_member
        if timeout_s is not None:
            load = self._loads = BoundedLoads(load, timeout_s, late=self._keep_late)
        self._members = VerifiedMembers(load, cache_bytes)
        self._warned_oversized = False
        self._extra = extra_stats or dict
        self._on_open = on_open
        st = os.stat(store.index.path)
        self._time_ns = st.st_mtime_ns
        self._uid, self._gid = os.getuid(), os.getgid()
        self._counts = {
            "opens": 0,
            "reads": 0,
            "bytes": 0,
            "getattrs": 0,
            "readdirs": 0,
            "errors": 0,
            "corrupt": 0,
        }
        self._read_latency = LatencyHistogram()
        self._mutex = threading.Lock()
        self._started = time.time()
        # Stats file handle -> the JSON it reads. There is no release() to drop a handle's
        # snapshot (the kernel's release of every file would then cost a Python call), so
        # the most recent _SNAPSHOTS are kept.
        self._snapshots: OrderedDict[int, bytes] = OrderedDict()
        self._next_snapshot = _STATS_FH

    def _keep_late(self, member: int, data: bytes) -> None:
        self._members.keep(member, data)

    def close(self) -> None:
        """Stop the load threads (those stuck in a read end with it)."""
        if self._loads is not None:
            self._loads.close()

    # --- helpers --------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._mutex:
            self._counts[name] += n

    def _attrs(
        self, is_dir: bool, size: int, perm: int | None = None, t: int | None = None
    ) -> dict[str, int]:
        """Attributes of an entry: the packed tree's mode and mtime where the index holds
        them (shown as stored: the mount is read-only whatever they say), else 0o555/0o444
        and the index file's mtime. The owner shown is the mounting user. With
        --allow-other the kernel checks every access against these attributes
        (`tierfeed.mount.command`): everyone else gets what the group and other bits give."""
        if perm is None:
            perm = 0o555 if is_dir else 0o444
        mode = (stat.S_IFDIR if is_dir else stat.S_IFREG) | perm
        t = self._time_ns if t is None else t
        return {
            "st_mode": mode,
            "st_nlink": 2 if is_dir else 1,
            "st_size": size,
            "st_uid": self._uid,
            "st_gid": self._gid,
            "st_atime": t,
            "st_mtime": t,
            "st_ctime": t,
            "st_blksize": 128 * 1024,
            "st_blocks": (size + 511) // 512,
        }

    def stats(self) -> dict[str, Any]:
        """The live counters served at /.tierfeed/stats.json."""
        with self._mutex:
            counts = dict(self._counts)
            latency = self._read_latency.summary()
        counts["members_checked"] = self._members.loads
        counts["member_cache_bytes"] = self._members.held_bytes
        return {
            "uptime_s": time.time() - self._started,
            "view": counts,
            "read_latency_s": latency,
            **self._extra(),
        }

    def _stats_bytes(self) -> bytes:
        return (json.dumps(self.stats(), indent=1, default=float) + "\n").encode()

    @staticmethod
    def _rel(path: str) -> str:
        return path.lstrip("/")

    def _lookup(self, path: str) -> PathStat:
        """What the index knows of a path of the tree; ENOENT if absent."""
        try:
            return self.store.stat(self._rel(path))
        except NotFoundError:
            raise mfusepy.FuseOSError(errno.ENOENT) from None

    # --- metadata: answered from the index ---------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        self._count("getattrs")
        rel = self._rel(path)
        if rel == STATS_DIR:
            return self._attrs(True, 0)
        if rel == f"{STATS_DIR}/{STATS_FILE}":
            return self._attrs(False, len(self._stats_bytes()))
        found = self._lookup(path)
        attrs = self._attrs(found.is_dir, found.size, found.mode, found.mtime_ns)
        if found.is_dir:
            attrs["st_nlink"] = 2 + (self.store.tree.subdirs(rel) or 0)
        return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        self._count("readdirs")
        rel = self._rel(path)
        if rel == STATS_DIR:
            return [".", "..", STATS_FILE]
        try:
            names = self.store.listdir(rel)
        except NotFoundError:
            raise mfusepy.FuseOSError(errno.ENOENT) from None
        return [".", "..", *names]

    def open(self, path: str, fi: Any) -> int:
        """Open for reading; the view is mounted with ``raw_fi`` to choose caching per file."""
        if fi.flags & _WRITE_FLAGS:
            raise mfusepy.FuseOSError(errno.EROFS)
        if self._rel(path) == f"{STATS_DIR}/{STATS_FILE}":
            # One snapshot per open: a read split into several requests stays consistent.
            with self._mutex:
                fi.fh = self._next_snapshot
                self._next_snapshot += 1
            self._snapshot(int(fi.fh))
            fi.direct_io = 1  # live content: never from the page cache
            return 0
        found = self._lookup(path)
        if found.is_dir:
            raise mfusepy.FuseOSError(errno.EISDIR)
        member = found.member
        self._count("opens")
        if self._on_open is not None:
            self._on_open(int(self.store.index.member_chunk[member]))
        fi.fh = member + 1
        fi.keep_cache = 1  # immutable data: keep what the page cache holds across opens
        return 0

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        fh = int(fi.fh)
        if fh >= _STATS_FH:
            return self._snapshot(fh)[offset : offset + size]
        member = fh - 1
        length = int(self.store.index.member_length[member])
        if offset >= length:
            return b""
        started = time.perf_counter()
        if length > self._members.budget:
            self._warn_oversized(path, length)
        try:
            whole = self._members.get(member)
        except RepeatedFailureError:
            raise mfusepy.FuseOSError(errno.EIO) from None  # said once, when it failed
        except (TierfeedError, OSError) as exc:
            self._failed(path, member, exc)
            raise mfusepy.FuseOSError(errno.EIO) from None
        data = whole[offset : offset + size]
        with self._mutex:
            self._counts["reads"] += 1
            self._counts["bytes"] += len(data)
            self._read_latency.add(time.perf_counter() - started)
        return data

    def _failed(self, path: str, member: int, exc: BaseException) -> None:
        """Log and count a read that is answered EIO: which chunk, which member, and why."""
        chunk = self.store.chunks[int(self.store.index.member_chunk[member])].name
        corrupt = isinstance(exc, ChunkCorruptError)
        _log.error(
            "%s: %s of member %r in chunk %s; answered EIO: %s",
            self.store.location,
            "checksum mismatch" if corrupt else "read failed",
            path.lstrip("/"),
            chunk,
            exc,
        )
        with self._mutex:
            self._counts["errors"] += 1
            if corrupt:
                self._counts["corrupt"] += 1

    def _warn_oversized(self, path: str, length: int) -> None:
        # Said once per mount: such files displace each other (and everything else).
        with self._mutex:
            if self._warned_oversized:
                return
            self._warned_oversized = True
        _log.warning(
            "%r (%d bytes) is larger than the verified-member cache (%d bytes): it is held "
            "alone while read; reading several such files at once reads each again and again",
            path.lstrip("/"),
            length,
            self._members.budget,
        )

    def _snapshot(self, fh: int) -> bytes:
        """The stats JSON a handle reads: taken at its first use and kept for its later reads.

        A handle held open past _SNAPSHOTS later opens lost its snapshot; it takes a fresh one
        and keeps it, so one read split into several requests still sees one document.
        """
        with self._mutex:
            kept = self._snapshots.get(fh)
        if kept is not None:
            return kept
        snapshot = self._stats_bytes()
        with self._mutex:
            snapshot = self._snapshots.setdefault(fh, snapshot)
            while len(self._snapshots) > _SNAPSHOTS:
                self._snapshots.popitem(last=False)
        return snapshot

    def statfs(self, path: str) -> dict[str, int]:
        total = int(self.store.index.member_length.sum())
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": (total + 4095) // 4096,
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": self.store.index.num_members,
            "f_ffree": 0,
            "f_namemax": 255,
        }

    # --- everything that would change the tree: read-only ------------------------------

    write = truncate = mkdir = rmdir = unlink = rename = symlink = link = _erofs
    chmod = chown = utimens = create = setxattr = removexattr = _erofs
