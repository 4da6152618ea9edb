"""A rank's node-local copies of samples, as the exchanger sees them: what it reads to send,
publishes when received, and deletes once sent away.

Errors here are storage errors; the window executor turns them into `ExchangeError`s that
name the rank, epoch and window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.holders import SampleHolders
from tierfeed.distributed.inbox import (
    Inbox,
    mark_punched,
    part_name,
    parts_dir,
    punch_holes,
    punched_dir,
)
from tierfeed.errors import ChunkCorruptError, StorageError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.index import Index
from tierfeed.storage import DirectoryChunks

__all__ = ["LocalCopies"]

IntArray = npt.NDArray[np.int64]


class LocalCopies:
    """The samples one rank holds: its node's staged chunks, its staged parts of split chunks
    and its inbox.

    Args:
        local_dir: the node-local store directory stage-in filled.
        inbox: the rank's inbox (cleared: what an earlier run received is not ours).
        holdings: who staged which sample.
        rank: this rank.
    """

    def __init__(self, local_dir: Path, inbox: Path, holdings: SampleHolders, rank: int) -> None:
        self.index = Index(local_dir)
        self.inbox = Inbox(inbox)
        self.inbox.clear()
        self.parts = Inbox(parts_dir(local_dir, rank))  # stage-in's: kept
        self.punched = punched_dir(local_dir, rank)
        self.holdings = holdings
        self.local = holdings.local_to(rank)
        self.rank = rank
        self.chunks = DirectoryChunks(self.index.path.parent, self.index.chunks(), self.index.path)
        self.sample_bytes = self.index.sample_bytes()
        self.sample_chunk = np.asarray(self.index.sample_chunk, dtype=np.int64)
        self._starts = np.asarray(self.index.sample_member_start, dtype=np.int64)
        self._lengths = np.asarray(self.index.member_length, dtype=np.int64)

    def staged(self) -> IntArray:
        """Samples this rank reads from local storage (whole chunks and its parts)."""
        everything = np.arange(len(self.sample_chunk), dtype=np.int64)
        return np.flatnonzero(self.holdings.local_samples(self.rank, everything)).astype(np.int64)

    def members(self, samples: IntArray) -> IntArray:
        """The members of ``samples``, sample by sample."""
        if len(samples) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(self._starts[s], self._starts[s + 1]) for s in samples])

    def payload(self, samples: IntArray) -> bytes:
        """The bytes of ``samples``' members, back to back (what a peer's inbox receives)."""
        return b"".join(self._member_bytes(m) for m in self.members(samples).tolist())

    def _member_bytes(self, member: int) -> bytes:
        index = self.index
        length = int(self._lengths[member])
        data = self.inbox.view.read(member, length)
        if data is not None:
            return data
        chunk = int(index.member_chunk[member])
        key = index.key(index.member_owner(member))
        data = self.parts.view.read(member, length)
        where = self.parts.root / f"{part_name(chunk)}.bin"
        if data is None:
            if not self.local[chunk]:
                raise StorageError(
                    f"rank {self.rank} was scheduled to send {key!r} but holds no copy"
                )
            data = self.chunks.read_range(chunk, int(index.member_offset[member]), length)
            where = self.chunks.root / index.chunk_name(chunk)
        if checksum_bytes(data) != int(index.member_checksum[member]):
            raise ChunkCorruptError(
                f"rank {self.rank}: {where} no longer holds {key!r} (sent away before a "
                "restart, or damaged); run stage-in again before restoring"
            )
        return data

    def publish(self, name: str, samples: IntArray, data: memoryview) -> None:
        """Publish received ``samples`` (their members' bytes back to back) as a segment."""
        members = self.members(samples)
        self.inbox.write(name, members, self._lengths[members], data)

    def discard(self, samples: IntArray) -> int:
        """Delete this rank's copies of samples it has sent away; returns bytes punched out of
        staged chunks."""
        members = self.members(samples)
        in_chunks = [
            m
            for m in members.tolist()
            if self.inbox.view.locate(m) is None and self.parts.view.locate(m) is None
        ]
        lengths = self._lengths[members]
        self.inbox.discard(members, lengths)
        self.parts.discard(members, lengths)
        by_chunk: dict[int, list[tuple[int, int]]] = {}
        for m in in_chunks:
            ranges = by_chunk.setdefault(int(self.index.member_chunk[m]), [])
            ranges.append((int(self.index.member_offset[m]), int(self._lengths[m])))
        punched = 0
        for chunk, ranges in by_chunk.items():
            mark_punched(self.punched, chunk)
            punched += punch_holes(self.index.path.parent / self.index.chunk_name(chunk), ranges)
        return punched

    def forget_read(self, epoch: int, before: int) -> None:
        """Delete received segments of earlier epochs, and of ``epoch`` before window
        ``before`` (read already)."""
        for name in self.inbox.segments():
            e, w = name.split("-")
            if int(e[1:]) < epoch or (int(e[1:]) == epoch and int(w[1:]) < before):
                self.inbox.delete(name)

    def forget_all(self) -> None:
        """Delete every received segment."""
        for name in self.inbox.segments():
            self.inbox.delete(name)

    def fail(self, message: str) -> None:
        """Leave a note that makes every reader of the inbox fail with ``message``."""
        self.inbox.fail(message)

    def close(self) -> None:
        """Release files."""
        self.chunks.close()
        self.inbox.close()
        self.parts.close()
        self.index.close()
