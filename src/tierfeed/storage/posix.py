"""The POSIX driver: objects are files under a root directory; writes are tmp-then-rename.

A shared file system has transient faults too: NFS answers ESTALE for a descriptor whose file
handle the server forgot (the path opens again), EAGAIN or ETIMEDOUT on a soft mount, and a read
may end short of a file that has not shrunk. Those go through the same `RetryPolicy` as an
object store's: the bytes still missing are read again, each retry counted; any other error is
raised at once. A read blocked in the kernel cannot be cut short (no face can): its bound is the
file system's own (a soft mount's ``timeo``/``retrans``).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from pathlib import Path

from tierfeed.cachedir import open_cache_dir
from tierfeed.errors import NotFoundError, ReadOnlyError, StorageError
from tierfeed.pread import pread
from tierfeed.publish import is_temporary, publish, sweep_stale, temporary_path
from tierfeed.storage.driver import Driver
from tierfeed.storage.files import FdCache, path_under
from tierfeed.storage.retry import RetryPolicy, Verdict

__all__ = ["PosixDriver"]

# A hard link cannot be made here: another file system, or one without links (or not for us).
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})
# A read worth another try (EINTR is retried by Python itself, PEP 475).
_TRANSIENT = frozenset({errno.EAGAIN, errno.ETIMEDOUT, errno.ESTALE, errno.EINTR})
_ADVICE = "the file system keeps failing: check its server and mount, or retry later"


class _ShortReadError(OSError):
    """A read that ended before the end of a file that has not shrunk."""


class PosixDriver(Driver):
    """Files under ``root``: the one POSIX reader (one pread on a cached descriptor).

    A writable driver is a cache: its root is created and checked as `tierfeed.cachedir`
    says (not a link, this user's, writable by nobody else) and held open, and every file
    below it is created, opened, renamed and removed relative to that descriptor, never
    through a link, so a swap of the path after the check redirects nothing.

    Args:
        root: the directory (when writable: created 0700, 0755 if ``shared``, if missing;
            else checked, and its mode left as it is).
        read_only: refuse writes and deletes.
        shared: create directories 0755 and files 0644 (a cache shared between users,
            configured explicitly); otherwise 0700 and 0600, private to their creator.
        direct: open files ``O_DIRECT``: reads bypass the page cache, so a second read of a
            range does not queue behind a first one that holds its pages locked (hedged reads
            on FUSE and NFS). Where the file system refuses O_DIRECT opens, or wants aligned
            direct reads (EINVAL), reads go through the page cache instead.
        max_open: descriptors kept open at most (see `FdCache`).
        retry: how transient read faults are tried again (see `RetryPolicy`).
    """

    name = "posix"

    def __init__(
        self,
        root: str | os.PathLike[str],
        read_only: bool = False,
        shared: bool = False,
        direct: bool = False,
        max_open: int = 128,
        retry: RetryPolicy | None = None,
    ):
        super().__init__(read_only)
        self.retry = retry or RetryPolicy()
        self.root = Path(root).absolute()
        self._dir_mode, self._file_mode = (0o755, 0o644) if shared else (0o700, 0o600)
        self.name = f"posix:{self.root}"
        self._max_open, self._direct = max_open, direct
        # The checked root every path is relative to (None: an origin, read by path).
        self._dir_fd = None if read_only else open_cache_dir(self.root, shared)
        self._open_files()
        self._opens_counted = 0
        self._resolved_paths: dict[str, str] = {}

    def _open_files(self) -> None:
        flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if self._direct else 0)
        # No open per read: the origin sees one per file.
        self._fds = FdCache(self._max_open, flags, self._dir_fd)
        # `read_block`'s: O_DIRECT descriptors (opened when a copy first reads the file).
        self._block_fds = (
            self._fds
            if self._direct
            else FdCache(self._max_open, flags | os.O_DIRECT, self._dir_fd)
        )

    def _path(self, path: str) -> Path:
        return path_under(
            self.root, path, lambda: StorageError(f"{self}: path {path!r} would leave the root")
        )

    def _fail(self, path: str, exc: OSError) -> StorageError:
        if exc.errno == errno.ENOENT:
            return NotFoundError(f"{self}: no object {path!r}")
        return StorageError(f"{self}: {path}: {exc.strerror or exc}")

    def _resolved(self, path: str) -> str:
        """``path`` checked and made absolute (relative to the root's descriptor where there
        is one), once per path (reads are hot)."""
        full = self._resolved_paths.get(path)
        if full is None:
            checked = self._path(path)
            if self._dir_fd is not None:
                checked = checked.relative_to(self.root)
            full = self._resolved_paths[path] = os.fspath(checked)
        return full

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return self.read_ranges(path, (offset,), (length,))[0]

    def read_ranges(self, path: str, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        return self._read_through(self._fds, path, offsets, lengths)

    def _read_through(
        self, fds: FdCache, path: str, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes]:
        """The ranges of ``path`` through one descriptor of ``fds``, counted."""
        full = self._resolved(path)
        try:
            # Not `with fds.fd(...)`: a generator per read weighs on the warm path
            # (docs/BENCHMARKS.md, "Local samples read inline").
            entry = fds.acquire(full)
            try:
                out = [
                    pread(entry.fd, full, n, o, fds.flags, self._dir_fd)
                    for o, n in zip(offsets, lengths, strict=True)
                ]
            finally:
                fds.release(entry)
        except OSError as exc:
            if exc.errno not in _TRANSIENT:
                raise self._fail(path, exc) from None
            # The first try failed: read every range again under the retry policy (the fault
            # judged, and counted, once).
            out = [
                self._rest(fds, path, full, o, n, b"", exc if i == 0 else None)
                for i, (o, n) in enumerate(zip(offsets, lengths, strict=True))
            ]
        got = sum(map(len, out))
        if got < sum(lengths):  # the end of the file, or a short read: read on (rare)
            for i, (o, n) in enumerate(zip(offsets, lengths, strict=True)):
                if len(out[i]) < n:
                    out[i] = self._rest(fds, path, full, o, n, out[i])
            got = sum(map(len, out))
        self.counters.add(reads=len(out), bytes_read=got)
        self._count_opens()
        return out

    def _rest(
        self,
        fds: FdCache,
        path: str,
        full: str,
        offset: int,
        length: int,
        got: bytes,
        failed: OSError | None = None,
    ) -> bytes:
        """Range ``offset``..``offset + length`` of which ``got`` was read: the rest, under the
        retry policy, up to the end of the file (the slow path: a plain read is one pread);
        ``failed``: the fault of the first try, made already (then judged as this call's)."""
        data = bytearray(got)

        def rest(_: float) -> None:
            entry = fds.acquire(full)
            try:
                while len(data) < length:
                    want, at = length - len(data), offset + len(data)
                    block = pread(entry.fd, full, want, at, fds.flags, self._dir_fd)
                    if not block:
                        if os.fstat(entry.fd).st_size > offset + len(data):
                            raise _ShortReadError(
                                errno.EIO,
                                f"a read ended at byte {offset + len(data)}, before "
                                "the end of the file",
                            )
                        return  # the end of the file
                    data.extend(block)
            finally:
                fds.release(entry)

        def judge(exc: BaseException) -> Verdict:
            if isinstance(exc, OSError) and (
                isinstance(exc, _ShortReadError) or exc.errno in _TRANSIENT
            ):
                if exc.errno == errno.ESTALE:  # the server forgot the file handle: open anew
                    fds.forget(full)
                return Verdict(
                    "short read"
                    if isinstance(exc, _ShortReadError)
                    else errno.errorcode.get(exc.errno or 0, "transient")
                )
            if isinstance(exc, OSError):
                return Verdict(error=self._fail(path, exc))
            return Verdict(error=StorageError(f"{self}: {path}: {exc}"))

        self.retry.call(rest, judge, f"{self}: {path}", self.counters, _ADVICE, failed)
        return bytes(data)

    def _count_opens(self) -> None:
        opens = self.opens
        if opens != self._opens_counted:  # opens are rare: no second lock per read
            self._opens_counted = opens
            self.counters.set(opens=opens)

    def read_block(self, path: str, offset: int, length: int) -> bytes:
        """``read_range`` through O_DIRECT descriptors of its own, where the file system allows
        them: a copy's piece is then the one read of its bytes at the origin (through the page
        cache the kernel's readahead read part of a store twice over FUSE: docs/BENCHMARKS.md,
        "The end of a cold epoch, and each origin byte once"), and waits for no page a stalled
        read holds locked. Into an aligned buffer where the file system wants one; through the
        page cache where it refuses O_DIRECT."""
        return self._read_through(self._block_fds, path, (offset,), (length,))[0]

    def size(self, path: str) -> int:
        self.counters.add(stats=1)
        full = self._resolved(path)
        try:
            # A cache's files are never links; an origin's may be (a store of linked chunks).
            cache = self._dir_fd is not None
            return os.stat(full, dir_fd=self._dir_fd, follow_symlinks=not cache).st_size
        except OSError as exc:
            raise self._fail(path, exc) from None

    def list(self, prefix: str = "") -> list[str]:
        self.counters.add(lists=1)
        out = []
        walk = (
            ((top, names) for top, _, names in os.walk(self.root))
            if self._dir_fd is None
            else ((top, names) for top, _, names, _ in os.fwalk(".", dir_fd=self._dir_fd))
        )
        for dirpath, names in walk:
            base = self.root if self._dir_fd is None else "."
            rel = Path(os.path.relpath(dirpath, base)).as_posix()
            for name in names:
                p = name if rel == "." else f"{rel}/{name}"
                if p.startswith(prefix) and not is_temporary(name):
                    out.append(p)
        return sorted(out)

    def _write(self, path: str, data: bytes) -> None:
        target = self._resolved(path)
        try:
            self._make_parents(target)
            publish(target, data, mode=self._file_mode, dir_fd=self._dir_fd)
        except OSError as exc:
            raise self._fail(path, exc) from None
        self._forget(target)

    def _make_parents(self, target: str) -> None:
        """The directories above ``target`` (relative to the root), one level at a time."""
        parents = Path(target).parent.parts
        for depth in range(1, len(parents) + 1):
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.join(*parents[:depth]), self._dir_mode, dir_fd=self._dir_fd)

    def adopt(self, path: str, source: Path, fd: int) -> bool:
        """Link ``source`` in at ``path`` (under a temporary name, then renamed over it, as a
        write is). The link is kept only if it is the very file open as ``fd``: a name
        replaced meanwhile (another fetch of the chunk begun) is never taken for it. No sync:
        the bytes were checked whole before, and every read checks its member's checksum, so
        what a power loss tears is dropped and fetched again, never served.

        Returns False where no link can be made (another file system, one without hard
        links): the caller writes the bytes instead.
        """
        if self.read_only:
            raise ReadOnlyError(f"{self}: read-only; refusing to write {path}")
        target = self._resolved(path)
        temporary = os.fspath(temporary_path(target))
        at = self._dir_fd
        try:
            self._make_parents(target)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=at)  # left by a link of ours that failed midway
            try:
                if not self._link(source, fd, temporary):
                    return False  # the file open is no longer in the landing (fetch ended)
            except OSError as exc:
                if exc.errno in _NO_LINK:
                    return False
                raise
            try:
                linked = os.stat(temporary, dir_fd=at, follow_symlinks=False)
                if linked.st_ino != os.fstat(fd).st_ino:
                    return False  # ``source`` names another file now
                os.chmod(temporary, self._file_mode, dir_fd=at)
                os.replace(temporary, target, src_dir_fd=at, dst_dir_fd=at)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=at)
        except OSError as exc:
            raise self._fail(path, exc) from None
        self._forget(target)
        self.counters.add(writes=1, links=1)
        return True

    def _link(self, source: Path, fd: int, temporary: str) -> bool:
        """Link the file open as ``fd`` (named ``source``) in at ``temporary``: through
        /proc/self/fd where there is one, so the very file open is linked even if the path
        to ``source`` was swapped meanwhile (False: it has no name left to link); else by its
        path (the caller checks the inode)."""
        proc = f"/proc/self/fd/{fd}"
        if os.path.exists(proc):
            try:
                os.link(proc, temporary, dst_dir_fd=self._dir_fd, follow_symlinks=True)
            except FileNotFoundError:
                return False
            return True
        os.link(source, temporary, dst_dir_fd=self._dir_fd, follow_symlinks=False)
        return True

    def for_hedges(self) -> Driver:
        """The same files, read-only and ``O_DIRECT`` (descriptors of its own): a second read
        of a range does not wait for pages that a stalled first read holds locked (FUSE,
        NFS)."""
        hedges = PosixDriver(self.root, read_only=True, direct=True)
        if self._dir_fd is not None:  # the very directory this one checked, not the path
            hedges._dir_fd = os.dup(self._dir_fd)
            hedges._open_files()
        return hedges

    def _delete(self, path: str) -> None:
        target = self._resolved(path)
        try:
            os.unlink(target, dir_fd=self._dir_fd)
        except OSError as exc:
            raise self._fail(path, exc) from None
        self._forget(target)

    @property
    def opens(self) -> int:
        """Files opened so far, live (``counters.opens`` catches up on the next read)."""
        blocks = self._block_fds.opens if self._block_fds is not self._fds else 0
        return self._fds.opens + blocks

    @property
    def directory(self) -> Path:
        """The root: the objects are files under it."""
        return self.root

    def open_ahead(self, paths: Sequence[str], blocks: bool = False) -> None:
        """Open these files in the background, in this order (see FdCache.open_ahead), so
        that an open that stalls is paid before a read needs the file; with ``blocks``, first
        the descriptors copies read through (`read_block`), for a reader that copies."""
        resolved = [self._resolved(p) for p in paths]
        if blocks and self._block_fds is not self._fds:
            self._block_fds.open_ahead(resolved)
        self._fds.open_ahead(resolved)

    def close(self) -> None:
        self._fds.close()
        self._block_fds.close()
        if self._dir_fd is not None and self._dir_fd >= 0:
            os.close(self._dir_fd)
            # Not None: paths stay relative, and fail (EBADF) instead of naming the cwd.
            self._dir_fd = self._fds.dir_fd = self._block_fds.dir_fd = -1

    def _forget(self, path: str) -> None:
        self._fds.forget(path)
        self._block_fds.forget(path)

    def remove_stale_temporaries(self) -> int:
        """Delete temporary files left by processes that died mid-write; returns how many."""
        return sweep_stale(self.root, recursive=True, dir_fd=self._dir_fd)
