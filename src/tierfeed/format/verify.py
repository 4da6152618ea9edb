"""`tierfeed verify` and `tierfeed inspect`: check every chunk and the index; summarise a store."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from tierfeed.errors import FormatError, IndexFormatError, TierfeedError
from tierfeed.format.chunkref import checksum_file, checksum_range
from tierfeed.format.index import Index
from tierfeed.format.names import normalize_member_name
from tierfeed.format.relpath import safe_chunk_path
from tierfeed.format.tarchunk import scan_tar

__all__ = ["StoreSummary", "check_index", "summarize", "verify_index", "verify_store"]


def check_index(ix: Index) -> list[str]:
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


def _members_by_chunk(ix: Index) -> Callable[[int], npt.NDArray[np.intp]]:
    """The members of each chunk, found once for all chunks (not a pass over every member
    per chunk: that grows with members times chunks)."""
    order = np.argsort(ix.member_chunk, kind="stable")
    bounds = np.searchsorted(ix.member_chunk[order], np.arange(ix.num_chunks + 1))
    return lambda chunk: order[bounds[chunk] : bounds[chunk + 1]]


def _check_chunk(
    ix: Index,
    path: Path,
    chunk: int,
    bar: tqdm[Any],
    members_of: Callable[[int], npt.NDArray[np.intp]],
) -> list[str]:
    """Size, checksum, and that the tar headers agree with the index's members of the chunk
    in the file ``path``."""
    info = ix.chunk(chunk)
    try:
        size = path.stat().st_size
    except OSError as exc:
        return [f"chunk {path}: missing or unreadable ({exc.strerror})"]
    if size != info.size:
        return [f"chunk {path}: size {size} bytes, the index says {info.size} (truncated?)"]
    if checksum_file(path, bar.update)[1] != info.checksum:
        return [_checksum_mismatch(ix, path, chunk, size)]
    members = members_of(chunk)
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


_NAMED = 10  # damaged members (or byte ranges) named in one problem


def _checksum_mismatch(ix: Index, path: Path, chunk: int, size: int) -> str:
    """Where a chunk that fails its checksum is damaged: the members that fail their own
    checksum (the first `_NAMED` named), else the bytes outside every member."""
    members = np.flatnonzero(ix.member_chunk == chunk)
    members = members[np.argsort(ix.member_offset[members], kind="stable")]
    head = f"chunk {path}: checksum mismatch (the chunk was altered or damaged)"
    fix = "re-pack the store, or restore the chunk from a good copy"
    try:
        bad, checked = _failing_members(ix, path, members, size)
    except OSError as exc:
        return f"{head}; reading it again to find the damaged member failed ({exc.strerror})"
    if checked < len(members):
        # Members of a genuine tar never overlap, so their bytes total less than the chunk.
        return (
            f"{head}; its members in the index overlap (the index was altered: run "
            f"`tierfeed index` again or re-pack); of the first {checked}, {len(bad)} fail "
            "their checksum"
        )
    if bad:
        named = ", ".join(
            f"{os.fsdecode(ix.member_path_bytes(m))!r} (bytes "
            f"{int(ix.member_offset[m])}+{int(ix.member_length[m])})"
            for m in bad[:_NAMED]
        )
        more = f", and {len(bad) - _NAMED} more" if len(bad) > _NAMED else ""
        which = "member fails its" if len(bad) == 1 else "members fail their"
        return f"{head}: {len(bad)} {which} checksum: {named}{more}; {fix}"
    return (
        f"{head}, yet every member passes its own checksum: the altered bytes lie outside the "
        f"members, {_outside_members(ix, path, members, size)} (its samples still read "
        f"correctly, but it is no longer the tar it was: `tar -x` may fail on it); {fix}"
    )


def _failing_members(
    ix: Index, path: Path, members: npt.NDArray[np.intp], size: int
) -> tuple[list[int], int]:
    """The members (in chunk order) whose bytes fail their checksum, and how many members were
    checked: at most ``size`` bytes are hashed, which a crafted index of overlapping members
    would exceed (all are checked otherwise). Raises OSError."""
    bad: list[int] = []
    hashed, checked = 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for m in members.tolist():
            offset, length = int(ix.member_offset[m]), int(ix.member_length[m])
            hashed += length
            if hashed > size:
                break
            checked += 1
            # Shorter than the index says: the hash of what is there fails.
            if checksum_range(fd, offset, length)[1] != int(ix.member_checksum[m]):
                bad.append(int(m))
    finally:
        os.close(fd)
    return bad, checked


def _outside_members(ix: Index, path: Path, members: npt.NDArray[np.intp], size: int) -> str:
    """Where in a chunk's bytes outside every member the damage is: what the strict tar scan
    says of them, else (it finds nothing wrong) those bytes, as ranges."""
    try:
        for _ in scan_tar(path):
            pass
    except FormatError as exc:  # its finding, without the chunk's name or what to do again
        finding = str(exc).split("; ", 1)[0].removeprefix(f"{path}: ")
        return f"where the tar scan says: {finding}"
    gaps: list[tuple[int, int]] = []
    at = 0
    for m in members.tolist():
        offset = int(ix.member_offset[m])
        if offset > at:
            gaps.append((at, offset - at))
        at = max(at, offset + int(ix.member_length[m]))
    if size > at:
        gaps.append((at, size - at))
    ranges = ", ".join(f"{a}+{n}" for a, n in gaps[:_NAMED])
    more = f" and {len(gaps) - _NAMED} more" if len(gaps) > _NAMED else ""
    return (
        f"in tar headers, padding or the end-of-archive blocks ({sum(n for _, n in gaps)} "
        f"bytes in {len(gaps)} ranges: {ranges}{more})"
    )


def _disagree(path: Path, name: bytes, offset: int, length: int) -> str:
    return (
        f"chunk {path}: the index puts {os.fsdecode(name)!r} at bytes {offset}+{length}, but "
        "the tar headers disagree"
    )


# A chunk's (name, size in the index) -> a local file holding its bytes, and how problems
# name it (a URL).
ChunkFetch = Callable[[str, int], AbstractContextManager[tuple[Path, str]]]


def verify_store(
    path: str | os.PathLike[str] | Index, progress: bool = True, fetch: ChunkFetch | None = None
) -> list[str]:
    """Check the index and every chunk of a store; returns the problems found (empty: good).

    Args:
        path: the store's directory or index file, or its index open already (checked by the
            caller: a URL's copy, opened through its checked cache directory); closed here.
        progress: show a progress bar.
        fetch: where the chunks are not local files (a store at a URL, or one whose index
            records a URL root: `Index.chunk_url`): gives a local copy of each in turn (and
            the name problems give it); its errors (TierfeedError) are problems of that chunk.
    """
    try:
        ix = path if isinstance(path, Index) else Index(path, recheck=True)
    except TierfeedError as exc:
        return [str(exc)]
    with ix:
        return verify_index(ix, progress, fetch)


def verify_index(
    ix: Index,
    progress: bool = True,
    fetch: ChunkFetch | None = None,
    chunks: Sequence[int] | None = None,
) -> list[str]:
    """`verify_store` of an index the caller opened with a full check (``recheck=True``) and
    keeps using: the problems found (empty: good); ``ix`` is left open. ``chunks``: check only
    these chunks' bytes (default: every chunk); the index itself is checked whole either way."""
    if fetch is None and ix.chunk_url is not None:  # no file of its own to check
        return [
            f"{ix.path}: its chunks lie under {ix.chunk_url}; check them there with "
            "`tierfeed verify` (or `tierfeed.loader.commands.verify_location`)"
        ]
    problems = check_index(ix)
    chunks = range(ix.num_chunks) if chunks is None else chunks
    if not len(chunks):
        return problems
    total = int(ix.chunk_size[np.asarray(chunks, dtype=np.intp)].sum())
    members_of = _members_by_chunk(ix)
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        for chunk in chunks:
            problems.extend(_check_one(ix, chunk, bar, fetch, members_of))
    return problems


def _check_one(
    ix: Index,
    chunk: int,
    bar: tqdm[Any],
    fetch: ChunkFetch | None,
    members_of: Callable[[int], npt.NDArray[np.intp]],
) -> list[str]:
    name = ix.chunk_name(chunk)
    try:
        if fetch is None:
            path = safe_chunk_path(ix.chunk_root, name, ix.path)
            return _check_chunk(ix, path, chunk, bar, members_of)
        with fetch(name, int(ix.chunk_size[chunk])) as (local, shown):
            found = _check_chunk(ix, local, chunk, bar, members_of)
            return [problem.replace(str(local), shown) for problem in found]
    except TierfeedError as exc:
        return [str(exc)]


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
    chunk_root: str | None = None  # where the chunks lie (a directory, a URL), if not beside it


def summarize(path: str | os.PathLike[str] | Index) -> StoreSummary:
    """Summarise a store from its index alone (given open: closed here)."""
    with path if isinstance(path, Index) else Index(path) as ix:
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
            chunk_root=ix.chunk_url
            or (None if ix.chunk_root == ix.path.parent else str(ix.chunk_root)),
        )
