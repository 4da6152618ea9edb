"""Samples from Python into tar chunks: fill a `ChunkWriter`, close it at the chunk size, and
keep what the index needs of every committed chunk in a `ChunkRecord`.

Chunks close as pack closes them: when the next sample would take the chunk past the chunk
size; a sample never straddles two chunks, and a larger sample gets a chunk of its own. Members
have mtime 0, mode 0644 and uid/gid 0, so the same samples always give the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.chunksync import ChunkSyncer
from tierfeed.format.encode import EncodedSample
from tierfeed.format.packplan import END_BYTES
from tierfeed.format.tarchunk import BLOCK, ChunkWriter, cannot_write, member_header

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
        self._syncer = ChunkSyncer()  # each committed chunk is synced while the next fills
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
        key = sample.key
        members: list[tuple[bytes, bytes, bytes]] = []  # (ext, header, data)
        footprint = 0
        for ext, data in sample.members:
            # bytes as they are; any other buffer copied once, since the chunk's thread writes
            # it later and the caller may reuse it (a checksum must match what is written)
            data = data if type(data) is bytes else bytes(data)
            header = member_header(key + ext, len(data))
            footprint += len(header) + len(data) + (-len(data) % BLOCK)
            members.append((ext, header, data))
        if self._used and self._used + footprint + END_BYTES > self.chunk_size:
            self.flush()
        writer = self._writer
        if writer is None:
            self._name = self._name_of(self.chunks)
            writer = self._writer = ChunkWriter(self.root / self._name)
        for ext, header, data in members:
            self._offset.append(writer.add(header, data))
            self._sums.append(checksum_bytes(data))
            self._ext.append(ext)
            self._length.append(len(data))
            self.data_bytes += len(data)
        self._keys.append(key)
        self._cls.append(sample.cls)
        self._counts.append(len(members))
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
        self._syncer.add(self.root / record.name)
        self._on_commit(record)

    def finish(self) -> None:
        """Commit the open chunk and wait until every chunk of this sink is on disk.

        Raises:
            PackError: a chunk could not be written or synced (naming it).
        """
        self.flush()
        try:
            self._syncer.wait()
        except OSError as exc:
            raise cannot_write(Path(os.fsdecode(exc.filename or self.root)), exc) from None

    def abort(self) -> None:
        """Drop the open chunk's partial file (idempotent); committed chunks stay."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        self._syncer.close()
        self._reset()
