"""The chunk files of a store directory as a ChunkSource, read through one `PosixDriver`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tierfeed.errors import ChunkCorruptError, IndexFormatError, NotFoundError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.files import safe_chunk_path
from tierfeed.storage.posix import PosixDriver
from tierfeed.storage.source import ChunkSource

__all__ = ["DirectoryChunks"]


class DirectoryChunks(ChunkSource):
    """A ChunkSource over chunk files in a directory (the store as packed, or any POSIX path).

    Reads go through a read-only `PosixDriver` over ``root``: one pread on a descriptor from
    its `FdCache` (at most ``max_open``, reference-counted, so a descriptor is never closed
    while another thread reads through it). This class adds what a chunk is: each read is
    bounded by the chunk's size in the index, and a missing or short chunk file is a damaged
    store (ChunkCorruptError), not a storage failure.

    Args:
        root: the directory holding the chunk files.
        chunks: the index's chunks (names relative to ``root``, sizes).
        index_path: the index, named in errors about its chunk names.
        max_open: descriptors kept open at most.
        direct: open chunk files ``O_DIRECT`` (see `PosixDriver`); falls back to buffered
            reads where the file system refuses.

    Raises:
        IndexFormatError: a chunk name would resolve outside ``root``.
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
        self._index_path = index_path
        self._paths: dict[int, Path] = {}  # checked when first read (millions of chunks)
        self.reads = 0
        self.bytes_read = 0
        self._driver = PosixDriver(root, read_only=True, direct=direct, max_open=max_open)

    @property
    def opens(self) -> int:
        """Chunk files opened so far."""
        return self._driver.opens

    def open_ahead(self, chunks: Sequence[int]) -> None:
        """Open these chunks' files in the background, in this order (see FdCache)."""
        self._driver.open_ahead([self._path(c)[1] for c in chunks])

    def _path(self, chunk: int) -> tuple[Path, str]:
        """Chunk ``chunk``'s file and name, its name checked to stay inside the store when
        first used (not for every chunk up front: an index may name millions).

        Raises:
            IndexFormatError: the chunk name would resolve outside the store.
        """
        path = self._paths.get(chunk)
        name = self.chunks[chunk].name
        if path is None:
            path = self._paths[chunk] = safe_chunk_path(self.root, name, self._index_path)
        return path, name

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``chunk`` at ``offset`` (one pread).

        Raises:
            IndexFormatError: the range is not inside the chunk as the index sizes it.
            ChunkCorruptError: the chunk file is missing or shorter than the range.
            StorageError: the chunk file cannot be read.
        """
        info = self.chunks[chunk]
        path, _ = self._path(chunk)
        if offset < 0 or length < 0 or offset + length > info.size:
            raise IndexFormatError(
                f"index points past the end of chunk {info.name} (range {offset}+{length} > "
                f"{info.size} bytes); the index is damaged, re-create it"
            )
        try:
            data = self._driver.read_range(info.name, offset, length)
        except NotFoundError:
            raise ChunkCorruptError(
                f"chunk {os.fspath(path)} is missing; the store is incomplete "
                "(run `tierfeed verify` on it)"
            ) from None
        self.reads += 1
        self.bytes_read += len(data)
        if len(data) != length:
            raise ChunkCorruptError(
                f"chunk {path} is truncated: wanted bytes {offset}..{offset + length}"
                f", got {len(data)}; run `tierfeed verify` and re-pack"
            )
        return data

    def close(self) -> None:
        """Close every cached descriptor not in use (those in use close on release)."""
        self._driver.close()
