"""A packed store opened for reading: samples by id, and a file-system view from the snapshot."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tierfeed.errors import ChunkCorruptError, IndexFormatError, NotFoundError
from tierfeed.format.chunkfiles import DirectoryChunks
from tierfeed.format.chunkref import ChunkInfo, ChunkSource, checksum_bytes
from tierfeed.format.index import Index
from tierfeed.format.names import field_name

__all__ = ["PathStat", "Sample", "Store", "open_store"]

_MAX_COPIES = 8  # cached copies a read may drop before it blames the origin (tiers are few)


@dataclass(frozen=True, repr=False)
class Sample:
    """One sample: its key, its class label (-1 when unlabelled) and its members by extension."""

    key: str
    label: int
    fields: dict[str, bytes]

    def __repr__(self) -> str:
        # Names and sizes only: a payload in a repr floods logs and tracebacks (an image is
        # ~100 KB), and the bytes say nothing a reader of a repr can use.
        sizes = ", ".join(f"{name!r}: <{len(data)} bytes>" for name, data in self.fields.items())
        return f"Sample(key={self.key!r}, label={self.label}, fields={{{sizes}}})"


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

        Bytes that fail the check and came from a cached copy drop that copy, and the member is
        read again one level further down (the next tier, at last the origin).

        Raises:
            ChunkCorruptError: no copy holds the bytes that were packed (names every copy
                that was bad, and the chunk and member).
        """
        ix = self.index
        chunk = int(ix.member_chunk[member])
        offset, length = int(ix.member_offset[member]), int(ix.member_length[member])
        data = self.source.read_range(chunk, offset, length)
        if not self.verify_reads:
            return data
        want = int(ix.member_checksum[member])
        dropped: list[str] = []
        while checksum_bytes(data) != want:
            copy = self.source.discard(chunk) if len(dropped) < _MAX_COPIES else None
            if copy is None:
                raise self._corrupt(member, chunk, dropped)
            dropped.append(copy)
            data = self.source.read_range(chunk, offset, length)
        return data

    def _corrupt(self, member: int, chunk: int, dropped: list[str]) -> ChunkCorruptError:
        name = os.fsdecode(self.index.member_path_bytes(member))
        origin = self.root / self.chunks[chunk].name
        if not dropped:
            return ChunkCorruptError(
                f"chunk {origin}: member {name!r} fails its checksum (the chunk was altered or "
                "damaged); run `tierfeed verify` and re-pack or re-stage"
            )
        return ChunkCorruptError(
            f"member {name!r} failed its checksum in the cached {', '.join(dropped)} (dropped) "
            f"and in the origin's chunk {origin} as well (the origin was altered or damaged); "
            "run `tierfeed verify` on the store and re-pack or restore it"
        )

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
        subdirectory is skipped with one binary search. Every step moves forward in the
        path order and the paths met must increase, so a crafted index whose order is not
        sorted ends in IndexFormatError after at most n steps, never in a loop.
        """
        raw = self._clean(path)
        prefix = raw + b"/" if raw else b""
        ix = self.index
        i = ix.bisect_path(prefix)
        names: list[bytes] = []
        seen: set[bytes] = set()
        previous = b""
        while i < ix.num_members:
            p = ix.sorted_path(i)
            if not p.startswith(prefix):
                break
            rest = p[len(prefix) :]
            slash = rest.find(b"/")
            name = rest if slash < 0 else rest[:slash]
            if p <= previous or name in seen or name in (b"", b".", b".."):
                raise IndexFormatError(
                    f"{ix.path}: damaged index: the path order is not sorted or holds an "
                    f"unsafe path at {os.fsdecode(p)!r}; re-create it (`tierfeed pack` or "
                    "`tierfeed index`)"
                )
            names.append(name)
            seen.add(name)
            previous = p
            if slash < 0:
                i += 1
            else:
                after = ix.bisect_path(prefix + name + b"0")  # b"0" sorts right after b"/"
                i = max(after, i + 1)  # always forward: the next path is checked above
        if not names and raw and not self.stat(raw).is_dir:
            raise NotFoundError(f"{self.root}: {os.fsdecode(raw)!r} is not a directory")
        return [os.fsdecode(n) for n in sorted(names)]

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
