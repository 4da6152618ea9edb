"""`tierfeed merge`: join the parts `tierfeed pack --part` packed into the store's one index.

No chunk is copied: the store's index names each part's chunks where they lie
(``parts/part-000I-of-000N/chunks/...``). Before anything is written every part must be there
and finished, of one source (the fingerprint its index records) and one count N, each holding
exactly its share of the samples, and every part's index must check whole. A part records
its chunks' sizes and mtimes as it wrote them (and checksummed them); a chunk still so is
trusted, any other is verified as `tierfeed verify` checks it (size, xxh3, tar headers), and
``verify=True`` (`tierfeed merge --verify`) verifies every chunk: a store of millions of
samples merges in seconds, not in a read of all its bytes. The index is then written
atomically: the merged store is the store a single pack makes (samples, keys, labels,
classes, bytes), its chunks cut at the parts' ends. Merging again rewrites the same index; an
index not merged from parts is replaced only when asked.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from tierfeed.errors import PackError, TierfeedError
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.index import Index, IndexContent, write_index
from tierfeed.format.indexparts import KIND, merged_index
from tierfeed.format.indexwrite import KeyBlob
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.mergecheck import in_order, verify_parts
from tierfeed.format.packplan import OWNER_BITS
from tierfeed.format.packstate import lock_destination, unlock_destination
from tierfeed.format.parts import PART_NAME, PARTS_DIR, part_directory, part_name
from tierfeed.format.tarchunk import cannot_write

__all__ = ["MergeReport", "merge_parts"]

_MAKE = "`tierfeed pack SRC DST --part I/N` or `tierfeed index SHARDS --out DST --part I/N`"


@dataclass
class MergeReport:
    """What a merge did."""

    store: Path
    parts: int
    samples: int
    chunks: int
    data_bytes: int
    seconds: float
    chunks_read: int = 0  # read again to verify them (the rest: as their parts wrote them)


def _counts(dst: Path) -> set[int]:
    """The counts N of the parts under ``dst/parts``."""
    try:
        names = [p.name for p in (dst / PARTS_DIR).iterdir()]
    except FileNotFoundError:
        raise PackError(
            f"{dst}: holds no parts ({PARTS_DIR}/ is missing); make them first with {_MAKE}"
        ) from None
    return {int(m.group(2)) for m in map(PART_NAME.fullmatch, names) if m}


def _part_count(dst: Path) -> int:
    """The one count N of the parts under ``dst``; refuses none, or parts of several N."""
    counts = _counts(dst)
    if not counts:
        raise PackError(f"{dst}: holds no parts; make them with {_MAKE}")
    if len(counts) > 1:
        found = " and ".join(str(n) for n in sorted(counts))
        raise PackError(
            f"{dst / PARTS_DIR}: holds parts of {found} parts: packs in different numbers of "
            "parts cannot be merged; remove the directories of the ones not wanted"
        )
    return counts.pop()


def _again(dst: Path, index: int, count: int, known: dict[str, Any] | None) -> str:
    """The command that makes part ``index`` of ``count``, as a finished part (``known``)
    was made."""
    if known is not None and known.get("kind") == KIND:
        return (
            f"run `tierfeed index SHARDS --out {dst} --part {index}/{count}` with the shards "
            f"the other parts were given ({known.get('src')})"
        )
    src = known.get("src", "SRC") if known is not None else "SRC"
    return f"run `tierfeed pack {src} {dst} --part {index}/{count}`"


def _open_part(dst: Path, index: int, count: int) -> Index:
    """Part ``index`` of ``count``, its index open with a full check (`verify_index` checks the
    rest) and its record checked against its name."""
    directory = part_directory(dst, index, count)
    if not (directory / INDEX_NAME).exists():
        state = "is not finished (interrupted?)" if directory.exists() else "is missing"
        again = _again(dst, index, count, _known_part(dst, count))
        raise PackError(f"{directory}: part {index} of {count} {state}: {again}")
    ix = Index(directory, recheck=True)
    record = ix.header["extra"].get("part")
    if not isinstance(record, dict) or (record.get("index"), record.get("count")) != (
        index,
        count,
    ):
        ix.close()
        again = _again(dst, index, count, _known_part(dst, count))
        raise PackError(
            f"{directory}: does not hold part {index} of {count} (its index says "
            f"{_said(record)}); remove it and {again}"
        )
    return ix


def _said(record: Any) -> str:
    if not isinstance(record, dict):
        return "it is no part"
    return f"part {record.get('index')} of {record.get('count')}"


def _known_part(dst: Path, count: int) -> dict[str, Any] | None:
    """What a finished part records of itself, for the advice that names how it was made."""
    for index in range(count):
        try:
            with Index(part_directory(dst, index, count)) as ix:
                record = ix.header["extra"]["part"]
                if isinstance(record, dict):
                    return record
        except (TierfeedError, OSError, KeyError, TypeError):
            continue
    return None


def _check_shares(parts: list[Index], dst: Path) -> None:
    """Every part of one source, the parts' shares of the samples (or shards) contiguous in
    part order from the first to the last (none overlaps, none is left out), each holding
    exactly its share."""
    first = parts[0].header["extra"]["part"]
    count, at = len(parts), 0
    for ix in parts:
        record = ix.header["extra"]["part"]
        where = part_directory(dst, record["index"], count)
        if record.get("source") != first["source"] or record.get("of") != first["of"]:
            raise PackError(
                f"{where}: made from another source than {part_name(0, count)} ({record['src']} "
                f"as it was then, not {first['src']}): the source changed between parts, or "
                "they are of two sources; pack the parts again from one source"
            )
        unit = "shards" if record.get("kind") == KIND else "samples"
        held = ix.num_chunks if unit == "shards" else ix.num_samples
        share = record.get(unit)
        end = int(first["of"]) if record["index"] == count - 1 else None
        if not _follows(share, at, end) or held != share[1] - share[0]:
            wanted = f"from {at}" if end is None else f"from {at} to {end}"
            raise PackError(
                f"{where}: holds {unit} {share} and {held} of them, not the share that follows "
                f"the part before it ({wanted}): the parts overlap or leave {unit} out; make "
                "this part again"
            )
        at = share[1]


def _follows(share: Any, at: int, end: int | None) -> bool:
    """``share`` is [start, stop) from ``at`` (to ``end``, when given), holding one at least."""
    if not (isinstance(share, list) and len(share) == 2):
        return False
    if not all(isinstance(v, int) for v in share):
        return False
    return bool(share[0] == at < share[1] and (end is None or share[1] == end))


def _keys(parts: list[Index]) -> KeyBlob:
    """The parts' keys in part order, as one blob: their key sections one after the other,
    where they lie (written from there, not joined)."""
    blobs = tuple(ix.key_blob() for ix in parts)
    at = np.cumsum([0] + [len(blob) for blob in blobs]).tolist()
    offsets = _shifted([ix.sample_key_offset[:-1] for ix in parts], at, at[-1])
    return KeyBlob(offsets, blobs)


def _shifted(columns: list[npt.NDArray[Any]], shifts: list[int], end: int | None) -> Any:
    """Each part's ids or offsets moved on by its shift, one after the other (then ``end``,
    when given), 32-bit where the largest fits: as the index stores them, no wider copy."""
    top = end if end is not None else shifts[len(columns)] - 1
    out = np.empty(
        sum(map(len, columns)) + (end is not None), np.uint32 if top < 2**32 else np.uint64
    )
    at = 0
    for column, shift in zip(columns, shifts, strict=False):
        np.add(column, shift, out=out[at : at + len(column)], casting="unsafe")
        at += len(column)
    if end is not None:
        out[at] = end
    return out


def _path_order(parts: list[Index]) -> npt.NDArray[np.uint64] | None:
    """The merged members' path order: each part's (`verify_index` checked it sorts the
    part's paths), one after the other, when every part's paths sort after those of the part
    before it; None when they interleave (the writer then sorts every path)."""
    last = None
    for ix in parts:
        if ix.num_members:
            if last is not None and ix.sorted_path(0) <= last:
                return None
            last = ix.sorted_path(ix.num_members - 1)
    first = np.cumsum([0] + [ix.num_members for ix in parts]).tolist()
    return _shifted([ix.path_order for ix in parts], first, None)  # type: ignore[no-any-return]


def _joined(parts: list[Index], name: str, dtype: Any) -> Any:
    """The parts' column ``name``, one after the other. (A key's own check is the high half of
    its ``sample_check``, `tierfeed.format.rowcheck`: as its part wrote it, whose sections
    checksum was checked, so the merge joins the keys' checks rather than hash every key.)"""
    columns = [np.asarray(getattr(ix, name)) for ix in parts]
    return np.concatenate(columns, dtype=dtype, casting="unsafe")  # (no copy of each first)


def _merged(parts: list[Index]) -> IndexContent:
    """The store's index: the parts' rows in part order, chunk names relative to the store."""
    exts = sorted({e for ix in parts for e in ix.exts})
    members = np.cumsum([0] + [ix.num_members for ix in parts]).tolist()
    chunks = np.cumsum([0] + [ix.num_chunks for ix in parts]).tolist()
    ext_ids = [np.asarray([exts.index(e) for e in ix.exts], dtype=np.uint16) for ix in parts]
    first, extra = parts[0], [ix.header["extra"] for ix in parts]

    def joined(name: str, dtype: Any) -> Any:
        return _joined(parts, name, dtype)

    tree: dict[str, Any] = {}
    if first.has_tree:
        tree = {
            "member_mode": joined("member_mode", np.uint16),
            "member_mtime": joined("member_mtime", np.int64),
            "dir_paths": list(first.dir_paths),
            "dir_mode": np.asarray(first.dir_mode, dtype=np.uint16),
            "dir_mtime": np.asarray(first.dir_mtime, dtype=np.int64),
            "root": first.root,
        }
    return IndexContent(
        keys=_keys(parts),
        key_checks=joined("sample_check", np.uint64) >> np.uint64(32),  # (`_joined`)
        path_order=_path_order(parts),
        labels=joined("sample_label", np.int32),
        member_start=_shifted([ix.sample_member_start[:-1] for ix in parts], members, members[-1]),
        member_chunk=np.concatenate(
            [ix.member_chunk.astype(np.uint32) + chunks[i] for i, ix in enumerate(parts)]
        ),
        member_offset=joined("member_offset", None),  # (as wide as the parts': `NARROW`)
        member_length=joined("member_length", None),
        member_checksum=joined("member_checksum", np.uint64),
        member_ext=np.concatenate([ext_ids[i][ix.member_ext] for i, ix in enumerate(parts)]),
        exts=exts,
        chunk_names=[_chunk_name(ix, c) for ix in parts for c in range(ix.num_chunks)],
        chunk_size=joined("chunk_size", np.uint64),
        chunk_checksum=joined("chunk_checksum", np.uint64),
        classes=first.classes,
        extra={
            **{k: v for k, v in extra[0].items() if k not in ("part", "skipped")},
            "skipped": sum(int(e.get("skipped", 0)) for e in extra),
            "parts": {"count": len(parts), "source": extra[0]["part"]["source"]},
        },
        **tree,
    )


def _chunk_name(ix: Index, chunk: int) -> str:
    """Chunk ``chunk`` of a part, named relative to the store (the part's directory in front),
    or a shard, named under the shards' root (as the part names it)."""
    record = ix.header["extra"]["part"]
    if record.get("kind") == KIND:
        return ix.chunk_name(chunk)
    return f"{PARTS_DIR}/{part_name(record['index'], record['count'])}/{ix.chunk_name(chunk)}"


def _index_mode(parts: list[Index]) -> int:
    """The store index's mode: the widest of the parts' (each as wide as its widest member)."""
    mode = OWNER_BITS
    for ix in parts:
        mode |= stat.S_IMODE(os.stat(ix.path).st_mode)
    return mode


def _write(dst: Path, content: IndexContent, mode: int, overwrite: bool) -> None:
    """Write the store's index under the store's lock; an index already there is replaced
    when it was merged from parts, or when ``overwrite``."""
    try:
        fd = lock_destination(dst)
    except OSError as exc:
        raise cannot_write(dst, exc) from None
    try:
        if (dst / INDEX_NAME).exists() and not overwrite:
            with Index(dst / INDEX_NAME, lazy=True) as old:  # its header is what is asked
                if "parts" not in old.header["extra"]:
                    raise already_holds_a_store(dst, "--overwrite")
        write_index(dst / INDEX_NAME, content, mode=mode)
    except OSError as exc:
        raise cannot_write(Path(os.fsdecode(exc.filename or dst)), exc) from None
    finally:
        unlock_destination(dst, fd)


def merge_parts(
    dst: str | os.PathLike[str],
    overwrite: bool = False,
    progress: bool = True,
    verify: bool = False,
) -> MergeReport:
    """Join the parts packed under ``dst`` (`tierfeed.format.parts.pack_part`) into the store
    at ``dst``: checked, then its one index written atomically (see the module).

    Args:
        dst: the store directory the parts were packed into.
        overwrite: replace an index at ``dst`` that was not merged from parts.
        progress: show a progress bar while the chunks are verified.
        verify: read every chunk of every part again, as `tierfeed verify` does (default:
            only the chunks whose size or mtime is not what their part recorded).

    Raises:
        PackError: a part is missing, unfinished, damaged, of another source or count, or
            holds another share; ``dst`` holds a store not merged from parts.
    """
    root, started = Path(dst), time.perf_counter()
    count = _part_count(root)
    parts: list[Index] = []
    try:
        with tqdm(total=count, unit="part", desc="open", disable=not progress) as bar:
            parts = in_order(lambda i: _open_part(root, i, count), count, bar, Index.close)
        _check_shares(parts, root)
        read = verify_parts(parts, progress, verify)
        content = _merged(parts)
        if parts[0].header["extra"]["part"].get("kind") == KIND:
            content = merged_index(content, parts, root)
        _write(root, content, _index_mode(parts), overwrite)
    finally:
        for ix in parts:
            ix.close()
    return MergeReport(
        store=root,
        parts=count,
        samples=len(content.keys),
        chunks=len(content.chunk_names),
        data_bytes=int(content.member_length.sum()),
        seconds=time.perf_counter() - started,
        chunks_read=read,
    )
