"""`tierfeed verify` and `tierfeed inspect`: check every chunk and the index; summarise a store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from tierfeed.errors import FormatError, IndexFormatError, TierfeedError
from tierfeed.format.chunkfiles import safe_chunk_path
from tierfeed.format.chunkref import checksum_file
from tierfeed.format.index import Index
from tierfeed.format.names import normalize_member_name
from tierfeed.format.tarchunk import scan_tar

__all__ = ["StoreSummary", "summarize", "verify_store"]


def _check_structure(ix: Index) -> list[str]:
    """What opening the index does not check: the sections checksum (opening checks it only
    below a size threshold) and that the path order sorts every path; invariants of the
    arrays were checked when ``ix`` was opened (`tierfeed.format.indexcheck`)."""
    try:
        if not ix.checksum_verified:
            ix.check_checksum()
        ix.check_path_order()
    except IndexFormatError as exc:
        return [str(exc)]
    return []


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
    # Only the places the index holds are compared: members it left out (directories, and
    # names `tierfeed index --skip-bad-names` skipped on purpose) are not problems here.
    try:
        for t in scan_tar(path):
            name = expected.pop((t.offset, t.size), None)
            if name is None:
                continue
            try:
                agrees = t.is_file and normalize_member_name(t.name, str(path)) == name
            except FormatError:
                agrees = False
            if not agrees:
                return [_disagree(path, name, t.offset, t.size)]
    except FormatError as exc:
        return [f"chunk {exc}"]
    if expected:  # a place the index holds where the tar has no regular member
        (offset, length), name = next(iter(expected.items()))
        return [_disagree(path, name, offset, length)]
    return []


def _disagree(path: Path, name: bytes, offset: int, length: int) -> str:
    return (
        f"chunk {path}: the index puts {os.fsdecode(name)!r} at bytes {offset}+{length}, but "
        "the tar headers disagree"
    )


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
