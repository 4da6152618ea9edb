"""A packed store opened for reading: samples by id, and a file-system view from the snapshot."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tierfeed.errors import ChunkCorruptError, NotFoundError
from tierfeed.format.chunkfiles import DirectoryChunks
from tierfeed.format.chunkref import ChunkInfo, ChunkSource, checksum_bytes
from tierfeed.format.index import Index
from tierfeed.format.names import field_name

__all__ = ["PathStat", "Sample", "Store", "open_store"]


@dataclass(frozen=True)
class Sample:
    """One sample: its key, its class label (-1 when unlabelled) and its members by extension."""

    key: str
    label: int
    fields: dict[str, bytes]


@dataclass(frozen=True)
class PathStat:
    """What `Store.stat` knows of a path, from the index alone."""

    is_dir: bool
    size: int
    member: int = -1  # the member stored at this path; -1 for directories


class Store:
    """Read samples and members of a store; list and stat its original tree.

    Args:
        index: the opened index.
        source: where chunk bytes come from (default: the chunk files beside the index).
        verify_reads: check every member read against its xxh3 checksum (~GB/s per core).
    """

    def __init__(
        self, index: Index, source: ChunkSource | None = None, verify_reads: bool = True
    ) -> None:
        self.index = index
        self.verify_reads = verify_reads
        self.root = index.path.parent
        self.chunks: list[ChunkInfo] = index.chunks()
        self.source: ChunkSource = source or DirectoryChunks(self.root, self.chunks, index.path)

    def __len__(self) -> int:
        return self.index.num_samples

    @property
    def classes(self) -> list[str]:
        """Class names; a sample's label indexes this list."""
        return self.index.classes

    def read_member(self, member: int) -> bytes:
        """The bytes of one member (one range read), checked against the member's checksum.

        Raises:
            ChunkCorruptError: the bytes differ from what was packed (names chunk and member).
        """
        ix = self.index
        chunk = int(ix.member_chunk[member])
        data = self.source.read_range(
            chunk, int(ix.member_offset[member]), int(ix.member_length[member])
        )
        if self.verify_reads and checksum_bytes(data) != int(ix.member_checksum[member]):
            raise ChunkCorruptError(
                f"chunk {self.root / self.chunks[chunk].name}: member "
                f"{os.fsdecode(ix.member_path_bytes(member))!r} fails its checksum (the chunk was "
                "altered or damaged); run `tierfeed verify` and re-pack or re-stage"
            )
        return data

    def read_sample(self, sample: int) -> Sample:
        """Sample ``sample`` with every member's bytes, one range read per member."""
        ix = self.index
        if not 0 <= sample < ix.num_samples:
            raise IndexError(f"sample {sample} out of range [0, {ix.num_samples})")
        fields = {
            field_name(ix.exts[int(ix.member_ext[m])]): self.read_member(m)
            for m in ix.members(sample)
        }
        return Sample(ix.key(sample), int(ix.sample_label[sample]), fields)

    # --- the original tree, answered from the snapshot ---------------------------------

    @staticmethod
    def _clean(path: str | bytes) -> bytes:
        return os.fsencode(path).strip(b"/")

    def stat(self, path: str | bytes) -> PathStat:
        """Size and kind of ``path`` (relative to the store's original tree root).

        Raises:
            NotFoundError: no file or directory at ``path``.
        """
        raw = self._clean(path)
        if not raw:
            return PathStat(True, 0)
        member = self.index.find_member(raw)
        if member is not None:
            return PathStat(False, int(self.index.member_length[member]), member)
        prefix = raw + b"/"
        i = self.index.bisect_path(prefix)
        if i < self.index.num_members and self.index.sorted_path(i).startswith(prefix):
            return PathStat(True, 0)
        raise NotFoundError(f"{self.root}: no file or directory {os.fsdecode(raw)!r} in the store")

    def listdir(self, path: str | bytes = "") -> list[str]:
        """Names directly under directory ``path``, sorted bytewise.

        Costs O(entries · log n): files are read off the path-sorted order, and each
        subdirectory is skipped with one binary search.
        """
        raw = self._clean(path)
        prefix = raw + b"/" if raw else b""
        ix = self.index
        i = ix.bisect_path(prefix)
        names: list[str] = []
        while i < ix.num_members:
            p = ix.sorted_path(i)
            if not p.startswith(prefix):
                break
            rest = p[len(prefix) :]
            slash = rest.find(b"/")
            if slash < 0:
                names.append(os.fsdecode(rest))
                i += 1
            else:
                sub = rest[:slash]
                names.append(os.fsdecode(sub))
                i = ix.bisect_path(prefix + sub + b"0")  # b"0" sorts right after b"/"
        if not names and raw and not self.stat(raw).is_dir:
            raise NotFoundError(f"{self.root}: {os.fsdecode(raw)!r} is not a directory")
        return sorted(names, key=os.fsencode)

    def close(self) -> None:
        """Close the chunk source and unmap the index."""
        self.source.close()
        self.index.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(path: str | os.PathLike[str], source: ChunkSource | None = None) -> Store:
    """Open the store at ``path`` (its directory or its index file).

    Raises:
        IndexFormatError: no index, another format version, or a damaged index.
    """
    return Store(Index(Path(path)), source)
