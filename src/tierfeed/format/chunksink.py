"""Samples from Python into tar chunks: fill a `ChunkWriter`, close it at the chunk size, and
keep what the index needs of every committed chunk in a `ChunkRecord`.

Chunks close as pack closes them: when the next sample would take the chunk past the chunk
size; a sample never straddles two chunks, and a larger sample gets a chunk of its own. Members
have mtime 0, mode 0644 and uid/gid 0, so the same samples always give the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.encode import EncodedSample
from tierfeed.format.packplan import END_BYTES
from tierfeed.format.tarchunk import ChunkWriter, member_header, padding

__all__ = ["ChunkRecord", "ChunkSink"]


@dataclass
class ChunkRecord:
    """One committed chunk and its samples, as the index lists them (small enough to pickle
    from a worker process to the parent)."""

    name: str  # relative to the store root
    size: int
    checksum: int
    keys: list[bytes]
    cls: list[int | None]
    member_count: npt.NDArray[np.uint32]  # per sample
    ext: list[bytes]  # per member
    offset: npt.NDArray[np.uint64]
    length: npt.NDArray[np.uint64]
    member_checksum: npt.NDArray[np.uint64]


class ChunkSink:
    """Writes encoded samples into chunks named by ``name_of(n)`` under ``root``.

    Args:
        root: the store directory.
        chunk_size: target chunk size in bytes.
        name_of: store-relative name of this sink's ``n``-th chunk.
        on_commit: called with the record of every chunk once it is whole and renamed.
    """

    def __init__(
        self,
        root: Path,
        chunk_size: int,
        name_of: Callable[[int], str],
        on_commit: Callable[[ChunkRecord], object],
    ) -> None:
        self.root, self.chunk_size = root, chunk_size
        self._name_of, self._on_commit = name_of, on_commit
        self._writer: ChunkWriter | None = None
        self._name = ""
        self.chunks = 0
        self.samples = 0
        self.data_bytes = 0
        self._reset()

    def _reset(self) -> None:
        self._used = 0
        self._keys: list[bytes] = []
        self._cls: list[int | None] = []
        self._counts: list[int] = []
        self._ext: list[bytes] = []
        self._offset: list[int] = []
        self._length: list[int] = []
        self._sums: list[int] = []

    def add(self, sample: EncodedSample) -> None:
        """Append ``sample`` to the open chunk, or to a new one when it would not fit."""
        sizes = [memoryview(data).nbytes for _, data in sample.members]
        headers = [
            member_header(sample.key + ext, n)
            for (ext, _), n in zip(sample.members, sizes, strict=True)
        ]
        footprint = sum(len(h) + n + padding(n) for h, n in zip(headers, sizes, strict=True))
        if self._used and self._used + footprint + END_BYTES > self.chunk_size:
            self.flush()
        if self._writer is None:
            self._name = self._name_of(self.chunks)
            self._writer = ChunkWriter(self.root / self._name)
        for header, (ext, data) in zip(headers, sample.members, strict=True):
            self._offset.append(self._writer.add(header, data))
            self._sums.append(checksum_bytes(data))
            self._ext.append(ext)
        self._length.extend(sizes)
        self.data_bytes += sum(sizes)
        self._keys.append(sample.key)
        self._cls.append(sample.cls)
        self._counts.append(len(sample.members))
        self._used += footprint
        self.samples += 1

    def flush(self) -> None:
        """Commit the open chunk (if any) and report its record."""
        if self._writer is None:
            return
        size, checksum = self._writer.commit()
        self._writer = None
        record = ChunkRecord(
            name=self._name,
            size=size,
            checksum=checksum,
            keys=self._keys,
            cls=self._cls,
            member_count=np.asarray(self._counts, dtype=np.uint32),
            ext=self._ext,
            offset=np.asarray(self._offset, dtype=np.uint64),
            length=np.asarray(self._length, dtype=np.uint64),
            member_checksum=np.asarray(self._sums, dtype=np.uint64),
        )
        self.chunks += 1
        self._reset()
        self._on_commit(record)

    def abort(self) -> None:
        """Drop the open chunk's partial file (idempotent); committed chunks stay."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        self._reset()
