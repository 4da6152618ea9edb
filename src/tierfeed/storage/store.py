"""A packed store opened for reading: samples by id, and a file-system view from the snapshot."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tierfeed.errors import ChunkCorruptError, IndexFormatError, NotFoundError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.format.index import Index
from tierfeed.format.names import field_name, fields_of
from tierfeed.storage.source import ChunkSource

__all__ = ["PathStat", "Sample", "Store"]

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
    """What `Store.stat` knows of a path, from the index alone.

    ``mode`` (permission bits) and ``mtime_ns`` are the packed tree's (its root's included)
    when the index holds the tree; otherwise 0o555 for a directory, 0o444 for a file, and the
    index file's mtime.
    """

    is_dir: bool
    size: int
    member: int = -1  # the member stored at this path; -1 for directories
    mode: int = 0o444
    mtime_ns: int = 0


class Store:
    """Read samples and members of a store; list and stat its original tree.

    Args:
        index: the opened index.
        source: where chunk bytes come from (e.g. `tierfeed.storage.DirectoryChunks` over
            the chunk files under the index's `chunk_root`, or a `TierStack`).
        verify_reads: check every member read against its xxh3 checksum (~GB/s per core).
        location: the store's URL, as errors name it and its chunks (default: the index's
            directory, its chunks named under its `chunk_root`).
        second_source: makes a second, independent way to the origin's chunks, for hedged
            reads (None: the chunk files beside the index, opened ``O_DIRECT``).
    """

    def __init__(
        self,
        index: Index,
        source: ChunkSource,
        verify_reads: bool = True,
        location: str | None = None,
        second_source: Callable[[], ChunkSource] | None = None,
    ) -> None:
        self.index = index
        self.verify_reads = verify_reads
        self.root = index.chunk_root  # the chunk files' directory (a store's own, or shards')
        self.location = location or str(index.path.parent)
        self._chunks_at = location or str(self.root)
        self.second_source = second_source
        self.chunks: Sequence[ChunkInfo] = index.chunks()
        self._field_names = [field_name(ext) for ext in index.exts]  # by extension id
        self._lowered = [name.lower() for name in self._field_names]  # (`fields_of`)
        self.source = source
        self._index_mtime_ns = os.stat(index.path).st_mtime_ns

    def __len__(self) -> int:
        return self.index.num_samples

    @property
    def classes(self) -> list[str]:
        """Class names; a sample's label indexes this list."""
        return self.index.classes

    def chunk_location(self, chunk: int) -> str:
        """Where chunk ``chunk`` of the origin lives (its path or URL), for messages."""
        return f"{self._chunks_at}/{self.chunks[chunk].name}"

    def read_member(self, member: int) -> bytes:
        """The bytes of one member (one range read), checked against the member's checksum.

        Bytes that fail the check and came from a cached copy drop that copy, and the member is
        read again one level further down (the next tier, at last the origin).

        Raises:
            ChunkCorruptError: no copy holds the bytes that were packed (names every copy
                that was bad, and the chunk and member).
        """
        ix = self.index
        ix.check_members([member])  # an index checked on use: this member's row
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
            try:
                data = self.source.read_range(chunk, offset, length)
            except ChunkCorruptError as exc:
                # The next copy down (the origin, copied anew) is bad too: name every copy.
                raise self._corrupt(member, chunk, dropped) from exc
        return data

    def _corrupt(self, member: int, chunk: int, dropped: list[str]) -> ChunkCorruptError:
        name = os.fsdecode(self.index.member_path_bytes(member))
        origin = self.chunk_location(chunk)
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

    def local(self, sample: int) -> bool:
        """Whether ``sample`` is read now from this host's memory or disk (see
        `ChunkSource.local`): its members all lie in its chunk."""
        chunk = int(self.index.sample_chunk[sample])
        if chunk >= len(self.chunks):  # an index checked on use: names what is wrong
            self.index.check_samples([sample])
        return self.source.local(chunk)

    def read_sample(self, sample: int) -> Sample:
        """Sample ``sample`` with every member's bytes, one range read per member."""
        ix = self.index
        if not 0 <= sample < ix.num_samples:
            raise IndexError(f"sample {sample} out of range [0, {ix.num_samples})")
        ix.check_samples([sample])  # an index checked on use: this sample's rows
        members = ix.members(sample)
        exts = [int(ix.member_ext[m]) for m in members]
        data = [self.read_member(m) for m in members]
        fields = fields_of(exts, data, self._field_names, self._lowered)
        return Sample(ix.key(sample), int(ix.sample_label[sample]), fields)

    def read_samples(self, samples: Sequence[int], rows_checked: bool = False) -> list[Sample]:
        """`read_sample` of each of ``samples``, in that order, for many at once: the index
        looked up in whole arrays, and each chunk's members read with one `read_ranges` in
        offset order. A member that fails its checksum is read again the way `read_member`
        reads it (dropping the bad copy). ``rows_checked``: the caller checked these
        samples' rows (`Index.check_samples`) already, as a loader does once an epoch.

        Raises:
            IndexError: a sample id out of range.
            ChunkCorruptError: as `read_member`.
        """
        if not samples:
            return []
        ix = self.index
        ids = np.asarray(samples, dtype=np.int64)
        if int(ids.min()) < 0 or int(ids.max()) >= ix.num_samples:
            bad = next(int(i) for i in ids if not 0 <= i < ix.num_samples)
            raise IndexError(f"sample {bad} out of range [0, {ix.num_samples})")
        if not rows_checked:
            ix.check_samples(ids)  # an index checked on use: these samples' rows
        first = ix.sample_member_start[ids].tolist()
        ends = ix.sample_member_start[ids + 1].tolist()
        members = np.fromiter(
            (m for lo, hi in zip(first, ends, strict=True) for m in range(lo, hi)), np.int64
        )
        chunks = ix.member_chunk[members].tolist()
        offsets = ix.member_offset[members].tolist()
        lengths = ix.member_length[members].tolist()
        data: list[bytes] = [b""] * len(members)
        by_chunk: dict[int, list[int]] = {}
        for k, chunk in enumerate(chunks):
            by_chunk.setdefault(chunk, []).append(k)
        for chunk, ks in by_chunk.items():
            ks.sort(key=offsets.__getitem__)
            got = self.source.read_ranges(chunk, [offsets[k] for k in ks], [lengths[k] for k in ks])
            for k, d in zip(ks, got, strict=True):
                data[k] = d
        if self.verify_reads:
            for k, want in enumerate(ix.member_checksum[members].tolist()):
                if checksum_bytes(data[k]) != want:
                    data[k] = self.read_member(int(members[k]))  # drops the bad copy, or raises
        names, lowered = self._field_names, self._lowered
        exts = ix.member_ext[members].tolist()
        labels = ix.sample_label[ids].tolist()
        out, k = [], 0
        for sample, lo, hi, label in zip(samples, first, ends, labels, strict=True):
            fields = fields_of(exts[k : k + hi - lo], data[k : k + hi - lo], names, lowered)
            out.append(Sample(ix.key(int(sample)), label, fields))
            k += hi - lo
        return out

    # --- the original tree, answered from the snapshot ---------------------------------

    @staticmethod
    def _clean(path: str | bytes) -> bytes:
        return os.fsencode(path).strip(b"/")

    def _dir_stat(self, at: int | None) -> PathStat:
        """A directory: the table's entry ``at``, or the defaults (root, no tree)."""
        ix = self.index
        if at is None or ix.dir_mode is None or ix.dir_mtime is None:
            return PathStat(True, 0, mode=0o555, mtime_ns=self._index_mtime_ns)
        return PathStat(True, 0, mode=int(ix.dir_mode[at]), mtime_ns=int(ix.dir_mtime[at]))

    def _find_dir(self, raw: bytes) -> int | None:
        """Position of directory ``raw`` in the index's directory table, or None."""
        dirs = self.index.dir_paths
        at = bisect_left(dirs, raw)
        return at if at < len(dirs) and dirs[at] == raw else None

    def stat(self, path: str | bytes) -> PathStat:
        """Size, kind, mode and mtime of ``path`` (relative to the store's original tree root).

        Raises:
            NotFoundError: no file or directory at ``path``.
        """
        raw = self._clean(path)
        if not raw:
            if self.index.root is not None:
                mode, mtime = self.index.root
                return PathStat(True, 0, mode=mode, mtime_ns=mtime)
            return self._dir_stat(None)
        ix = self.index
        member = ix.find_member(raw)
        if member is not None:
            size = int(ix.member_length[member])
            if ix.member_mode is None or ix.member_mtime is None:
                return PathStat(False, size, member, 0o444, self._index_mtime_ns)
            mode, mtime = int(ix.member_mode[member]), int(ix.member_mtime[member])
            return PathStat(False, size, member, mode, mtime)
        at = self._find_dir(raw)
        if at is not None:
            return self._dir_stat(at)
        prefix = raw + b"/"
        i = ix.bisect_path(prefix)
        if i < ix.num_members and ix.sorted_path(i).startswith(prefix):
            return self._dir_stat(None)
        raise NotFoundError(
            f"{self.location}: no file or directory {os.fsdecode(raw)!r} in the store"
        )

    def _table_children(self, prefix: bytes) -> list[bytes]:
        """Names of the directories directly under ``prefix`` in the directory table (sorted,
        checked on open): one binary search per child, skipping its descendants."""
        dirs = self.index.dir_paths
        i = bisect_left(dirs, prefix)
        names: list[bytes] = []
        while i < len(dirs) and dirs[i].startswith(prefix):
            name = dirs[i][len(prefix) :].split(b"/", 1)[0]
            names.append(name)
            i = max(bisect_left(dirs, prefix + name + b"0", i), i + 1)  # b"0" follows b"/"
        return names

    def subdirs(self, path: str | bytes) -> int | None:
        """How many directories lie directly under directory ``path`` (its link count is 2
        more), from the directory table: O(subdirectories · log dirs); None without the tree."""
        if not self.index.has_tree:
            return None
        raw = self._clean(path)
        return len(self._table_children(raw + b"/" if raw else b""))

    def listdir(self, path: str | bytes = "") -> list[str]:
        """Names directly under directory ``path``, sorted bytewise.

        Costs O(entries · log n): files are read off the path-sorted order, and each
        subdirectory is skipped with one binary search; directories without files come from
        the index's directory table the same way. Every step moves forward in the path order
        and the paths met must increase, so a crafted index whose order is not sorted ends in
        IndexFormatError after at most n steps, never in a loop.
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
        names.extend(n for n in self._table_children(prefix) if n not in seen)
        if not names and raw and not self.stat(raw).is_dir:
            raise NotFoundError(f"{self.location}: {os.fsdecode(raw)!r} is not a directory")
        return [os.fsdecode(n) for n in sorted(names)]

    def close(self) -> None:
        """Close the chunk source and unmap the index."""
        self.source.close()
        self.index.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
