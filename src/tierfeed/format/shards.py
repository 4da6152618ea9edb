"""`tierfeed index`: index existing tar shards (e.g. WebDataset) in place, without repacking.

Foreign shards are untrusted: member names that are absolute, contain ``..`` or NUL, or repeat
another are refused (or skipped and counted when asked), links and devices are not data, and
no chunk path in the resulting index can resolve outside the store directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tierfeed.errors import BadMemberError, DuplicateKeyError, EmptySourceError, PackError
from tierfeed.format.chunkref import checksum_bytes, checksum_file
from tierfeed.format.index import IndexContent, write_index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.names import normalize_member_name, split_key
from tierfeed.format.source import assign_labels
from tierfeed.format.tarchunk import scan_tar

__all__ = ["IndexReport", "index_shards"]


@dataclass
class IndexReport:
    """What `index_shards` indexed and what it skipped."""

    index: Path
    samples: int
    members: int
    chunks: int
    data_bytes: int
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (shard:member, reason)


@dataclass
class _Collected:
    keys: list[bytes] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    chunk: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    checksum: list[int] = field(default_factory=list)
    ext: list[bytes] = field(default_factory=list)
    seen_paths: set[bytes] = field(default_factory=set)
    seen_keys: set[bytes] = field(default_factory=set)


def _chunk_name(shard: Path, root: Path) -> str:
    try:
        rel = shard.resolve().relative_to(root.resolve())
    except ValueError:
        raise PackError(
            f"{shard}: shard lies outside the store directory {root}; pass --out a directory "
            "that contains every shard (chunk paths in an index never leave the store)"
        ) from None
    return rel.as_posix()


def _add_shard(
    got: _Collected, chunk: int, shard: Path, skip_bad: bool, skipped: list[tuple[str, str]]
) -> None:
    with open(shard, "rb") as fh:
        _add_members(got, chunk, shard, fh.fileno(), skip_bad, skipped)


def _add_members(
    got: _Collected,
    chunk: int,
    shard: Path,
    fd: int,
    skip_bad: bool,
    skipped: list[tuple[str, str]],
) -> None:
    for member in scan_tar(shard):
        if member.is_dir:
            continue  # directory entries carry no data
        where = f"{shard}: member {member.name!r}"
        try:
            if not member.is_file:
                raise BadMemberError(f"{where} is a link or device; only regular files are data")
            path = normalize_member_name(member.name, str(shard))
            if path in got.seen_paths:
                raise BadMemberError(f"{where} repeats an earlier member of the same name")
        except BadMemberError as exc:
            if not skip_bad:
                raise BadMemberError(f"{exc}; pass --skip-bad-names to skip such members") from None
            skipped.append((f"{shard}:{member.name}", str(exc)))
            continue
        got.seen_paths.add(path)
        key, ext = split_key(path)
        new_sample = not got.keys or got.keys[-1] != key or got.chunk[-1] != chunk
        if new_sample:
            if key in got.seen_keys:
                raise DuplicateKeyError(
                    f"{where}: sample key {os.fsdecode(key)!r} appears again away from its other "
                    "members; a sample's members must be adjacent in one shard"
                )
            got.seen_keys.add(key)
            got.keys.append(key)
            got.starts.append(len(got.offset))
        got.chunk.append(chunk)
        got.offset.append(member.offset)
        got.length.append(member.size)
        got.checksum.append(checksum_bytes(os.pread(fd, member.size, member.offset)))
        got.ext.append(ext)


def index_shards(
    shards: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    labels: str = "auto",
    skip_bad_names: bool = False,
    progress: bool = True,
) -> IndexReport:
    """Index tar ``shards`` in place; write the index into the store directory ``out``.

    Args:
        shards: uncompressed tar files, all inside ``out``; they become chunks in this order.
        out: the store directory (or the index file's path inside it).
        labels: ``auto``, ``folder`` or ``none`` (as for pack).
        skip_bad_names: skip unsafe or repeated member names (counted) instead of failing.
        progress: show a progress bar on stderr.
    """
    out_path = Path(out)
    index_path = out_path if out_path.suffix == ".tfi" else out_path / INDEX_NAME
    root = index_path.parent
    paths = [Path(s) for s in shards]
    if not paths:
        raise EmptySourceError("no shard given to index")
    names = [_chunk_name(p, root) for p in paths]
    got = _Collected()
    skipped: list[tuple[str, str]] = []
    sizes, sums = [], []
    total = sum(p.stat().st_size for p in paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc="index", disable=not progress) as bar:
        for chunk, shard in enumerate(paths):
            size, checksum = checksum_file(shard, bar.update)
            sizes.append(size)
            sums.append(checksum)
            _add_shard(got, chunk, shard, skip_bad_names, skipped)
    if not got.keys:
        raise EmptySourceError(f"{', '.join(map(str, paths))}: no regular file in the shards")
    label_of, classes = assign_labels(got.keys, labels, root)
    exts = sorted(set(got.ext))
    ext_id = {e: i for i, e in enumerate(exts)}
    content = IndexContent(
        keys=got.keys,
        labels=np.asarray(label_of, dtype=np.int32),
        member_start=np.asarray([*got.starts, len(got.offset)], dtype=np.uint64),
        member_chunk=np.asarray(got.chunk, dtype=np.uint32),
        member_offset=np.asarray(got.offset, dtype=np.uint64),
        member_length=np.asarray(got.length, dtype=np.uint64),
        member_checksum=np.asarray(got.checksum, dtype=np.uint64),
        member_ext=np.asarray([ext_id[e] for e in got.ext], dtype=np.uint16),
        exts=exts,
        chunk_names=names,
        chunk_size=np.asarray(sizes, dtype=np.uint64),
        chunk_checksum=np.asarray(sums, dtype=np.uint64),
        classes=classes,
        extra={"skipped": len(skipped), "indexed_in_place": True},
    )
    write_index(index_path, content)
    return IndexReport(
        index_path, len(got.keys), len(got.offset), len(paths), sum(got.length), skipped
    )
