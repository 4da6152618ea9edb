"""The POSIX driver: objects are files under a root directory; writes are tmp-then-rename."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from tierfeed.errors import NotFoundError, ReadOnlyError, StorageError
from tierfeed.publish import is_temporary, publish, sweep_stale, temporary_path
from tierfeed.storage.driver import Driver
from tierfeed.storage.files import FdCache, path_under, pread

__all__ = ["PosixDriver"]

# A hard link cannot be made here: another file system, or one without links (or not for us).
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})


class PosixDriver(Driver):
    """Files under ``root``: the one POSIX reader (one pread on a cached descriptor).

    Args:
        root: the directory (created, mode 0700 unless ``shared``, when writable).
        read_only: refuse writes and deletes.
        shared: create directories 0755 and files 0644 (a cache shared between users,
            configured explicitly); otherwise 0700 and 0600, private to their creator.
        direct: open files ``O_DIRECT``: reads bypass the page cache, so a second read of a
            range does not queue behind a first one that holds its pages locked (hedged reads
            on FUSE and NFS). Where the file system refuses O_DIRECT opens, or wants aligned
            direct reads (EINVAL), reads go through the page cache instead.
        max_open: descriptors kept open at most (see `FdCache`).
    """

    name = "posix"

    def __init__(
        self,
        root: str | os.PathLike[str],
        read_only: bool = False,
        shared: bool = False,
        direct: bool = False,
        max_open: int = 128,
    ):
        super().__init__(read_only)
        self.root = Path(root).absolute()
        self._dir_mode, self._file_mode = (0o755, 0o644) if shared else (0o700, 0o600)
        if not read_only:
            self._make_root(shared)
        self.name = f"posix:{self.root}"
        flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
        self._fds = FdCache(max_open, flags)  # no open per read: the origin sees one per file
        # `read_block`'s: O_DIRECT descriptors (opened when a copy first reads the file).
        self._block_fds = self._fds if direct else FdCache(max_open, flags | os.O_DIRECT)
        self._opens_counted = 0
        self._resolved_paths: dict[str, str] = {}

    def _make_root(self, shared: bool) -> None:
        """Create the root, or take over an existing one: a private cache is made 0700 even
        when the directory was there before (other users must not read or plant chunks)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=self._dir_mode)
            st = os.stat(self.root)
            if not shared and stat.S_IMODE(st.st_mode) & 0o077:
                if st.st_uid != os.getuid():
                    raise StorageError(
                        f"{self.root}: cache directory belongs to another user (uid "
                        f"{st.st_uid}) and is open to others; use a directory of your own, or "
                        "ask for a shared cache explicitly"
                    )
                os.chmod(self.root, 0o700)
        except OSError as exc:
            if isinstance(exc, StorageError):
                raise
            raise StorageError(
                f"{self.root}: cannot be used as a cache directory ({exc.strerror or exc}); "
                "give a writable directory path"
            ) from None

    def _path(self, path: str) -> Path:
        return path_under(
            self.root, path, lambda: StorageError(f"{self}: path {path!r} would leave the root")
        )

    def _fail(self, path: str, exc: OSError) -> StorageError:
        if exc.errno == errno.ENOENT:
            return NotFoundError(f"{self}: no object {path!r}")
        return StorageError(f"{self}: {path}: {exc.strerror or exc}")

    def _resolved(self, path: str) -> str:
        """``path`` checked and made absolute, once per path (reads are hot)."""
        full = self._resolved_paths.get(path)
        if full is None:
            full = self._resolved_paths[path] = os.fspath(self._path(path))
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
            entry = fds.acquire(full)  # not `with fds.fd(...)`: a generator per read costs ~2 us
            try:
                out = [
                    pread(entry.fd, full, n, o, fds.flags)
                    for o, n in zip(offsets, lengths, strict=True)
                ]
            finally:
                fds.release(entry)
        except OSError as exc:
            raise self._fail(path, exc) from None
        self.counters.add(reads=len(out), bytes_read=sum(map(len, out)))
        self._count_opens()
        return out

    def _count_opens(self) -> None:
        opens = self.opens
        if opens != self._opens_counted:  # opens are rare: no second lock per read
            self._opens_counted = opens
            self.counters.set(opens=opens)

    def read_block(self, path: str, offset: int, length: int) -> bytes:
        """``read_range`` through O_DIRECT descriptors of its own, where the file system allows
        them: a copy's piece is then the one read of its bytes at the origin (through the page
        cache the kernel's readahead read 0.9-1.9% of a store twice over FUSE,
        `bench/cold_path.py`), and waits for no page a stalled read holds locked. Into an
        aligned buffer where the file system wants one; through the page cache where it
        refuses O_DIRECT."""
        return self._read_through(self._block_fds, path, (offset,), (length,))[0]

    def size(self, path: str) -> int:
        self.counters.add(stats=1)
        try:
            return self._path(path).stat().st_size
        except OSError as exc:
            raise self._fail(path, exc) from None

    def list(self, prefix: str = "") -> list[str]:
        self.counters.add(lists=1)
        out = []
        for dirpath, _, names in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in names:
                p = name if rel == "." else f"{rel}/{name}"
                if p.startswith(prefix) and not is_temporary(name):
                    out.append(p)
        return sorted(out)

    def _write(self, path: str, data: bytes) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True, mode=self._dir_mode)
        try:
            publish(target, data, mode=self._file_mode)
        except OSError as exc:
            raise self._fail(path, exc) from None
        self._forget(os.fspath(target))

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
        target = self._path(path)
        temporary = temporary_path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True, mode=self._dir_mode)
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()  # left by a link of this process that failed midway
            try:
                os.link(source, temporary)
            except OSError as exc:
                if exc.errno in _NO_LINK:
                    return False
                raise
            try:
                if os.stat(temporary).st_ino != os.fstat(fd).st_ino:
                    return False  # ``source`` names another file now
                os.chmod(temporary, self._file_mode)
                os.replace(temporary, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    temporary.unlink()
        except OSError as exc:
            raise self._fail(path, exc) from None
        self._forget(os.fspath(target))
        self.counters.add(writes=1, links=1)
        return True

    def for_hedges(self) -> Driver:
        """The same files, read-only and ``O_DIRECT`` (descriptors of its own): a second read
        of a range does not wait for pages that a stalled first read holds locked (FUSE,
        NFS)."""
        return PosixDriver(self.root, read_only=True, direct=True)

    def _delete(self, path: str) -> None:
        target = self._path(path)
        try:
            target.unlink()
        except OSError as exc:
            raise self._fail(path, exc) from None
        self._forget(os.fspath(target))

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

    def _forget(self, path: str) -> None:
        self._fds.forget(path)
        self._block_fds.forget(path)

    def remove_stale_temporaries(self) -> int:
        """Delete temporary files left by processes that died mid-write; returns how many."""
        return sweep_stale(self.root, recursive=True)
