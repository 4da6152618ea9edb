"""A packed store opened for reading: samples by id, and a file-system view from the snapshot."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tierfeed.errors import ChunkCorruptError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.format.index import Index
from tierfeed.format.names import field_name, fields_of
from tierfeed.format.tree import PathStat, Tree
from tierfeed.storage.source import ChunkSource

__all__ = ["Sample", "Store"]

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


class Store:
    """Read samples and members of a store; list and stat its original tree (`tree`).

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
        self.tree = Tree(index, self.location)  # the packed tree, for `stat` and `listdir`

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

    # --- the original tree, answered from the snapshot (`tierfeed.format.tree`) ----------

    def stat(self, path: str | bytes) -> PathStat:
        """Size, kind, mode and mtime of ``path`` in the store's original tree (`Tree.stat`)."""
        return self.tree.stat(path)

    def listdir(self, path: str | bytes = "") -> list[str]:
        """Names directly under directory ``path``, sorted bytewise (`Tree.listdir`)."""
        return self.tree.listdir(path)

    def close(self) -> None:
        """Close the chunk source and unmap the index."""
        self.source.close()
        self.index.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
