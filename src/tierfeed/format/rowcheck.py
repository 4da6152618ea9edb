"""Row checks: one 64-bit value per sample and per chunk that covers every index byte a reader
of that row uses, so an index opened lazily verifies what it touches at a cost that grows with
the rows read, not with the store (format version 3).

``sample_check[i]`` holds, in its low 32 bits, a sum over the fields of sample ``i``'s row
(its member range, key range, label and chunk), over every field of each of its members (chunk,
offset, length, checksum, extension; mode and mtime with a tree) and over its key's own check
(the high 32 bits: the low 32 bits of xxh3_64 of the key's bytes). ``chunk_check[c]`` is the
same for a chunk's row (name range, size, checksum) and its name (xxh3 in the high half).

Each term is ``W_f * (fold(value) ^ P(position))`` mod 2^32: ``fold`` xors a 64-bit value's
halves (a change to any one byte changes it), ``P`` mixes the row's or member's id (the same
value at another place is another term: a shifted range or two swapped fields change the sum)
and ``W_f`` is an odd weight per field (so a change of one field always changes the sum: odd
numbers are invertible mod 2^32). So any single changed byte of a row's fields is always
refused, and any other damage with probability 1 - 2^-32. The key and the name are covered by
their xxh3 (32 bits), checked where they are read (`Index.key_bytes`, `ChunkTable`).

Why a weighted sum and not xxh3 per row: a rank's epoch checks ~10^5 random rows at once, and
xxhash has no vectorised form for many small inputs, so a Python call per row would cost far
more than this, a few numpy passes over the columns the invariant checks gather anyway. It guards
against rot and stray writes; a crafted index (checks recomputed) is met by the invariants.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = [
    "MASK",
    "THREADS",
    "chunk_terms",
    "member_columns",
    "member_terms",
    "name_check",
    "sample_terms",
    "write_checks",
]

U64 = npt.NDArray[np.uint64]
MASK = np.uint64(0xFFFFFFFF)
# Odd weights (from the golden ratio and splitmix64's constants), one per field.
_W = np.array(
    [
        0x9E3779B97F4A7C15,
        0xBF58476D1CE4E5B9,
        0x94D049BB133111EB,
        0xD6E8FEB86659FD93,
        0xA0761D6478BD642F,
        0xE7037ED1A0B428DB,
        0x8EBC6AF09C88C6E3,
        0x589965CC75374CC3,
        0x1D8E4E27C47D124F,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0x27D4EB2F165667C5,
        0x85EBCA77C2B2AE63,
        0xFF51AFD7ED558CCD,
    ],
    dtype=np.uint64,
) | np.uint64(1)
_P_SAMPLE = np.uint64(0xD1B54A32D192ED03)  # position mixers: rows, members, chunks
_P_MEMBER = np.uint64(0xAEF17502108EF2D9)
_P_CHUNK = np.uint64(0xDB4F0B9175AE2165)
_BLOCK = 1 << 16  # samples whose checks `write_checks` computes at once
THREADS = min(4, os.cpu_count() or 1)  # blocks of `write_checks` computed at once


def _fold(values: U64) -> U64:
    """A 32-bit value (in a uint64) that changes whenever any one byte of ``values`` does."""
    return (values ^ (values >> np.uint64(32))) & MASK


def _unsigned(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A column's bits as an unsigned integer (labels and mtimes are signed)."""
    if values.dtype.kind == "u":
        return values
    return values.view(values.dtype.str.replace("i", "u"))


def _position(ids: npt.NDArray[Any], mixer: np.uint64) -> U64:
    # (Arithmetic on uint64 arrays wraps mod 2^64 silently, as these sums want.)
    return _fold(ids.astype(np.uint64) * mixer)


def _weighted(columns: list[npt.NDArray[Any]], where: U64, first: int) -> U64:
    """sum_k W[first + k] * (fold(columns[k]) ^ where), mod 2^64 (masked by the caller): on
    one matrix, so that a check of a few rows costs a dozen numpy calls, not six a column."""
    m = np.empty((len(columns), len(where)), dtype=np.uint64)
    for k, column in enumerate(columns):
        m[k] = _unsigned(column)  # (widened, never sign-extended)
    m ^= m >> np.uint64(32)
    m &= MASK
    m ^= where
    m *= _W[first : first + len(columns), None]
    total: U64 = m.sum(axis=0, dtype=np.uint64)
    return total


def sample_terms(
    ids: npt.NDArray[np.int64],
    start: npt.NDArray[Any],
    end: npt.NDArray[Any],
    key_start: npt.NDArray[Any],
    key_end: npt.NDArray[Any],
    label: npt.NDArray[Any],
    chunk: npt.NDArray[Any],
    key_check: U64,
) -> U64:
    """The sample rows' own part of their check (unmasked): the columns gathered at ``ids``."""
    where = _position(ids, _P_SAMPLE)
    return _weighted([start, end, key_start, key_end, label, chunk, key_check], where, 0)


def member_terms(members: npt.NDArray[np.int64], columns: list[npt.NDArray[Any]]) -> U64:
    """Each member's part of its sample's check (unmasked): ``columns`` gathered at
    ``members`` in `member_columns` order."""
    return _weighted(columns, _position(members, _P_MEMBER), 7)


def member_columns(a: Any) -> list[str]:
    """The member sections a check covers, in the order `member_terms` weighs them."""
    names = ["member_chunk", "member_offset", "member_length", "member_checksum", "member_ext"]
    return names + [n for n in ("member_mode", "member_mtime") if n in a]


def chunk_terms(
    ids: npt.NDArray[np.int64],
    name_start: npt.NDArray[Any],
    name_end: npt.NDArray[Any],
    size: npt.NDArray[Any],
    checksum: npt.NDArray[Any],
    name_check: U64,
) -> U64:
    """The chunk rows' check (masked): the columns gathered at ``ids``."""
    where = _position(ids, _P_CHUNK)
    return _weighted([name_start, name_end, size, checksum, name_check], where, 0) & MASK


def name_check(name: bytes) -> int:
    """The 32-bit check of a key's or chunk name's bytes."""
    return int(xxhash.xxh3_64_intdigest(name)) & 0xFFFFFFFF


def _blob_checks(offsets: npt.NDArray[Any], blob: bytes) -> U64:
    bounds = offsets.tolist()
    return np.fromiter(
        (name_check(blob[lo:hi]) for lo, hi in itertools.pairwise(bounds)),
        dtype=np.uint64,
        count=len(bounds) - 1,
    )


def _sample_block(
    a: dict[str, Any], columns: list[npt.NDArray[Any]], key_check: U64, lo: int, hi: int
) -> U64:
    """The checks of samples ``lo`` to ``hi`` (a block: its matrices stay in cache)."""
    start, key_offset = a["sample_member_start"], a["sample_key_offset"]
    first, end = int(start[lo]), int(start[hi])
    row = sample_terms(
        np.arange(lo, hi, dtype=np.int64),
        start[lo:hi],
        start[lo + 1 : hi + 1],
        key_offset[lo:hi],
        key_offset[lo + 1 : hi + 1],
        a["sample_label"][lo:hi],
        a["sample_chunk"][lo:hi],
        key_check[lo:hi],
    )
    members = np.arange(first, end, dtype=np.int64)
    per_member = member_terms(members, [c[first:end] for c in columns])
    # (every sample has a member: the writers' invariant)
    row += np.add.reduceat(per_member, start[lo:hi].astype(np.int64) - first)
    return (row & MASK) | (key_check[lo:hi] << np.uint64(32))


def write_checks(
    a: dict[str, Any],
    keys: bytes | None,
    names: bytes,
    key_check: U64 | None = None,
    out: tuple[U64, U64] | None = None,
) -> tuple[U64, U64]:
    """(sample_check, chunk_check) of a new index's sections ``a`` (the key and chunk name
    blobs given as bytes): what `write_index` stores, in ``out`` when given. ``key_check``:
    the keys' own checks, when the caller holds them (else computed from ``keys``, one xxh3
    a key). The sample rows are checked a block at a time, on `THREADS` threads (numpy's
    passes let go of the GIL)."""
    samples = len(a["sample_member_start"]) - 1
    if key_check is None:
        assert keys is not None, "the keys or their checks"
        key_check = _blob_checks(a["sample_key_offset"], keys)
    if out is None:
        out = (np.empty(samples, dtype=np.uint64), np.empty(len(a["chunk_size"]), np.uint64))
    sample_check, chunk_check = out
    columns = [a[n] for n in member_columns(a)]
    checks: U64 = key_check

    def block(lo: int) -> None:
        hi = min(samples, lo + _BLOCK)
        sample_check[lo:hi] = _sample_block(a, columns, checks, lo, hi)

    blocks = range(0, samples, _BLOCK)
    if len(blocks) > 1 and THREADS > 1:
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(block, blocks))
    else:
        for lo in blocks:
            block(lo)
    name_offset = a["chunk_name_offset"]
    chunks = np.arange(len(name_offset) - 1, dtype=np.int64)
    name = _blob_checks(name_offset, names)
    chunk_row = chunk_terms(
        chunks, name_offset[:-1], name_offset[1:], a["chunk_size"], a["chunk_checksum"], name
    )
    chunk_check[:] = chunk_row | (name << np.uint64(32))
    return sample_check, chunk_check
