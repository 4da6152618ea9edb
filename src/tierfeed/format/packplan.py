"""Where every member of a pack goes: chunk assignment, tar layout, per-chunk fingerprints and
the permission bits of the store's files.

Pure functions of the source listing and the chunk size, so that a re-run of an interrupted
pack knows which finished chunks it can keep.

A store file grants its group and others no more than the source did: a chunk is readable by
a class (group, others) only where one of its members is readable by that class in the source
and every directory above that member in the tree (the root included) lets the class through;
the index, which names every file, only where some member of the store is. Nothing the store
holds is ever writable by anyone but the one who packed it, who keeps read and write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from tierfeed.format.source import SourceDir, SourceFile, SourceTree
from tierfeed.format.tarchunk import BLOCK, header_length, member_header, padding

__all__ = ["OWNER_BITS", "SHARED_READ", "PackPlan", "plan_pack", "shared_bits"]

END_BYTES = 2 * BLOCK
OWNER_BITS = 0o600  # the packer reads (verify, resume) and replaces what it wrote
SHARED_READ = 0o044  # all a store file may grant its group and others: reading


@dataclass
class PackPlan:
    """Members in store order with their chunk, header length and extension id."""

    files: list[SourceFile]
    member_sample: npt.NDArray[np.int64]
    member_ext: npt.NDArray[np.uint16]
    member_chunk: npt.NDArray[np.int64]
    header_len: npt.NDArray[np.int64]
    exts: list[bytes]
    chunk_size: int
    num_chunks: int
    member_shared: npt.NDArray[np.uint16]  # group and other read bits each member keeps
    # Which share of a larger source this plan packs (`tierfeed.format.parts`), for the index.
    part: dict[str, Any] | None = None

    def file_mode(self, members: range | list[int] | npt.NDArray[np.intp]) -> int:
        """Permission bits of a store file holding ``members`` (see the module)."""
        return OWNER_BITS | int(np.bitwise_or.reduce(self.member_shared[members]))

    def chunk_members(self, chunk: int) -> range:
        """Planned member ids of ``chunk`` (contiguous)."""
        lo = int(np.searchsorted(self.member_chunk, chunk, side="left"))
        hi = int(np.searchsorted(self.member_chunk, chunk, side="right"))
        return range(lo, hi)

    def fingerprint(self, chunk: int) -> str:
        """Identity of a chunk's planned content: names, sizes, mtimes and modes of its files."""
        h = xxhash.xxh3_64()
        h.update(b"tierfeed-chunk-v1:%d;" % self.chunk_size)
        for m in self.chunk_members(chunk):
            f = self.files[m]
            h.update(b"%d:%s:%d:%d:%d;" % (len(f.rel), f.rel, f.size, f.mtime, f.mode))
        return h.hexdigest()

    def layout(self, members: list[int]) -> tuple[list[int], int]:
        """Data offsets of ``members`` written back to back into one chunk, and its size."""
        offsets = []
        pos = 0
        for m in members:
            pos += int(self.header_len[m])
            offsets.append(pos)
            size = self.files[m].size
            pos += size + padding(size)
        return offsets, pos + END_BYTES

    def header(self, member: int) -> bytes:
        """The tar header of a planned member."""
        f = self.files[member]
        return member_header(f.rel, f.size, f.mtime, f.mode)


def plan_pack(tree: SourceTree, chunk_size: int) -> PackPlan:
    """Assign samples to chunks greedily in order; a sample never straddles two chunks.

    A chunk is closed when the next sample would take it past ``chunk_size``; a sample larger
    than ``chunk_size`` gets a chunk of its own.
    """
    files: list[SourceFile] = []
    sample_of: list[int] = []
    ext_of: list[bytes] = []
    for i, sample in enumerate(tree.samples):
        for ext, f in sample.files:
            files.append(f)
            sample_of.append(i)
            ext_of.append(ext)
    exts = sorted(set(ext_of))
    ext_id = {e: i for i, e in enumerate(exts)}
    header_len = np.fromiter(
        (header_length(f.rel, f.size, f.mtime) for f in files),
        dtype=np.int64,
        count=len(files),
    )
    sizes = np.fromiter((f.size for f in files), dtype=np.int64, count=len(files))
    footprint = header_len + sizes + (-sizes % BLOCK)
    member_sample = np.asarray(sample_of, dtype=np.int64)
    sample_bytes = np.bincount(member_sample, weights=footprint, minlength=len(tree.samples))
    sample_chunk = np.empty(len(tree.samples), dtype=np.int64)
    chunk, used = 0, 0
    for i, nbytes in enumerate(sample_bytes.astype(np.int64).tolist()):
        if used and used + nbytes + END_BYTES > chunk_size:
            chunk, used = chunk + 1, 0
        sample_chunk[i] = chunk
        used += nbytes
    return PackPlan(
        files=files,
        member_sample=member_sample,
        member_ext=np.asarray([ext_id[e] for e in ext_of], dtype=np.uint16),
        member_chunk=sample_chunk[member_sample],
        header_len=header_len,
        exts=exts,
        chunk_size=chunk_size,
        num_chunks=chunk + 1 if files else 0,
        member_shared=shared_bits(files, tree.dirs or []),
    )


def shared_bits(files: list[SourceFile], dirs: list[SourceDir]) -> npt.NDArray[np.uint16]:
    """The group and other read bits each of ``files`` keeps in the store: its own, for each
    class that every directory of ``dirs`` above it (the root ``b""`` included) lets through;
    a directory ``dirs`` does not list (none recorded) takes none away."""
    modes = {d.rel: d.mode for d in dirs}
    through: dict[bytes, int] = {}  # directory -> the read bits that reach into it

    def reach(rel: bytes) -> int:
        # From the nearest directory already known down to ``rel``: no recursion, any depth.
        path = [rel]
        while path[-1] and path[-1] not in through:
            path.append(path[-1].rpartition(b"/")[0])
        bits = SHARED_READ
        for at in reversed(path):
            if at in through:
                bits = through[at]
                continue
            mode = modes.get(at)
            if mode is not None:  # search (x) for a class keeps that class's read bit
                bits &= (0o040 if mode & 0o010 else 0) | (0o004 if mode & 0o001 else 0)
            through[at] = bits
        return bits

    return np.fromiter(
        (f.mode & SHARED_READ & reach(f.rel.rpartition(b"/")[0]) for f in files),
        dtype=np.uint16,
        count=len(files),
    )
