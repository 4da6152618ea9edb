"""`tierfeed index`: index existing tar shards (e.g. WebDataset), without repacking.

The index goes into the store directory ``--out``; the shards stay where they lie: in it (in
place, as before), or elsewhere, even read-only (their directory is recorded as the store's
chunk root: `tierfeed.format.chunkroot`). A shard that is a symbolic link is indexed as the
file it points to. Gzipped shards are decompressed once into the store directory
(`tierfeed.format.gunzip`); brace patterns name shard lists as WebDataset's do
(`tierfeed.format.braces`). Shards at URLs come as a `ShardSet` (`tierfeed.format.shardset`)
whose local copies are read one at a time (`tierfeed.loader.urlshards`).

Foreign shards are untrusted: member names that are absolute, contain ``..`` or NUL, or repeat
another are refused (or skipped and counted when asked), links and devices are not data, and
no chunk path in the resulting index can resolve outside the directory it is relative to.
Every input is checked before any work (`tierfeed.format.shardset`), and each shard is parsed
strictly (`tierfeed.format.tarscan`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tierfeed.errors import (
    BadMemberError,
    ChunkCorruptError,
    DuplicateKeyError,
    EmptySourceError,
    FormatError,
    PackError,
)
from tierfeed.format.chunkref import checksum_range
from tierfeed.format.chunkroot import ShardNames, chunk_root, is_url
from tierfeed.format.index import IndexContent, write_index
from tierfeed.format.labels import CLS_EXTS, CLS_MAX_BYTES, load_classes, parse_cls, resolve_labels
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.names import normalize_member_name, split_key
from tierfeed.format.packplan import OWNER_BITS, SHARED_READ
from tierfeed.format.shardset import ShardSet, shard_set
from tierfeed.format.tarscan import TarMember, open_shard, scan_tar_fd

__all__ = [
    "IndexReport",
    "ShardScan",
    "index_shards",
    "scan_shard_set",
    "write_shard_index",
]


@dataclass
class IndexReport:
    """What `index_shards` indexed and what it skipped."""

    index: Path | str  # the index file, or its URL
    samples: int
    members: int
    chunks: int
    data_bytes: int
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (shard:member, reason)
    shard_root: Path | str | None = None  # where the shards lie (a directory, a URL), if not in it


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
    want_cls: bool = False  # read .cls/.cls2 members as labels
    cls: dict[int, dict[bytes, int]] = field(default_factory=dict)  # sample -> {ext: label}
    shared: int = 0  # the group and other read bits of the shards (the index's, as pack's)

    def labels_of_cls(self) -> list[int | None]:
        """Each sample's cls label (``.cls`` before ``.cls2``), None where it has none."""
        found = [self.cls.get(i, {}) for i in range(len(self.keys))]
        return [next((f[e] for e in CLS_EXTS if e in f), None) for f in found]


def _checksum_range(
    fd: int, offset: int, size: int, where: str, on_block: Callable[[int], object] | None = None
) -> int:
    """xxh3 of ``size`` bytes at ``offset``, read in bounded blocks (never ``size`` at once)."""
    try:
        done, checksum = checksum_range(fd, offset, size, on_block)
    except OSError as exc:
        raise FormatError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if done < size:
        raise ChunkCorruptError(
            f"{where}: ended at byte {offset + done} while being read (it shrank); index "
            "it once it is complete"
        )
    return checksum


def _add_shard(
    got: _Collected,
    chunk: int,
    shard: tuple[Path, str],
    skip_bad: bool,
    skipped: list[tuple[str, str]],
    on_block: Callable[[int], object],
) -> tuple[int, int]:
    """Checksum and scan one shard (its file, and how messages name it); returns its (size,
    checksum)."""
    fd = open_shard(shard[0])  # non-blocking open; refuses anything but a regular file
    try:
        _add_members(got, chunk, shard[1], fd, skip_bad, skipped)  # a bad header fails first
        st = os.fstat(fd)
        size, got.shared = st.st_size, got.shared | (st.st_mode & SHARED_READ)
        checksum = _checksum_range(fd, 0, size, shard[1], on_block)
    finally:
        os.close(fd)
    return size, checksum


def _add_members(
    got: _Collected,
    chunk: int,
    shard: str,
    fd: int,
    skip_bad: bool,
    skipped: list[tuple[str, str]],
) -> None:
    for member in scan_tar_fd(fd, shard):
        if member.is_dir:
            continue  # directory entries carry no data
        where = f"{shard}: member {member.name!r}"
        try:
            if not member.is_file:
                raise BadMemberError(
                    f"{where} is a {member.kind}, not a regular file (a link or device is not data)"
                )
            path = normalize_member_name(member.name, shard)
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
        # The scanner checked the size against the file: the reads stay inside it.
        got.checksum.append(_checksum_range(fd, member.offset, member.size, shard))
        got.ext.append(ext)
        if got.want_cls and ext in CLS_EXTS:
            got.cls.setdefault(len(got.keys) - 1, {})[ext] = _read_cls(fd, member, where)


def _read_cls(fd: int, member: TarMember, where: str) -> int:
    """The label in a ``.cls`` member (read at most CLS_MAX_BYTES + 1 bytes of it)."""
    try:
        text = os.pread(fd, min(member.size, CLS_MAX_BYTES + 1), member.offset)
    except OSError as exc:
        raise FormatError(f"{where}: cannot read: {exc.strerror or exc}") from None
    return parse_cls(text, where)


def _scan_shards(
    got: _Collected,
    shards: ShardSet,
    skip_bad: bool,
    skipped: list[tuple[str, str]],
    progress: bool,
) -> tuple[list[int], list[int]]:
    """Collect the members of every shard in order (each read from its local file, one at a
    time); each shard's (size, checksum) lists.

    Raises:
        EmptySourceError: the shards hold no regular file.
    """
    sizes, sums = [], []
    total = sum(shards.sizes)
    with tqdm(total=total, unit="B", unit_scale=True, desc="index", disable=not progress) as bar:
        for chunk, shown in enumerate(shards.shown):
            with shards.fetch(chunk) as path:
                size, checksum = _add_shard(
                    got, chunk, (path, shown), skip_bad, skipped, bar.update
                )
            sizes.append(size)
            sums.append(checksum)
    if not got.keys:
        raise EmptySourceError(f"{', '.join(shards.shown)}: no regular file in the shards")
    return sizes, sums


def _content(
    got: _Collected,
    label_of: Sequence[int],
    class_names: list[str],
    names: list[str],
    sizes: list[int],
    sums: list[int],
    skipped: int,
) -> IndexContent:
    """The index of the collected members, the shards as its chunks; a sample's members in
    extension order, as every index holds them (a shard's own order may be any)."""
    exts = sorted(set(got.ext))
    ext_id = {e: i for i, e in enumerate(exts)}
    start = np.asarray([*got.starts, len(got.offset)], dtype=np.uint64)
    ext = np.asarray([ext_id[e] for e in got.ext], dtype=np.uint16)
    owner = np.repeat(np.arange(len(got.keys)), np.diff(start).astype(np.int64))
    order = np.lexsort((ext, owner))  # by sample, then extension
    return IndexContent(
        keys=got.keys,
        labels=np.asarray(label_of, dtype=np.int32),
        member_start=start,
        member_chunk=np.asarray(got.chunk, dtype=np.uint32)[order],
        member_offset=np.asarray(got.offset, dtype=np.uint64)[order],
        member_length=np.asarray(got.length, dtype=np.uint64)[order],
        member_checksum=np.asarray(got.checksum, dtype=np.uint64)[order],
        member_ext=ext[order],
        exts=exts,
        chunk_names=names,
        chunk_size=np.asarray(sizes, dtype=np.uint64),
        chunk_checksum=np.asarray(sums, dtype=np.uint64),
        classes=class_names,
        extra={"skipped": skipped, "indexed_in_place": True},
    )


@dataclass
class ShardScan:
    """The members of a run of shards, read (`scan_shard_set`): what an index of them holds
    but its labels (`tierfeed.format.indexparts` joins the scans of parts)."""

    got: _Collected
    sizes: list[int]
    sums: list[int]
    skipped: list[tuple[str, str]]

    def content(
        self, label_of: Sequence[int], class_names: list[str], where: ShardNames
    ) -> IndexContent:
        """The index of the shards, named as ``where`` says."""
        got, count = self.got, len(self.skipped)
        content = _content(got, label_of, class_names, where.names, self.sizes, self.sums, count)
        content.chunk_root = where.root
        return content

    def report(self, index_path: Path, root: str | None) -> IndexReport:
        """What indexing these shards into ``index_path`` did (``root``: the recorded one)."""
        got = self.got
        shard_root = root if root is None or is_url(root) else chunk_root(index_path, root)
        counts = (len(got.keys), len(got.offset), len(self.sizes), sum(got.length))
        return IndexReport(index_path, *counts, self.skipped, shard_root)


def scan_shard_set(shards: ShardSet, labels: str, skip_bad: bool, progress: bool) -> ShardScan:
    """Read every shard of ``shards`` in order (``.cls`` members too when ``labels`` may use
    them)."""
    got = _Collected(want_cls=labels in ("auto", "cls"))
    skipped: list[tuple[str, str]] = []
    sizes, sums = _scan_shards(got, shards, skip_bad, skipped, progress)
    return ShardScan(got, sizes, sums, skipped)


def write_shard_index(index_path: Path, content: IndexContent, scan: ShardScan) -> None:
    """Write ``content`` to ``index_path``, no more readable than the shards."""
    try:
        # No wider than the shards: the index names every member (pack's rule, `packplan`).
        write_index(index_path, content, mode=OWNER_BITS | scan.got.shared)
    except OSError as exc:
        raise PackError(f"{index_path}: cannot write the index: {exc.strerror or exc}") from None


def index_shards(
    shards: Sequence[str | os.PathLike[str]] | ShardSet,
    out: str | os.PathLike[str],
    labels: str = "auto",
    skip_bad_names: bool = False,
    progress: bool = True,
    classes: str | os.PathLike[str] | Sequence[str] | None = None,
    overwrite: bool = False,
) -> IndexReport:
    """Index tar ``shards`` where they lie; write the index into the store directory ``out``.

    Args:
        shards: tar files, in chunk order: plain ``.tar`` files (or links to them) read where
            they lie, only read (in ``out``, or elsewhere: their directory is then recorded
            as the store's chunk root, `tierfeed.format.chunkroot`), or ``.tar.gz``/``.tgz``
            files decompressed once into ``out`` (`tierfeed.format.gunzip`). A string may be
            a brace pattern (``"shard-{000000..000009}.tar"``). Or a `ShardSet`: shards at
            a URL, read through local copies, recorded as it says
            (`tierfeed.format.shardset`).
        out: the store directory, made if missing (or the index file's path inside it).
        labels: ``auto`` (labels from ``.cls`` members, integer text, when any sample has one
            (``.cls2`` where a sample has no ``.cls``); else ImageFolder labels as for pack),
            ``cls`` (every sample needs one), ``folder`` or ``none``.
        skip_bad_names: skip unsafe or repeated member names (counted) instead of failing.
        progress: show a progress bar on stderr.
        classes: names of the ``.cls`` classes: a list, or a ``classes.txt``-style file (line
            ``i`` names class ``i``); without one class ``i`` is named ``"i"``.
        overwrite: replace an index already in ``out`` (refused without it, as pack refuses
            to replace a store).
    """
    out_path = Path(out)
    index_path = out_path if out_path.suffix == ".tfi" else out_path / INDEX_NAME
    shards = shard_set(shards, out_path, index_path, overwrite, progress)  # checked, in place
    names_of_cls = None if classes is None else load_classes(classes)
    scan = scan_shard_set(shards, labels, skip_bad_names, progress)
    got = scan.got
    label_of, class_names = resolve_labels(
        got.keys, got.labels_of_cls(), labels, names_of_cls, index_path.parent
    )
    write_shard_index(index_path, scan.content(label_of, class_names, shards.where), scan)
    return scan.report(index_path, shards.where.root)
