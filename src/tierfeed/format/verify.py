"""`tierfeed verify` and `tierfeed inspect`: check every chunk and the index; summarise a store."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from tierfeed.errors import FormatError, TierfeedError
from tierfeed.format.chunkfiles import safe_chunk_path
from tierfeed.format.chunkref import checksum_file
from tierfeed.format.index import Index
from tierfeed.format.names import normalize_member_name
from tierfeed.format.tarchunk import scan_tar

__all__ = ["StoreSummary", "summarize", "verify_store"]


def _check_structure(ix: Index) -> list[str]:
    """Index invariants, vectorised; each problem names what is wrong."""
    bad: list[str] = []
    where = str(ix.path)
    if ix.sections_checksum() != ix.header.get("sections_checksum"):
        bad.append(f"{where}: index checksum mismatch (the index file was altered or damaged)")
    start = ix.sample_member_start.astype(np.int64)
    if len(start) and (start[0] != 0 or start[-1] != ix.num_members or np.any(np.diff(start) < 1)):
        bad.append(f"{where}: sample member ranges are not contiguous and non-empty")
        return bad
    if np.any(np.diff(ix.sample_key_offset.astype(np.int64)) < 0):
        bad.append(f"{where}: sample key offsets decrease")
    labels = ix.sample_label
    if np.any((labels < -1) | (labels >= max(len(ix.classes), 0))) and ix.num_samples:
        bad.append(f"{where}: labels outside [-1, {len(ix.classes)})")
    if np.any(ix.member_chunk >= ix.num_chunks):
        bad.append(f"{where}: a member points to a chunk id >= {ix.num_chunks}")
        return bad
    if np.any(ix.member_ext >= len(ix.exts)):
        bad.append(f"{where}: a member has an unknown extension id")
    owner = np.repeat(np.arange(ix.num_samples), np.diff(start))
    split = np.flatnonzero(ix.member_chunk != ix.sample_chunk[owner])
    for m in split[:10].tolist():
        bad.append(f"{where}: sample {ix.key(int(owner[m]))!r} has members in two chunks")
    end = ix.member_offset.astype(np.int64) + ix.member_length.astype(np.int64)
    past = np.flatnonzero(end > ix.chunk_size.astype(np.int64)[ix.member_chunk])
    for m in past[:10].tolist():
        c = int(ix.member_chunk[m])
        bad.append(
            f"{where}: member {os.fsdecode(ix.member_path_bytes(m))!r} points past the end of "
            f"chunk {ix.chunk_name(c)} ({int(end[m])} > {int(ix.chunk_size[c])} bytes)"
        )
    order = ix.path_order.astype(np.int64)
    if not np.array_equal(np.sort(order), np.arange(ix.num_members)):
        bad.append(f"{where}: path order is not a permutation of the members")
        return bad
    paths = [ix.sorted_path(i) for i in range(ix.num_members)]
    for a, b in itertools.pairwise(paths):
        if a >= b:
            bad.append(f"{where}: path order broken or duplicate path at {os.fsdecode(b)!r}")
            break
    return bad


def _check_chunk(ix: Index, root: Path, chunk: int, bar: tqdm[Any]) -> list[str]:
    """Size, checksum, and that the tar headers agree with the index's members of the chunk."""
    info = ix.chunk(chunk)
    try:
        path = safe_chunk_path(root, info.name, ix.path)
    except TierfeedError as exc:
        return [str(exc)]
    try:
        size = path.stat().st_size
    except OSError as exc:
        return [f"chunk {path}: missing or unreadable ({exc.strerror})"]
    if size != info.size:
        return [f"chunk {path}: size {size} bytes, the index says {info.size} (truncated?)"]
    if checksum_file(path, bar.update)[1] != info.checksum:
        return [f"chunk {path}: checksum mismatch (the chunk was altered or damaged)"]
    members = np.flatnonzero(ix.member_chunk == chunk)
    expected = {
        (int(ix.member_offset[m]), int(ix.member_length[m])): ix.member_path_bytes(int(m))
        for m in members
    }
    try:
        found = {
            (t.offset, t.size): normalize_member_name(t.name, str(path))
            for t in scan_tar(path)
            if t.is_file
        }
    except FormatError as exc:
        return [f"chunk {path}: {exc}"]
    for place, name in expected.items():
        if found.get(place) != name:
            return [
                f"chunk {path}: the index puts {os.fsdecode(name)!r} at bytes {place[0]}+"
                f"{place[1]}, but the tar headers disagree"
            ]
    return []


def verify_store(path: str | os.PathLike[str], progress: bool = True) -> list[str]:
    """Check the index and every chunk of a store; returns the problems found (empty: good)."""
    try:
        ix = Index(path)
    except TierfeedError as exc:
        return [str(exc)]
    with ix:
        problems = _check_structure(ix)
        root = ix.path.parent
        total = int(ix.chunk_size.sum())
        with tqdm(
            total=total, unit="B", unit_scale=True, desc="verify", disable=not progress
        ) as bar:
            for chunk in range(ix.num_chunks):
                problems.extend(_check_chunk(ix, root, chunk, bar))
    return problems


@dataclass(frozen=True)
class StoreSummary:
    """Counts and a sample-size histogram of a store."""

    samples: int
    members: int
    chunks: int
    data_bytes: int
    chunk_bytes: int
    classes: list[str]
    exts: dict[str, int]
    size_histogram: list[tuple[int, int]]  # (upper bound in bytes, samples), powers of two


def summarize(path: str | os.PathLike[str]) -> StoreSummary:
    """Summarise a store from its index alone."""
    with Index(path) as ix:
        sizes = ix.sample_bytes()
        bounds = np.int64(2) ** np.ceil(np.log2(np.maximum(sizes, 1))).astype(np.int64)
        values, counts = np.unique(bounds, return_counts=True)
        ext_counts = np.bincount(ix.member_ext, minlength=len(ix.exts))
        return StoreSummary(
            samples=ix.num_samples,
            members=ix.num_members,
            chunks=ix.num_chunks,
            data_bytes=int(ix.member_length.sum()),
            chunk_bytes=int(ix.chunk_size.sum()),
            classes=list(ix.classes),
            exts={os.fsdecode(e): int(n) for e, n in zip(ix.exts, ext_counts, strict=True)},
            size_histogram=[(int(v), int(c)) for v, c in zip(values, counts, strict=True)],
        )
