"""A rank's parts of split chunks, staged: the members of its own samples of a chunk cut
between partitions, copied from the origin in ranges, each checked against its checksum, and
published back to back as one segment (the inbox's form) in the rank's parts directory."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from tierfeed.distributed.holders import Part
from tierfeed.distributed.inbox import Inbox, part_name
from tierfeed.errors import ChunkCorruptError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.index import Index
from tierfeed.publish import publishing
from tierfeed.storage import Driver

__all__ = ["StagedParts", "part_bytes"]

_PART_READ = 8 << 20  # a part is read from the origin in ranges of about this many bytes


def part_bytes(index: Index, part: Part) -> int:
    """Bytes of a part at the origin: from its first member's data to its last one's end
    (the tar headers between them included: what stage-in reads)."""
    lo, hi = int(index.sample_member_start[part.first]), int(index.sample_member_start[part.end])
    if lo == hi:
        return 0
    end = int(index.member_offset[hi - 1]) + int(index.member_length[hi - 1])
    return end - int(index.member_offset[lo])


class StagedParts:
    """A rank's parts of split chunks: which members each holds, checked and copied.

    Args:
        index: the store's index.
        root: the rank's parts directory (created 0700).
    """

    def __init__(self, index: Index, root: Path) -> None:
        self.index = index
        self.inbox = Inbox(root)
        self._start = np.asarray(index.sample_member_start, dtype=np.int64)
        self._offset = np.asarray(index.member_offset, dtype=np.int64)
        self._length = np.asarray(index.member_length, dtype=np.int64)
        self._checksum = np.asarray(index.member_checksum)

    def members(self, part: Part) -> npt.NDArray[np.int64]:
        """The members of the part's samples, in store order."""
        return np.arange(self._start[part.first], self._start[part.end], dtype=np.int64)

    def nbytes(self, part: Part) -> int:
        """Bytes of the part at the origin (`part_bytes`)."""
        return part_bytes(self.index, part)

    def present(self, part: Part) -> bool:
        """Whether the part is published whole: its table names its members and each one's
        bytes match their checksum."""
        view, members = self.inbox.view, self.members(part)
        if any(view.locate(m) is None for m in members.tolist()):
            return False
        for m in members.tolist():
            data = view.read(m, int(self._length[m]))
            if data is None or checksum_bytes(data) != int(self._checksum[m]):
                return False
        return True

    def copy(self, origin: Driver, root: str, part: Part, bar: tqdm[Any]) -> None:
        """Read the part from the origin in consecutive ranges of ~8 MiB, check each member,
        and publish the members back to back (renamed into place only once every member matched)."""
        name = self.index.chunk_name(part.chunk)
        members = self.members(part)
        name_of = part_name(part.chunk)
        self.inbox.delete(name_of)  # a stale or damaged one: its table goes first
        hi = int(self._offset[members[0]]) if len(members) else 0
        with publishing(self.inbox.bin_path(name_of)) as out:
            for group in _groups(self._offset[members], self._length[members], members):
                lo = hi  # from where the last range ended: the headers between come along
                hi = int(self._offset[group[-1]] + self._length[group[-1]])
                data = origin.read_range(name, lo, hi - lo)
                for m in group.tolist():
                    start, length = int(self._offset[m]) - lo, int(self._length[m])
                    piece = data[start : start + length]
                    if len(piece) != length or checksum_bytes(piece) != int(self._checksum[m]):
                        key = self.index.key(self.index.member_owner(m))
                        raise ChunkCorruptError(
                            f"chunk {root}/{name} at the origin: member of {key!r} does not "
                            "match the index (size or checksum); run `tierfeed verify` on the "
                            "store and re-pack it"
                        )
                    out.write(piece)
                bar.update(hi - lo)
        self.inbox.add(name_of, members, self._length[members], fsync=True)

    def stage(self, origin: Driver, root: str, part: Part, bar: tqdm[Any]) -> tuple[int, bool]:
        """Copy ``part`` unless it is here and verified: (its bytes, whether it was copied)."""
        size = self.nbytes(part)
        if self.present(part):
            bar.update(size)
            return size, False
        self.copy(origin, root, part, bar)
        return size, True

    def close(self) -> None:
        """Close segment files."""
        self.inbox.close()

    def keep_only(self, parts: list[Part]) -> None:
        """Delete segments of parts this rank no longer stages (another plan or world)."""
        wanted = {part_name(p.chunk) for p in parts}
        for name in self.inbox.segments():
            if name not in wanted:
                self.inbox.delete(name)


def _groups(
    offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], members: npt.NDArray[np.int64]
) -> list[npt.NDArray[np.int64]]:
    """Runs of consecutive members spanning about `_PART_READ` bytes each (at least one)."""
    ends = offsets + lengths
    cuts = [0]
    for k in range(1, len(members)):
        if int(ends[k] - offsets[cuts[-1]]) > _PART_READ:
            cuts.append(k)
    cuts.append(len(members))
    return [members[a:b] for a, b in itertools.pairwise(cuts) if b > a]
