"""Validation of an index's arrays as it is opened, or row by row as they are used: the
invariants every reader relies on (vectorised: no Python loop over samples or members). The
header and the section table are checked first, by `tierfeed.format.headercheck`.

Each check raises IndexFormatError naming the file and what is wrong. What is checked here
is what makes every later lookup safe: counts and sections agree with the file, offsets are
monotone and inside their blobs, every id indexes a table that exists, every member lies
inside its chunk, and the path order is a permutation. That the path order is *sorted* needs
per-member work; it is covered by the sections checksum (see `Index`) and checked in full by
`check_path_order` (`tierfeed verify`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.format import rowcheck
from tierfeed.format.headercheck import (  # the header's checks, re-exported
    MAX_EXTS,
    MAX_MODE,
    PATH_ORDER_DTYPES,
    check_header,
    check_sections,
    damaged,
    header_checksum,
)

__all__ = [
    "MAX_CHUNK_BYTES",
    "MAX_EXTS",
    "MAX_MODE",
    "PATH_ORDER_DTYPES",
    "check_chunk_rows",
    "check_header",
    "check_invariants",
    "check_member_rows",
    "check_open",
    "check_sample_rows",
    "check_sections",
    "concat_ranges",
    "damaged",
    "distinct",
    "header_checksum",
]

MAX_CHUNK_BYTES = 2**62  # far above any real chunk; keeps offset arithmetic inside int64


Arrays = Mapping[str, npt.NDArray[Any]]
_THREADS = min(8, os.cpu_count() or 1)
_NOT_IN_CHUNK = "the members of a sample are not all in the sample's chunk"
_MEMBER_COLUMNS = ("member_chunk", "member_ext", "member_length", "member_offset")


_BLOCK = 1 << 20  # samples or members per block: ~25 MiB of temporaries a thread


def _blocks(n: int, block: int = _BLOCK) -> list[tuple[int, int]]:
    return [(lo, min(n, lo + block)) for lo in range(0, n, block)]


def _run_blocks(check: Callable[[int, int], None], n: int, block: int = _BLOCK) -> None:
    """``check(lo, hi)`` over [0, n) in blocks, on up to `_THREADS` threads (numpy releases
    the GIL in the work of a block); the first damage in block order is raised."""
    spans = _blocks(n, block)
    if len(spans) <= 1:
        for lo, hi in spans:
            check(lo, hi)
        return
    with ThreadPoolExecutor(min(_THREADS, len(spans))) as pool:
        for _ in pool.map(lambda span: check(*span), spans):
            pass


def check_open(a: Arrays, where: Path, chunks: int) -> None:
    """What an open checks at any size, in O(1): the ends of the offset columns and the last
    sample's chunk. With `check_invariants` (O(N)), or `check_sample_rows` and
    `check_chunk_rows` on every row used, this is every invariant a reader relies on."""
    members = len(a["member_chunk"])
    start = a["sample_member_start"]
    if start[0] != 0 or start[-1] != members:
        raise damaged(where, "sample member ranges are not contiguous and non-empty")
    key_offset, keys = a["sample_key_offset"], a["keys"]
    if key_offset[0] != 0 or key_offset[-1] != len(keys):
        raise damaged(where, f"sample key offsets are not monotone from 0 to {len(keys)}")
    names = len(a["chunk_names"])
    name_offset = a["chunk_name_offset"]
    if len(name_offset) == 0 or name_offset[0] != 0 or name_offset[-1] != names:
        raise damaged(where, f"chunk name offsets are not monotone from 0 to {names}")
    # The last sample's chunk bounds every chunk id a plan derives (`DatasetShape.num_chunks`).
    if len(a["sample_chunk"]) and a["sample_chunk"][-1] >= chunks:
        raise damaged(where, f"a sample or member points to a chunk id >= {chunks}")


def check_chunk_rows(a: Arrays, where: Path, chunks: Any) -> None:
    """Chunks ``chunks`` (a slice or ids in range) of the chunk table: names non-empty,
    inside the names blob and without NUL, sizes at most `MAX_CHUNK_BYTES` (under 4 GiB
    where member offsets are 32-bit)."""
    after = slice(chunks.start + 1, chunks.stop + 1) if isinstance(chunks, slice) else chunks + 1
    offset = a["chunk_name_offset"]
    lo, hi = offset[chunks], offset[after]
    names = len(a["chunk_names"])
    if np.any(hi < lo) or (len(hi) and hi.max() > names):
        raise damaged(where, f"chunk name offsets are not monotone from 0 to {names}")
    if np.any(hi == lo):
        raise damaged(where, "a chunk name is empty")
    if isinstance(chunks, slice):  # the whole table: the blob between them, at once
        name_bytes = a["chunk_names"][int(lo[0]) : int(hi[-1])] if len(lo) else a["chunk_names"][:0]
        _check_keys(name_bytes, where)
    else:
        for _, at in _spans(lo, hi):
            _check_keys(a["chunk_names"][at], where)
    size = a["chunk_size"][chunks]
    if np.any(size > MAX_CHUNK_BYTES):
        raise damaged(where, f"a chunk is larger than {MAX_CHUNK_BYTES} bytes")
    narrow = a["member_offset"].dtype.itemsize == 4 or a["member_length"].dtype.itemsize == 4
    if narrow and len(size) and int(size.max()) >= 2**32:
        raise damaged(where, "32-bit member offsets with a chunk of 4 GiB or more")
    if "chunk_check" in a:  # format 3: every field of these rows as written
        ids = np.arange(chunks.start, chunks.stop) if isinstance(chunks, slice) else chunks
        stored = a["chunk_check"][chunks]
        got = rowcheck.chunk_terms(
            ids, lo, hi, size, a["chunk_checksum"][chunks], stored >> np.uint64(32)
        )
        bad = np.flatnonzero(got != (stored & rowcheck.MASK))
        if len(bad):
            raise damaged(where, f"chunk {int(ids[bad[0]])}'s row does not match its row check")


def check_invariants(a: Arrays, where: Path, chunks: int, classes: int, exts: int) -> None:
    """What readers rely on, vectorised over the arrays (section lengths already match the
    header's counts), in blocks of `_BLOCK` on several threads: the temporaries stay a few
    tens of MiB a thread at any size, and a many-core host checks in a fraction of the time."""
    check_open(a, where, chunks)
    check_chunk_rows(a, where, slice(0, chunks))
    members, samples = len(a["member_chunk"]), len(a["sample_chunk"])
    _run_blocks(lambda lo, hi: _check_samples(a, where, chunks, classes, lo, hi), samples)
    _run_blocks(lambda lo, hi: _check_keys(a["keys"][lo:hi], where), len(a["keys"]), 16 * _BLOCK)
    _run_blocks(lambda lo, hi: _member_rows(a, where, chunks, exts, slice(lo, hi)), members)
    _run_blocks(lambda lo, hi: _check_owners(a, where, lo, hi), samples)
    _run_blocks(lambda lo, hi: _check_ext_blocks(a, where, lo, hi), samples)
    order = a["path_order"]
    if len(order) and order.max() >= members:
        raise damaged(where, "the path order names a member id out of range")
    seen = np.zeros(members, dtype=bool)  # one byte a member: the only O(N) allocation
    _run_blocks(lambda lo, hi: seen.__setitem__(order[lo:hi], True), members)
    if not seen.all():
        raise damaged(where, "the path order is not a permutation of the members")


def check_sample_rows(
    a: Arrays,
    where: Path,
    ids: npt.NDArray[np.int64],
    chunks: int,
    classes: int,
    exts: int,
    chunks_done: npt.NDArray[np.bool_] | None = None,
) -> None:
    """What a reader of samples ``ids`` (in range) relies on, checked on those rows alone:
    their member ranges and key offsets, labels, chunk ids, their members (ids, extensions in
    order, inside their chunk, in the sample's chunk) and key bytes, and, with row checks
    (format 3), that every field of these rows and their members is as written. O(the rows,
    their members and key bytes), in blocks of at most `_BLOCK` members or key bytes; an index
    opened without `check_invariants` is safe to read row by row with it. ``chunks_done``:
    one flag a chunk, set for chunk rows checked already (by this call too), not checked
    again."""
    first, end, k0, k1, label, sample_chunk = _sample_rows(a, where, chunks, classes, ids, ids + 1)
    chunk_ids = distinct(sample_chunk.astype(np.int64))  # the chunks these rows name, once
    if chunks_done is not None:
        chunk_ids = chunk_ids[~chunks_done[chunk_ids]]
    if len(chunk_ids):
        check_chunk_rows(a, where, chunk_ids)
        if chunks_done is not None:
            chunks_done[chunk_ids] = True
    checks = "sample_check" in a
    names = rowcheck.member_columns(a) if checks else list(_MEMBER_COLUMNS)
    sums = np.zeros(len(ids), dtype=np.uint64)
    for rows, members in _spans(first, end):
        cols = {name: a[name][members] for name in names}
        _member_rows(a, where, chunks, exts, members, cols)
        if np.any(cols["member_chunk"] != sample_chunk[rows]):
            raise damaged(where, _NOT_IN_CHUNK)
        _check_ext_order(rows[1:] == rows[:-1], cols["member_ext"], where)
        if checks:
            _add_by_row(sums, rows, rowcheck.member_terms(members, [cols[n] for n in names]))
    for _, at in _spans(k0, k1):
        _check_keys(a["keys"][at], where)
    if checks:
        stored = a["sample_check"][ids]
        key_check = stored >> np.uint64(32)
        sums += rowcheck.sample_terms(ids, first, end, k0, k1, label, sample_chunk, key_check)
        bad = np.flatnonzero((sums & rowcheck.MASK) != (stored & rowcheck.MASK))
        if len(bad):
            raise damaged(where, f"sample {int(ids[bad[0]])}'s row does not match its row check")


def _add_by_row(sums: npt.NDArray[np.uint64], rows: npt.NDArray[np.int64], terms: Any) -> None:
    """``sums[r] += terms`` for each row ``r`` of ``rows`` (sorted: each row's entries
    together), by one reduceat over the runs of equal rows."""
    if not len(rows):
        return
    starts = np.flatnonzero(np.diff(rows, prepend=-1))  # (uint64 sums wrap, silently)
    sums[rows[starts]] += np.add.reduceat(terms, starts)


def _check_ext_order(same: npt.NDArray[np.bool_], ext: npt.NDArray[Any], where: Path) -> None:
    """Within each sample extension ids strictly rise (``ext``: members in order; ``same[k]``:
    members k and k + 1 are of one sample): no two members of one extension (a reader keeps
    one field per extension), and in the order every writer stores them."""
    if len(ext) > 1 and np.any(same & (ext[1:] <= ext[:-1])):
        raise damaged(
            where, "a sample's members are not in extension order (two of one extension?)"
        )


def check_member_rows(
    a: Arrays, where: Path, members: npt.NDArray[np.int64], chunks: int, exts: int
) -> None:
    """What a reader of members ``members`` (in range) relies on: chunk and extension ids,
    its chunk's row, and the member inside its chunk."""
    member_chunk = a["member_chunk"][members]
    if np.any(member_chunk >= chunks):
        raise damaged(where, f"a sample or member points to a chunk id >= {chunks}")
    check_chunk_rows(a, where, distinct(member_chunk.astype(np.int64)))
    _member_rows(a, where, chunks, exts, members)


def distinct(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``ids`` sorted, each once, by a sort: numpy 2's np.unique hashes first, far slower for
    a rank's random ids (docs/BENCHMARKS.md, the row checks)."""
    ordered = np.sort(ids)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def concat_ranges(lo: npt.ArrayLike, counts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The integers of the ranges [lo[i], lo[i] + counts[i]) (counts >= 0), one after another
    in order: vectorised, no Python loop over the ranges."""
    starts, sizes = np.asarray(lo, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    shift: npt.NDArray[np.int64] = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    return np.arange(int(sizes.sum()), dtype=np.int64) + shift


def _spans(
    lo: npt.NDArray[Any], hi: npt.NDArray[Any], block: int = _BLOCK
) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
    """The integers of ranges [lo[i], hi[i]) (hi >= lo), with the row i each came from, at
    most about ``block`` at a time (one range longer than that in slices of its own)."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    counts = hi - lo
    ends = np.cumsum(counts)
    first = 0
    while first < len(lo):
        base = int(ends[first] - counts[first])
        last = max(first + 1, int(np.searchsorted(ends, base + block, "right")))
        if last - first == 1 and counts[first] > block:
            for s0 in range(int(lo[first]), int(hi[first]), block):
                values = np.arange(s0, min(int(hi[first]), s0 + block), dtype=np.int64)
                yield np.full(len(values), first, dtype=np.int64), values
        else:
            c = counts[first:last]
            rows = np.repeat(np.arange(first, last, dtype=np.int64), c)
            yield rows, concat_ranges(lo[first:last], c)
        first = last


def _sample_rows(
    a: Arrays, where: Path, chunks: int, classes: int, at: Any, after: Any
) -> tuple[npt.NDArray[Any], ...]:
    """Samples ``at`` (a slice or ids; ``after`` the entries one past each): member ranges
    non-empty and inside the members, key offsets monotone and inside the keys, labels and
    chunk ids in range. Returns the columns it gathered: member start and end, key start and
    end, label, chunk."""
    first, end = a["sample_member_start"][at], a["sample_member_start"][after]
    if np.any(end <= first) or (len(end) and end.max() > len(a["member_chunk"])):
        raise damaged(where, "sample member ranges are not contiguous and non-empty")
    keys = len(a["keys"])
    k0, k1 = a["sample_key_offset"][at], a["sample_key_offset"][after]
    if np.any(k1 < k0) or (len(k1) and k1.max() > keys):
        raise damaged(where, f"sample key offsets are not monotone from 0 to {keys}")
    labels = a["sample_label"][at]
    if np.any((labels < -1) | (labels >= classes)):
        raise damaged(where, f"sample labels outside [-1, {classes})")
    chunk = a["sample_chunk"][at]
    if np.any(chunk >= chunks):
        raise damaged(where, f"a sample or member points to a chunk id >= {chunks}")
    return first, end, k0, k1, labels, chunk


def _check_samples(a: Arrays, where: Path, chunks: int, classes: int, lo: int, hi: int) -> None:
    """Samples [lo, hi) as rows, and their chunk order (each block reads one entry past its
    end)."""
    _sample_rows(a, where, chunks, classes, slice(lo, hi), slice(lo + 1, hi + 1))
    chunk = a["sample_chunk"][lo : hi + 1]
    if len(chunk) > 1 and bool(np.any(chunk[1:] < chunk[:-1])):
        raise damaged(where, "samples are not in chunk order (sample chunk ids decrease)")


def _check_owners(a: Arrays, where: Path, lo: int, hi: int) -> None:
    """The members of samples [lo, hi) lie in their sample's chunk (after both columns'
    ids were checked, so the more precise of two messages is the one raised)."""
    start = a["sample_member_start"][lo : hi + 1].astype(np.int64)  # a running count
    chunk = a["sample_chunk"][lo:hi]
    # Members of these samples: runs of equal chunk ids, one run a sample. Compared in
    # slices of at most _BLOCK members (one sample may own more).
    member_chunk = a["member_chunk"]
    counts = np.diff(start)
    first = 0
    while first < hi - lo:
        # The most samples from ``first`` on whose members fit a block; one at least.
        fit = int(np.searchsorted(start, start[first] + _BLOCK, "right")) - 1
        last = max(first + 1, fit)
        m0, m1 = int(start[first]), int(start[last])
        if last - first == 1:  # a single sample, perhaps with very many members
            for s0, s1 in _blocks(m1 - m0):
                if np.any(member_chunk[m0 + s0 : m0 + s1] != chunk[first]):
                    raise damaged(where, _NOT_IN_CHUNK)
        elif not np.array_equal(
            np.repeat(chunk[first:last], counts[first:last]), member_chunk[m0:m1]
        ):
            raise damaged(where, _NOT_IN_CHUNK)
        first = last


def _check_ext_blocks(a: Arrays, where: Path, lo: int, hi: int) -> None:
    """`_check_ext_order` over the members of samples [lo, hi) (after the member ranges were
    checked: they are monotone)."""
    start = a["sample_member_start"][lo : hi + 1].astype(np.int64)
    m0, m1 = int(start[0]), int(start[-1])
    first = np.zeros(m1 - m0, dtype=bool)  # the members that start a sample
    first[start[:-1] - m0] = True
    _check_ext_order(~first[1:], a["member_ext"][m0:m1], where)


def _check_keys(key_bytes: npt.NDArray[np.uint8], where: Path) -> None:
    if np.any(key_bytes == 0):
        raise damaged(where, "a sample key or chunk name holds a NUL byte")


def _member_rows(
    a: Arrays, where: Path, chunks: int, exts: int, members: Any, cols: Arrays | None = None
) -> None:
    """Members ``members`` (a slice or ids; ``cols``: their member columns, if gathered
    already): chunk ids and extension ids in range, and inside their chunk (offset + length
    <= chunk size, without uint64 wrap-around)."""
    if cols is None:
        cols = {n: a[n][members] for n in _MEMBER_COLUMNS}
    member_chunk = cols["member_chunk"]
    if np.any(member_chunk >= chunks):
        raise damaged(where, f"a sample or member points to a chunk id >= {chunks}")
    if np.any(cols["member_ext"] >= exts):
        raise damaged(where, f"a member has an extension id >= {exts}")
    size = a["chunk_size"][member_chunk]
    length, offset = cols["member_length"], cols["member_offset"]
    past = np.flatnonzero((length > size) | (offset > size - np.minimum(length, size)))
    if len(past):
        k = int(past[0])
        raise damaged(
            where,
            _past_the_end(a, members.start + k if isinstance(members, slice) else int(members[k])),
        )


def _past_the_end(a: Arrays, m: int) -> str:
    """What is wrong with member ``m``, which points past the end of its chunk."""
    start = a["sample_member_start"]
    owner = int(np.searchsorted(start, start.dtype.type(m), "right")) - 1
    owner = min(max(owner, 0), len(start) - 2)  # a row-checked index: starts may be unsorted
    ko = a["sample_key_offset"]
    path = a["keys"][int(ko[owner]) : int(ko[owner + 1])].tobytes()
    c = int(a["member_chunk"][m])
    no = a["chunk_name_offset"]
    chunk = a["chunk_names"][int(no[c]) : int(no[c + 1])].tobytes()
    offset, length = int(a["member_offset"][m]), int(a["member_length"][m])
    return (
        f"member {m} of sample {os.fsdecode(path)!r} points past the end of chunk "
        f"{os.fsdecode(chunk)} ({offset}+{length} > {int(a['chunk_size'][c])} bytes)"
    )
