"""Read ranges of chunk files in a store directory with one pread each and a bounded fd cache."""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from tierfeed.errors import ChunkCorruptError, IndexFormatError, StorageError
from tierfeed.format.chunkref import ChunkInfo

__all__ = ["DirectoryChunks", "safe_chunk_path"]


def safe_chunk_path(root: Path, name: str, where: Path) -> Path:
    """``root / name`` after checking that ``name`` cannot resolve outside ``root``."""
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or ".." in parts or "\0" in name:
        raise IndexFormatError(f"{where}: chunk name {name!r} would resolve outside the store")
    return root.joinpath(*parts)


class _Fd:
    __slots__ = ("evicted", "fd", "refs")

    def __init__(self, fd: int) -> None:
        self.fd, self.refs, self.evicted = fd, 0, False


class DirectoryChunks:
    """A ChunkSource over chunk files in a directory (the store as packed, or any POSIX path).

    File descriptors are cached (at most ``max_open``) and reference-counted, so a descriptor
    is never closed while another thread reads through it and its number cannot be reused
    under a reader.

    With ``direct``, files are opened ``O_DIRECT``: reads bypass the page cache, so a second
    read of a range does not queue behind a first one that holds its pages locked (hedged
    reads on FUSE and NFS). Where the file system wants aligned direct reads (EINVAL), this
    source falls back to buffered reads.
    """

    def __init__(
        self,
        root: Path,
        chunks: Sequence[ChunkInfo],
        index_path: Path,
        max_open: int = 128,
        direct: bool = False,
    ) -> None:
        self.root = root
        self.chunks = chunks
        self._paths = [safe_chunk_path(root, c.name, index_path) for c in chunks]
        self._max_open = max_open
        self._open: OrderedDict[int, _Fd] = OrderedDict()
        self._mutex = threading.Lock()
        self.opens = 0
        self.reads = 0
        self.bytes_read = 0
        self._flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)

    def _acquire(self, chunk: int) -> _Fd:
        with self._mutex:
            entry = self._open.get(chunk)
            if entry is not None:
                self._open.move_to_end(chunk)
                entry.refs += 1
                return entry
        # Open outside the lock: an open that hangs on slow storage must not stall reads of
        # chunks that are already open. Two threads may race to open; the loser closes its own.
        try:
            fd = self._open_file(chunk)
        except FileNotFoundError:
            raise ChunkCorruptError(
                f"chunk {self._paths[chunk]} is missing; the store is incomplete "
                "(run `tierfeed verify` on it)"
            ) from None
        except OSError as exc:
            raise StorageError(f"{self._paths[chunk]}: {exc.strerror}") from None
        with self._mutex:
            self.opens += 1
            entry = self._open.get(chunk)
            if entry is not None:
                os.close(fd)
            else:
                entry = self._open[chunk] = _Fd(fd)
                while len(self._open) > self._max_open:
                    _, old = self._open.popitem(last=False)
                    old.evicted = True
                    if old.refs == 0:
                        os.close(old.fd)
            entry.refs += 1
            return entry

    def _open_file(self, chunk: int) -> int:
        try:
            return os.open(self._paths[chunk], self._flags)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self._flags & os.O_DIRECT:
                raise
            self._flags &= ~os.O_DIRECT  # no O_DIRECT on this file system
            return os.open(self._paths[chunk], self._flags)

    def _release(self, entry: _Fd) -> None:
        with self._mutex:
            entry.refs -= 1
            if entry.evicted and entry.refs == 0:
                os.close(entry.fd)

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``chunk`` at ``offset`` (one pread)."""
        info = self.chunks[chunk]
        if offset + length > info.size:
            raise IndexFormatError(
                f"index points past the end of chunk {info.name} (range {offset}+{length} > "
                f"{info.size} bytes); the index is damaged, re-create it"
            )
        entry = self._acquire(chunk)
        try:
            data = os.pread(entry.fd, length, offset)
        except OSError as exc:
            if exc.errno == errno.EINVAL and self._flags & os.O_DIRECT:
                # Unaligned direct reads refused here: read through the page cache instead.
                with open(self._paths[chunk], "rb", buffering=0) as fh:
                    data = os.pread(fh.fileno(), length, offset)
            else:
                raise StorageError(f"{self._paths[chunk]}: read failed: {exc.strerror}") from None
        finally:
            self._release(entry)
        self.reads += 1
        self.bytes_read += len(data)
        if len(data) != length:
            raise ChunkCorruptError(
                f"chunk {self._paths[chunk]} is truncated: wanted bytes {offset}..{offset + length}"
                f", got {len(data)}; run `tierfeed verify` and re-pack"
            )
        return data

    def close(self) -> None:
        """Close every cached descriptor not in use (those in use close on release)."""
        with self._mutex:
            for entry in self._open.values():
                entry.evicted = True
                if entry.refs == 0:
                    os.close(entry.fd)
            self._open.clear()
