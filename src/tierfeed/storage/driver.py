"""The storage driver protocol: a few primitives; everything else is derived once, here."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierfeed.errors import NotFoundError, ReadOnlyError, StorageError
from tierfeed.publish import PendingFile
from tierfeed.telemetry.counters import Counters

__all__ = ["GET_BLOCK", "Driver", "OpCounters"]

GET_BLOCK = 16 * 2**20  # bytes per ranged read of `Driver.get_file`


@dataclass
class OpCounters(Counters[int]):
    """Operations a driver served; a thread-safe tally (`add`, `set`), read with `snapshot()`."""

    opens: int = 0
    reads: int = 0
    bytes_read: int = 0
    writes: int = 0
    bytes_written: int = 0
    links: int = 0  # objects stored by linking a file in (`Driver.adopt`): no bytes written
    deletes: int = 0
    stats: int = 0
    lists: int = 0
    retries: int = 0  # transient failures tried again (throttling, timeouts)


class Driver(ABC):
    """A place that stores whole objects by path: a directory, RAM, an object store.

    Subclasses implement five primitives; reads of whole objects, existence checks and the
    read-only guard are derived here. Errors leave a driver as tierfeed errors only.

    Args:
        read_only: refuse writes and deletes (the origin is always read-only).
    """

    name = "driver"

    def __init__(self, read_only: bool = False) -> None:
        self.read_only = read_only
        self.counters = OpCounters()

    # --- primitives ---------------------------------------------------------------------

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (fewer only at the end of the object)."""

    def read_ranges(self, path: str, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Several ranges of one object, in the order given (a driver may serve them with one
        open or one request)."""
        return [self.read_range(path, o, n) for o, n in zip(offsets, lengths, strict=True)]

    @abstractmethod
    def size(self, path: str) -> int:
        """Size of the object in bytes. Raises NotFoundError."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Paths of the objects under ``prefix``, sorted."""

    @abstractmethod
    def _write(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` atomically: whole or not at all."""

    @abstractmethod
    def _delete(self, path: str) -> None:
        """Remove the object. Raises NotFoundError."""

    # --- derived ------------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        """The whole object."""
        return self.read_range(path, 0, self.size(path))

    def exists(self, path: str) -> bool:
        """Whether an object is stored at ``path``."""
        try:
            self.size(path)
        except NotFoundError:
            return False
        return True

    def write(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` atomically. Raises ReadOnlyError on read-only storage."""
        if self.read_only:
            raise ReadOnlyError(f"{self}: read-only; refusing to write {path}")
        self._write(path, data)
        self.counters.add(writes=1, bytes_written=len(data))

    def adopt(self, path: str, source: Path, fd: int) -> bool:
        """Make the file ``source`` (open as ``fd``: whole, checked, and never written again)
        the object at ``path`` without copying its bytes, where the driver can (a hard link
        on the same file system); False where it cannot: the caller writes the bytes.

        A driver that stores elsewhere than local files (RAM, an object store) cannot.
        """
        return False

    def get_file(
        self, path: str, local: Path, fsync: bool = False, dir_fd: int | None = None
    ) -> int:
        """Copy object ``path`` to the file ``local`` (temporary name, then rename: whole or
        absent), in ranged reads of `GET_BLOCK`; returns its size. With ``dir_fd`` (a checked
        cache directory), ``local`` is relative to it (`tierfeed.publish.PendingFile`).

        Raises:
            StorageError: a read returned fewer bytes than the object's size says (it changed
                while copied, or the store is damaged), or the store could not be read.
            OSError: ``local`` could not be written (the caller names it).
        """
        size = self.size(path)
        with PendingFile(local, mode=0o600, fsync=fsync, dir_fd=dir_fd) as out:
            for offset in range(0, size, GET_BLOCK):
                want = min(GET_BLOCK, size - offset)
                data = self.read_whole_file(path, offset, want)
                if len(data) != want:
                    raise StorageError(
                        f"{self}: {path}: {size} bytes listed, but the read at {offset} gave "
                        f"{len(data)} of {want}; the object changed or the store is damaged"
                    )
                out.write(data)
        return size

    def read_whole_file(self, path: str, offset: int, length: int) -> bytes:
        """A range of `get_file`'s object (an index, fetched by the process that opens a
        store, usually before it forks its DataLoader workers). The default: `read_range`."""
        return self.read_range(path, offset, length)

    def put_file(self, local: Path, path: str) -> None:
        """Store the file ``local`` at ``path`` atomically (an upload). Raises ReadOnlyError on
        read-only storage. The default reads the file whole and writes it."""
        self.write(path, local.read_bytes())

    def delete(self, path: str) -> None:
        """Remove the object at ``path``. Raises ReadOnlyError on read-only storage."""
        if self.read_only:
            raise ReadOnlyError(f"{self}: read-only; refusing to delete {path}")
        self._delete(path)
        self.counters.add(deletes=1)

    # --- optional abilities (harmless defaults; a driver that has one overrides it) --------

    @property
    def directory(self) -> Path | None:
        """The local directory holding the objects as files, or None (RAM, object stores)."""
        return None

    def open_ahead(self, paths: Sequence[str], blocks: bool = False) -> None:
        """Hint: these objects are read next, in this order; open them in the background;
        ``blocks``: for copies too (`read_block`). The default opens nothing."""
        return None

    # Origin requests in flight that this store serves well at once, where the fetch tuner
    # starts: 0 (no preference, a few: a file system); many for an object store, whose every
    # connection is slow.
    parallel_requests = 0
    # Each request is slow or billed (an object store's GET): a read of a chunk whose copy is
    # in flight waits for the copy (boundedly) rather than make a request of its own.
    costly_requests = False

    def etag(self, path: str) -> str | None:
        """The version tag of object ``path`` (an object store's ETag), or None where the store
        keeps none (files: their size and the index's checksums tell a change)."""
        return None

    def read_block(self, path: str, offset: int, length: int) -> bytes:
        """A large range of object ``path`` for a whole-chunk copy (a piece of it), read where
        the driver can past the page cache, so that the copy is the one read of those bytes.
        The default: `read_range`.

        Raises:
            NotFoundError: no such object.
            StorageError: the read failed.
        """
        return self.read_range(path, offset, length)

    def read_parts(self, path: str, offset: int, length: int) -> Sequence[Any]:
        """`read_block`'s bytes as the buffers they arrived in (bytes, or any object with the
        buffer protocol), in order, for a writer that takes them as they are (``os.pwritev``):
        no copy joins them first. The default: one, `read_block`'s."""
        return [self.read_block(path, offset, length)]

    def for_hedges(self) -> Driver:
        """A second way to the same objects for a request made beside a stalled one, which
        must not queue behind it (a file's pages that the stalled read holds locked); the
        caller closes it when it is not this driver. The default: this driver itself (an
        object store's second GET takes a connection of its own anyway)."""
        return self

    def holds_whole(self, path: str) -> bool:
        """Whether every byte of object ``path`` can be read here (tiers copy only such
        objects). The default: yes, for every object it has."""
        return True

    def begin_epoch(self) -> None:
        """A new epoch starts: load what changed between epochs (a job namespace's inbox).
        The default has nothing to load."""
        return None

    def remove_stale_temporaries(self) -> int:
        """Delete temporaries left by processes that died mid-write; returns how many. The
        default keeps no temporaries."""
        return 0

    def close(self) -> None:  # noqa: B027 - most drivers hold nothing to release
        """Release files and connections; idempotent."""

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
