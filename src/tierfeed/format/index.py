"""The metadata snapshot: open an index file by mapping its arrays (`indexwrite` writes one)."""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_left
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.format.chunkref import ChunkInfo
from tierfeed.format.chunktable import ChunkTable
from tierfeed.format.indexcheck import (
    check_invariants,
    check_member_rows,
    check_open,
    check_sample_rows,
    check_sections,
    concat_ranges,
    damaged,
    distinct,
)
from tierfeed.format.indexfile import (
    map_arrays,
    open_index_file,
    open_index_path,
    read_header,
    sections_checksum,
)
from tierfeed.format.indexstamp import STAMP_ABOVE_BYTES, has_stamp, one_checker, stamp
from tierfeed.format.indexwrite import IndexContent, write_index
from tierfeed.format.layout import ROW_CHECKS_SINCE
from tierfeed.format.rowcheck import name_check
from tierfeed.format.treecheck import check_path_order, check_tree, check_tree_members

__all__ = ["CHECKSUM_ON_OPEN_BYTES", "ChunkTable", "Index", "IndexContent", "write_index"]


# Indexes whose sections total at most this many bytes (about 3M one-file samples) have their
# sections checksum verified on open: tens of ms at most (xxh3), and it catches every bit
# flip; larger ones rely on the invariant checks on open and `tierfeed verify` for the rest.
CHECKSUM_ON_OPEN_BYTES = 256 * 2**20
# `Index.check_samples` sorts more rows than this first (BENCHMARKS: "Row checks of format 3").
_SORT_ROWS_ABOVE = 4096


class Index:
    """A memory-mapped index: O(1) lookup by sample id, O(log n) by path.

    Arrays are views of the mapping. Opening validates the header, the section table and
    the invariants readers rely on (vectorised, see `tierfeed.format.indexcheck`), and the
    sections checksum when the sections total at most `CHECKSUM_ON_OPEN_BYTES`; any damage
    found raises IndexFormatError naming the file. A large index that passed is stamped
    (`tierfeed.format.indexstamp`): opening it again, unchanged, on this host skips the
    O(samples) checks, unless ``recheck`` (what `tierfeed verify` asks for). Lookups by
    path stay safe on a crafted index whose path order is not sorted: they end, and
    `Store.listdir` raises when it meets paths out of order; `check_path_order` (run by
    `tierfeed verify`) checks it in full.

    Checked on use (``lazy``): a large index that this host has not stamped opens in O(1)
    (O(directories) with a tree), its O(samples) and O(chunks) invariants unchecked
    (``checked`` is False), and each row is checked when it is used: `check_samples` and
    `check_members` on the rows a reader takes (`Store`'s reads and the loader call them),
    a chunk's row when `chunks()` first makes its entry, and the scalar lookups check their
    own row.
    A rank of a large job then never reads the whole index: only its rows, every epoch.
    What is global (the chunk order of the samples, the path order a permutation) is not
    needed to read rows: plans stay permutations without it (`DatasetShape.chunk_starts`),
    and lookups by path check the member ids they meet. `check_all` checks in full and
    stamps, for whole-index walks (a mount, stage-in).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        recheck: bool = False,
        lazy: bool = False,
        fd: int | None = None,
    ) -> None:
        self.path = Path(path).absolute()  # chunk paths must not depend on a later chdir
        if fd is None:  # a store's directory or its index, at the origin: hedged
            self.path, self._stat, self._mm = open_index_path(self.path)
        else:
            # The file ``path`` names, opened by the caller (in a checked cache directory,
            # where the path may lead elsewhere by now); mapped from it, and left open.
            self._stat, self._mm = open_index_file(self.path, fd)
        self._size = self._stat.st_size
        self.checksum_verified = False
        self.checked_here = False  # whether this open ran the O(N) checks (no stamp spared it)
        self._checked = False
        self._chunk_table: ChunkTable | None = None
        self.header, self.version, self._header_end = read_header(self._mm, self._size, self.path)
        self._map_sections(recheck, lazy)

    def _map_sections(self, recheck: bool, lazy: bool) -> None:
        h = self.header
        self.num_samples: int = h["samples"]
        self.num_members: int = h["members"]
        self.num_chunks: int = h["chunks"]
        self.classes: list[str] = list(h["classes"])
        self.exts: list[bytes] = [os.fsencode(e) for e in h["exts"]]
        table = check_sections(h, self.path, self._size, self._header_end)
        self.num_dirs: int = h.get("dirs", 0)
        self.has_tree = "dirs" in h
        # (mode, mtime ns) of the tree's root, when the index holds the tree.
        self.root: tuple[int, int] | None = (h["root"][0], h["root"][1]) if self.has_tree else None
        rows = (self.num_samples, self.num_members, self.num_chunks, self.num_dirs)
        arrays = self._arrays = map_arrays(self._mm, h, table, self.path, rows)
        # Format 3 checks each row a reader takes (`rowcheck`); an older index has nothing
        # to check rows against, so it is never read checked on use: it is checked in full.
        self.row_checks = "sample_check" in arrays
        if self.version >= ROW_CHECKS_SINCE and not self.row_checks:
            raise damaged(self.path, f"a format {self.version} index without its row checks")
        chunks = self._chunk_table = ChunkTable(arrays, self.path, h.get("chunk_root"))
        self.chunk_root, self.chunk_url = chunks.root, chunks.url  # where chunks lie (`chunkroot`)
        # Directory paths of the tree (root excluded), sorted: few next to the members.
        self.dir_paths: list[bytes] = []
        self._total = sum(nbytes for _, nbytes in h["sections"].values())
        self._check_on_open(recheck, lazy and self.row_checks)
        self._bind(arrays)

    def _check_on_open(self, recheck: bool, lazy: bool) -> None:
        """The full checks, unless a stamp spares them or ``lazy`` leaves the rows to their
        use (the O(1) checks then); the tree's directory table in any case."""
        h = self.header
        stamped = self._total > STAMP_ABOVE_BYTES and "header_checksum" in h
        if recheck or not stamped:
            self._check(self._arrays, self._total, stamped)
        elif has_stamp(self.path, self._stat, h["header_checksum"]):
            self.checked = True
        elif lazy:
            check_open(self._arrays, self.path, self.num_chunks)
        else:
            self.check_all()
        if self.has_tree and not self.checked_here:  # (the full checks check it first)
            self.dir_paths = check_tree(self._arrays, self.path)

    def _bind(self, arrays: dict[str, Any]) -> None:
        """The sections as attributes (views of the mapping)."""
        self.member_mode: npt.NDArray[np.uint16] | None = arrays.get("member_mode")
        self.member_mtime: npt.NDArray[np.int64] | None = arrays.get("member_mtime")
        self.dir_mode: npt.NDArray[np.uint16] | None = arrays.get("dir_mode")
        self.dir_mtime: npt.NDArray[np.int64] | None = arrays.get("dir_mtime")
        # The NARROW sections are uint32 or uint64 (`layout.NARROW`).
        self.sample_member_start: npt.NDArray[np.unsignedinteger[Any]] = arrays[
            "sample_member_start"
        ]
        self.sample_key_offset: npt.NDArray[np.unsignedinteger[Any]] = arrays["sample_key_offset"]
        self.sample_label: npt.NDArray[np.int32] = arrays["sample_label"]
        self.sample_chunk: npt.NDArray[np.uint32] = arrays["sample_chunk"]
        self.member_chunk: npt.NDArray[np.uint32] = arrays["member_chunk"]
        self.member_offset: npt.NDArray[np.unsignedinteger[Any]] = arrays["member_offset"]
        self.member_length: npt.NDArray[np.unsignedinteger[Any]] = arrays["member_length"]
        self.member_checksum: npt.NDArray[np.uint64] = arrays["member_checksum"]
        self.member_ext: npt.NDArray[np.uint16] = arrays["member_ext"]
        self.path_order: npt.NDArray[np.unsignedinteger[Any]] = arrays["path_order"]
        self.sample_check: npt.NDArray[np.uint64] = arrays["sample_check"]  # (`rowcheck`)
        self._keys: npt.NDArray[np.uint8] = arrays["keys"]
        self.chunk_size: npt.NDArray[np.uint64] = arrays["chunk_size"]
        self.chunk_checksum: npt.NDArray[np.uint64] = arrays["chunk_checksum"]

    def _check(self, arrays: dict[str, Any], total: int, stamped: bool) -> None:
        """The O(N) checks (`indexcheck.check_invariants`, the sections checksum when small),
        then the stamp that spares the next opens of a large index."""
        if total <= CHECKSUM_ON_OPEN_BYTES:
            self.check_checksum()
        check_invariants(arrays, self.path, self.num_chunks, len(self.classes), len(self.exts))
        if self.has_tree:
            self.dir_paths = check_tree(arrays, self.path)
            check_tree_members(arrays, self.dir_paths, self.path)
        self.checked_here = self.checked = True
        if stamped:
            stamp(self.path, self._stat, self.header["header_checksum"])

    def check_all(self) -> None:
        """Check every invariant now, unless done (here or by a stamp): what a walk over the
        whole index needs of one opened with ``lazy``. One process of this host checks while
        the others wait for its stamp (`indexstamp.one_checker`)."""
        if self.checked:
            return
        h = self.header
        with one_checker(self.path, self._stat):
            # Another process of this host may have checked it while this one waited.
            if has_stamp(self.path, self._stat, h["header_checksum"]):
                self.checked = True
            else:
                self._check(self._arrays, self._total, True)

    def check_samples(self, samples: npt.ArrayLike) -> None:
        """Raise IndexFormatError unless the rows of ``samples`` (ids in range) and of their
        members hold what a reader relies on; nothing to do once the index was checked in
        full. O(the samples, their members and key bytes)."""
        if self.checked:
            return
        ids = np.asarray(samples, dtype=np.int64).reshape(-1)
        if len(ids) > _SORT_ROWS_ABOVE:  # a rank's epoch: each row once, pages in file order
            ids = distinct(ids)
        if len(ids):
            chunks, classes, exts = self.num_chunks, len(self.classes), len(self.exts)
            done = self.chunks().rows_done()  # chunk rows this process checked already
            check_sample_rows(self._arrays, self.path, ids, chunks, classes, exts, done)

    def check_members(self, members: npt.ArrayLike) -> None:
        """`check_samples` for members ``members`` (ids in range) alone: their rows, and with
        row checks the rows of the samples that hold them (what covers a member's fields)."""
        if self.checked:
            return
        ids = np.asarray(members, dtype=np.int64).reshape(-1)
        if not len(ids):
            return
        if not self.row_checks:
            check_member_rows(self._arrays, self.path, ids, self.num_chunks, len(self.exts))
            return
        start = self.sample_member_start  # the owners' rows checked cover their members
        owners = np.searchsorted(start, ids.astype(start.dtype), "right") - 1
        owners = np.clip(owners, 0, self.num_samples - 1)
        self.check_samples(owners)
        if np.any((start[owners] > ids) | (start[owners + 1] <= ids)):
            raise damaged(self.path, "a member has no sample (member ranges unsorted)")

    # --- lookups ------------------------------------------------------------------

    def key_bytes(self, sample: int) -> bytes:
        """The key of ``sample`` as stored (bytes); on an index checked on use, its bytes
        checked against the row's key check (its offsets are the row's: `check_samples`)."""
        lo = int(self.sample_key_offset[sample])
        hi = int(self.sample_key_offset[sample + 1])
        key = self._keys[lo:hi].tobytes()
        if not self.checked:
            if hi < lo or hi > len(self._keys) or b"\0" in key:
                self.check_samples([sample])  # names what is wrong
            if (
                self.row_checks
                and name_check(key) != int(self._arrays["sample_check"][sample]) >> 32
            ):
                raise damaged(self.path, f"the key of sample {sample} does not match its check")
        return key

    def key_blob(self) -> memoryview:
        """Every key, concatenated in sample order (sample i's is ``[key_offset[i],
        key_offset[i+1])``), in the mapping (valid while the index is open; ``.tobytes()`` for
        walks over all samples: slicing it spares the call and check `key_bytes` makes)."""
        return self._keys.data

    def key(self, sample: int) -> str:
        """The key of ``sample`` (``os.fsdecode`` of the stored bytes)."""
        return os.fsdecode(self.key_bytes(sample))

    def members(self, sample: int) -> range:
        """Member ids of ``sample``."""
        start = self.sample_member_start
        lo, hi = int(start[sample]), int(start[sample + 1])
        if not self.checked and not lo < hi <= self.num_members:
            self.check_samples([sample])  # names what is wrong
        return range(lo, hi)

    def member_owner(self, member: int) -> int:
        """The sample a member belongs to (binary search over member starts)."""
        # A scalar of the array's type: otherwise numpy would cast the whole array first.
        start = self.sample_member_start
        owner = int(np.searchsorted(start, start.dtype.type(member), "right")) - 1
        if not self.checked and not (
            0 <= owner < self.num_samples and start[owner] <= member < start[owner + 1]
        ):
            raise damaged(self.path, f"member {member} has no sample (member ranges unsorted)")
        return owner

    def member_path_bytes(self, member: int) -> bytes:
        """The original relative path of a member: its sample's key plus its extension."""
        ext = int(self.member_ext[member])
        if ext >= len(self.exts):  # only an index checked on use gets here
            raise damaged(self.path, f"a member has an extension id >= {len(self.exts)}")
        return self.key_bytes(self.member_owner(member)) + self.exts[ext]

    def chunk_name(self, chunk: int) -> str:
        """The chunk's path under `chunk_root` (the store's, or its shards'), or `chunk_url`."""
        return self.chunks()[chunk].name

    def chunk(self, chunk: int) -> ChunkInfo:
        """The ChunkInfo of one chunk (an index checked on use checks its row first)."""
        return self.chunks()[chunk]

    def chunks(self) -> ChunkTable:
        """Every chunk, in id order: a sequence that makes each ChunkInfo when first used."""
        assert self._chunk_table is not None
        return self._chunk_table

    @property
    def checked(self) -> bool:
        """Every invariant holds (checked here, or a stamp says so): rows need no check."""
        return self._checked

    @checked.setter
    def checked(self, value: bool) -> None:
        self._checked = value
        if self._chunk_table is not None:
            self._chunk_table.checked = value

    def sample_bytes(
        self, samples: npt.ArrayLike | None = None, rows_checked: bool = False
    ) -> npt.NDArray[np.int64]:
        """Total data bytes of each sample, or of each of ``samples`` (ids in range; their
        rows checked here unless ``rows_checked``: the caller ran `check_samples` on them):
        vectorised over the member arrays, O(the samples' members)."""
        if samples is None:
            if self.num_samples == 0:
                return np.zeros(0, dtype=np.int64)
            self.check_all()
            starts = self.sample_member_start[:-1].astype(np.int64)
            return np.add.reduceat(self.member_length.astype(np.int64), starts)
        ids = np.asarray(samples, dtype=np.int64).reshape(-1)
        if not len(ids):
            return np.zeros(0, dtype=np.int64)
        if not rows_checked:
            self.check_samples(ids)
        first = self.sample_member_start[ids].astype(np.int64)
        counts = self.sample_member_start[ids + 1].astype(np.int64) - first
        lengths = self.member_length[concat_ranges(first, counts)].astype(np.int64)
        return np.add.reduceat(lengths, np.cumsum(counts) - counts)  # each sample's first

    def sorted_path(self, i: int) -> bytes:
        """The ``i``-th member path in bytewise path order."""
        return self.member_path_bytes(self._ordered_member(i))

    def _ordered_member(self, i: int) -> int:
        """The ``i``-th member in path order (an index checked on use checks the id)."""
        member = int(self.path_order[i])
        if not self.checked and member >= self.num_members:
            raise damaged(self.path, "the path order names a member id out of range")
        return member

    def bisect_path(self, path: bytes) -> int:
        """Position of the first member whose path is >= ``path`` in path order."""
        return bisect_left(range(self.num_members), path, key=self.sorted_path)

    def find_member(self, path: bytes) -> int | None:
        """The member id stored at ``path``, or None: O(log n) path comparisons."""
        i = self.bisect_path(path)
        if i < self.num_members and self.sorted_path(i) == path:
            return self._ordered_member(i)
        return None

    def find_sample(self, key: str | bytes) -> int | None:
        """The sample id of ``key``, or None: O(log n) plus the paths that extend the key.

        A sample's member paths are its key, or its key followed by an extension that starts
        with a dot. A key may itself hold dots (``photo.v2`` in a tree packed one file per
        sample), so a path starting with ``key + "."`` may belong to a longer key: the owner's
        key is compared.
        """
        raw = os.fsencode(key)
        i = self.bisect_path(raw)
        n = self.num_members
        if i < n and self.sorted_path(i) == raw:
            return self.member_owner(self._ordered_member(i))
        probe = raw + b"."
        i = self.bisect_path(probe)
        while i < n and self.sorted_path(i).startswith(probe):
            owner = self.member_owner(self._ordered_member(i))
            if self.key_bytes(owner) == raw:
                return owner
            i += 1
        return None

    def check_checksum(self) -> None:
        """Raise IndexFormatError unless the sections match the header's checksum."""
        if self.sections_checksum() != self.header["sections_checksum"]:
            raise damaged(
                self.path, "index checksum mismatch (the index file was altered or damaged)"
            )
        self.checksum_verified = True

    def check_path_order(self) -> None:
        """Raise IndexFormatError unless every member path is distinct and the path order
        sorts them bytewise (O(members) Python work: `tierfeed verify` runs it)."""
        check_path_order(self._arrays, self.exts, self.path)

    def sections_checksum(self) -> int:
        """Checksum of every section as stored now (compare with the header's, to verify)."""
        return sections_checksum(self._mm, self.header)

    def __len__(self) -> int:
        return self.num_samples

    def close(self) -> None:
        """Drop the arrays and unmap the file (views still held elsewhere keep it mapped)."""
        self._arrays.clear()
        # A caller may still hold an array view; the mapping then goes with the last one.
        if not isinstance(self._mm, bytes):
            with contextlib.suppress(BufferError):
                self._mm.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
