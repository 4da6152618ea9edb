"""The read-only FUSE pass-through that delays each open, stat, listing and read by a model."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any

import mfusepy

from tierfeed.errors import ConfigError, StorageError
from tierfeed.latency import LatencyModel, LatencySampler
from tierfeed.publish import publish
from tierfeed.slowfs.options import SlowFSOptions
from tierfeed.slowfs.stats import STATS_DIR, STATS_PATH, Counters, SlowFSStats

__all__ = ["SlowPassthrough", "serve"]

# Handles of the virtual stats file live far above any real file descriptor.
_VIRTUAL_FH_BASE = 1 << 62
_STAT_KEYS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")
_STATVFS_KEYS = (
    "f_bsize",
    "f_frsize",
    "f_blocks",
    "f_bfree",
    "f_bavail",
    "f_files",
    "f_ffree",
    "f_favail",
    "f_flag",
    "f_namemax",
)
# O_NOATIME keeps reads from touching the origin's access times; not every caller may use it.
_NOATIME = getattr(os, "O_NOATIME", 0)
_STALLS_KEPT = 256  # stalls listed in the status document, the latest


def _refused() -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(errno.EROFS)


class SlowPassthrough(mfusepy.Operations):  # type: ignore[misc]
    """mfusepy operations: pass SRC through read-only, sleeping as the latency model says.

    Every getattr, open, readdir, readlink and read request that reaches the server draws
    one delay from the seeded model (reads add their bytes over the bandwidth cap) and
    sleeps it; sleeping releases the GIL, so concurrent requests overlap. The virtual
    file ``/.slowfs/stats.json`` serves the live counters and costs nothing.
    """

    use_ns = True  # times as integer nanoseconds, no float rounding of mtimes

    def __init__(self, src: str | os.PathLike[str], model: LatencyModel, options: SlowFSOptions):
        self.root = os.path.realpath(src)
        self.model = model
        self.options = options
        self.counters = Counters()
        self._sampler = None if model.is_zero else LatencySampler(model)
        self._started = time.monotonic()
        self.mounted = False  # set once libfuse calls init(): the mount is live
        self._virtual: dict[int, bytes] = {}
        self._virtual_mutex = threading.Lock()
        self._next_virtual = _VIRTUAL_FH_BASE
        self._link_mutex = threading.Lock()
        self._link_free = 0.0  # monotonic time at which the shared link is next idle
        # The last stalls drawn: what stalled and when, for a benchmark to place its waits.
        self._stalls: deque[dict[str, Any]] = deque(maxlen=_STALLS_KEPT)
        st = os.stat(self.root)
        self._owner = {"st_uid": st.st_uid, "st_gid": st.st_gid}

    # --- helpers -------------------------------------------------------------------

    def _real(self, path: str) -> str:
        # The kernel resolves "..", "." and symlinks itself, so paths arrive normalised.
        return os.path.join(self.root, path.lstrip("/"))

    def _delay(self, op: str, path: str, nbytes: int = 0, opening: bool = False) -> None:
        if self._sampler is None:
            return
        seconds, stalled = self._sampler.draw(nbytes, opening)
        if stalled:
            at = time.monotonic() - self._started
            self._stalls.append({"op": op, "path": path, "at_s": at, "seconds": seconds})
        m = self.model
        transfer = nbytes / (m.bandwidth_mbps * 1e6) if m.bandwidth_mbps > 0 and nbytes else 0.0
        latency = seconds - transfer
        if transfer <= 0 or not self.options.shared_bandwidth:
            self.counters.delayed(seconds, stalled)
            if seconds > 0:
                time.sleep(seconds)
            return
        # One link for the whole mount: after its latency a transfer waits for the ones
        # already on the link, so concurrent reads share bandwidth_mbps between them.
        if latency > 0:
            time.sleep(latency)
        with self._link_mutex:
            now = time.monotonic()
            start = max(now, self._link_free)
            self._link_free = end = start + transfer
        self.counters.delayed(seconds, stalled, queued=start - now)
        time.sleep(max(0.0, end - time.monotonic()))

    def _error(self, exc: OSError) -> mfusepy.FuseOSError:
        self.counters.count("errors")
        return mfusepy.FuseOSError(exc.errno or errno.EIO)

    def status(self) -> dict[str, Any]:
        """The document served at ``/.slowfs/stats.json``."""
        return {
            "counters": self.counters.snapshot().to_dict(),
            "model": asdict(self.model),
            "options": asdict(self.options),
            "src": self.root,
            "pid": os.getpid(),
            "uptime_s": time.monotonic() - self._started,
            "stalls": list(self._stalls),
        }

    def _virtual_attrs(self, path: str) -> dict[str, Any] | None:
        if path == STATS_DIR:
            return {"st_mode": 0o040555, "st_nlink": 2, **self._owner}
        if path == STATS_PATH:
            # The size is a guess; the handle is direct_io, so reads are not cut at it.
            size = len(json.dumps(self.status()))
            return {"st_mode": 0o100444, "st_nlink": 1, "st_size": size, **self._owner}
        return None

    def init_with_config(self, conn: Any, config: Any) -> None:
        """Called by libfuse once the mount is live: widen the kernel's readahead queue."""
        if conn is not None:
            # The kernel keeps at most 12 background (readahead) reads in flight by
            # default, which would cap how many slowed reads overlap below `threads`.
            conn.max_background = self.options.threads
            conn.congestion_threshold = max(1, self.options.threads * 3 // 4)
        self.mounted = True

    # --- metadata --------------------------------------------------------------------

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        """lstat of the source path (one latency draw), or the virtual stats entries."""
        virtual = self._virtual_attrs(path)
        if virtual is not None:
            return virtual
        self.counters.count("stats")
        self._delay("getattr", path)
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise self._error(exc) from None
        attrs: dict[str, Any] = {key: getattr(st, key) for key in _STAT_KEYS}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def readdir(self, path: str, fh: Any) -> list[str]:
        """Names in a source directory (one latency draw); ``.slowfs`` is never listed."""
        if path == STATS_DIR:
            return [".", "..", STATS_PATH.rsplit("/", 1)[1]]
        self.counters.count("readdirs")
        self._delay("readdir", path)
        try:
            names = os.listdir(self._real(path))
        except OSError as exc:
            raise self._error(exc) from None
        if path == "/":
            names = [n for n in names if n != STATS_DIR[1:]]
        return [".", "..", *names]

    def readlink(self, path: str) -> str:
        """The target of a source symlink, unchanged (one latency draw)."""
        self.counters.count("readlinks")
        self._delay("readlink", path)
        try:
            return os.readlink(self._real(path))
        except OSError as exc:
            raise self._error(exc) from None

    def statfs(self, path: str) -> dict[str, int]:
        """Capacity of the source file system (free, not delayed, not counted)."""
        st = os.statvfs(self.root)
        return {key: getattr(st, key) for key in _STATVFS_KEYS}

    # --- data ----------------------------------------------------------------------

    def open(self, path: str, fi: Any) -> int:
        """Open the source file read-only (one latency draw); set the kernel caching flags."""
        if fi.flags & os.O_ACCMODE != os.O_RDONLY or fi.flags & (os.O_TRUNC | os.O_CREAT):
            self.counters.count("errors")
            raise _refused()
        if path == STATS_PATH:
            with self._virtual_mutex:
                fh = self._next_virtual
                self._next_virtual += 1
                self._virtual[fh] = json.dumps(self.status(), indent=1).encode() + b"\n"
            fi.fh = fh
            fi.direct_io = 1  # its size changes all the time: never cache, never cut at st_size
            return 0
        self.counters.count("opens")
        self._delay("open", path, opening=True)
        real = self._real(path)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(real, flags | _NOATIME)
            except PermissionError:
                fd = os.open(real, flags)
        except OSError as exc:
            raise self._error(exc) from None
        fi.fh = fd
        if self.options.cache == "direct":
            fi.direct_io = 1
        elif self.options.cache == "keep":
            fi.keep_cache = 1
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        """Read a range of an open file; one latency draw plus its bytes over the bandwidth cap."""
        handle: int = fh.fh
        if handle >= _VIRTUAL_FH_BASE:
            with self._virtual_mutex:
                data = self._virtual.get(handle, b"")
            return data[offset : offset + size]
        try:
            data = os.pread(handle, size, offset)
        except OSError as exc:
            raise self._error(exc) from None
        self.counters.count("reads")
        self.counters.count("bytes_read", len(data))
        self._delay("read", f"{path}@{offset}", len(data))
        return data

    def release(self, path: str, fh: Any) -> int:
        """Close the source file (free)."""
        handle: int = fh.fh
        if handle >= _VIRTUAL_FH_BASE:
            with self._virtual_mutex:
                self._virtual.pop(handle, None)
        else:
            os.close(handle)
        return 0

    # --- everything that would write: refused, the origin is read-only -----------------
    # The mount is also `ro`, so the kernel answers EROFS before these are ever called.

    def create(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def write(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def truncate(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def mkdir(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def mknod(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def unlink(self, path: str) -> int:
        """Refused: EROFS."""
        raise _refused()

    def rmdir(self, path: str) -> int:
        """Refused: EROFS."""
        raise _refused()

    def symlink(self, target: str, source: str) -> int:
        """Refused: EROFS."""
        raise _refused()

    def link(self, target: str, source: str) -> int:
        """Refused: EROFS."""
        raise _refused()

    def rename(self, old: str, new: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def chmod(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def chown(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()

    def utimens(self, path: str, *args: Any) -> int:
        """Refused: EROFS."""
        raise _refused()


def serve(
    src: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    model: LatencyModel,
    options: SlowFSOptions | None = None,
    stats_file: str | os.PathLike[str] | None = None,
) -> SlowFSStats:
    """Mount SRC slowed at MOUNTPOINT and serve in this thread until unmounted or signalled.

    SIGTERM, SIGINT and ``fusermount3 -u`` end it cleanly; libfuse unmounts on the way out.

    Args:
        src: source directory, only ever read.
        mountpoint: an empty directory to mount on.
        model: the latency model applied per operation.
        options: kernel caching and threading choices (defaults: ``SlowFSOptions()``).
        stats_file: where to write the final counters as JSON after unmounting.

    Returns:
        The counters at unmount.

    Raises:
        ConfigError: SRC or MOUNTPOINT is not a directory.
        StorageError: libfuse could not mount (its reason is on stderr).
    """
    options = options or SlowFSOptions()
    if not os.path.isdir(src):
        raise ConfigError(f"slowfs source {os.fspath(src)!r} is not a directory")
    if not os.path.isdir(mountpoint):
        raise ConfigError(f"slowfs mountpoint {os.fspath(mountpoint)!r} is not a directory")
    real_src, real_mnt = os.path.realpath(src), os.path.realpath(mountpoint)
    if real_mnt == real_src or real_mnt.startswith(real_src + os.sep):
        # Serving the source would then read through the mount itself, into a deadlock.
        raise ConfigError(f"slowfs mountpoint {real_mnt!r} lies inside the source {real_src!r}")
    ops = SlowPassthrough(src, model, options)
    try:
        mfusepy.FUSE(ops, os.fspath(mountpoint), raw_fi=True, **options.fuse_kwargs())
    except RuntimeError as exc:
        # libfuse also returns non-zero after a clean SIGTERM/SIGINT exit; only a
        # failure before init() (the mount never came up) is an error.
        if not ops.mounted:
            raise StorageError(
                f"slowfs could not mount {os.fspath(mountpoint)!r} (libfuse returned {exc}); "
                "see libfuse's message above"
            ) from None
    final = ops.counters.snapshot()
    if stats_file is not None:
        publish(stats_file, (json.dumps(ops.status(), indent=1) + "\n").encode(), fsync=False)
    return final
