"""Finishing a store written from Python (`tierfeed.Writer`, `tierfeed.optimize`): its options
checked, its keys and member paths checked, its index written last.

The same crash safety as `tierfeed pack`: each chunk is written under a temporary name
(``.tmp.<pid>.NNNNNN.tar``, see `tierfeed.publish`) and renamed when whole, and the index is
written last (after every chunk is synced: each in the background as soon as it is whole,
`tierfeed.format.chunksync`; then the index itself, fsynced, atomic rename), so an interrupted
write leaves no store that opens. A Writer cannot resume (it does not own its input): a
destination holding chunks but no index is refused unless ``overwrite=True``
(`tierfeed.format.storetarget`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierfeed.errors import (
    BadMemberError,
    ConfigError,
    DuplicateKeyError,
    EmptySourceError,
)
from tierfeed.format.chunksink import ChunkRecord
from tierfeed.format.index import IndexContent, write_index
from tierfeed.format.labels import LABEL_MODES, resolve_labels
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import check_chunk_size
from tierfeed.format.tarchunk import cannot_write, sync_files

__all__ = ["Classes", "WriteReport", "check_options", "finish_store"]

Classes = str | os.PathLike[str] | Sequence[str] | None


@dataclass
class WriteReport:
    """What a `Writer` (or `optimize`) wrote."""

    store: Path | str  # the directory, or the URL the store was uploaded to
    samples: int
    members: int
    chunks: int
    data_bytes: int
    seconds: float

    @classmethod
    def of(
        cls, store: Path | str, content: IndexContent, chunks: int, started: float
    ) -> WriteReport:
        """The report of a store with index ``content``, begun at ``perf_counter()`` ``started``."""
        return cls(
            store=store,
            samples=len(content.keys),
            members=len(content.member_offset),
            chunks=chunks,
            data_bytes=int(content.member_length.sum()),
            seconds=time.perf_counter() - started,
        )


def check_options(chunk_size: int | str, labels: str, image_quality: int = 95) -> int:
    """The chunk size in bytes (`check_chunk_size`); ConfigError for a chunk size, label mode
    or image quality tierfeed cannot use."""
    size = check_chunk_size(chunk_size)
    if not (isinstance(image_quality, int) and 1 <= image_quality <= 100):
        raise ConfigError(f"image_quality must be an int in 1..100, got {image_quality!r}")
    if labels not in LABEL_MODES:
        raise ConfigError(f"labels must be one of {', '.join(LABEL_MODES)}, got {labels!r}")
    return size


def _check_tree(keys: list[bytes], exts: list[bytes], counts: np.ndarray[Any, Any]) -> None:
    """Refuse a member path that is also a directory of another key (``a.jpg`` and
    ``a.jpg/b``, or ``a`` with the field ``""`` and ``a/b``), or the path of another member
    (``a.b`` + ``.c`` and ``a`` + ``.b.c``): the store's tree could not show both.

    Only a dot in a key's last component, or a member without an extension, can make either:
    keys without them (WebDataset's) skip the O(members) walk."""
    if b"" not in exts and not any(b"." in k for k in keys):
        return
    dotted_keys = any(b"." in k[k.rfind(b"/") + 1 :] for k in keys)
    dirs = {
        b"/".join(parts[:i])
        for parts in (k.split(b"/") for k in keys if b"/" in k)
        for i in range(1, len(parts))
    }
    owner = np.repeat(np.arange(len(keys)), counts.astype(np.int64))
    seen: set[bytes] = set()
    for o, ext in zip(owner.tolist(), exts, strict=True):
        path = keys[o] + ext
        if path in dirs:
            raise BadMemberError(
                f"sample {os.fsdecode(keys[o])!r}: its member {os.fsdecode(path)!r} is "
                "also a directory of another sample's key; rename one of them"
            )
        if dotted_keys:
            if path in seen:
                raise BadMemberError(
                    f"sample {os.fsdecode(keys[o])!r}: its member {os.fsdecode(path)!r} is "
                    "written twice (another sample's key and field name the same path); "
                    "rename one of them"
                )
            seen.add(path)


def _refuse_duplicate(dst: Path, keys: list[bytes]) -> None:
    """DuplicateKeyError naming the first key of ``keys`` that is written twice."""
    seen: set[bytes] = set()
    for k in keys:
        if k in seen:
            raise DuplicateKeyError(f"{dst}: sample key {os.fsdecode(k)!r} is written twice")
        seen.add(k)


def _content(
    records: list[ChunkRecord],
    keys: list[bytes],
    ext: list[bytes],
    counts: np.ndarray[Any, Any],
    label_of: list[int],
    names: list[str],
    chunk_size: int,
) -> IndexContent:
    """The index of the members of ``records``, one chunk per record."""
    exts = sorted(set(ext))
    ext_id = {e: i for i, e in enumerate(exts)}
    start = np.zeros(len(keys) + 1, dtype=np.uint64)
    np.cumsum(counts, out=start[1:])
    return IndexContent(
        keys=keys,
        labels=np.asarray(label_of, dtype=np.int32),
        member_start=start,
        member_chunk=np.concatenate(
            [np.full(len(r.ext), c, dtype=np.uint32) for c, r in enumerate(records)]
        ),
        member_offset=np.concatenate([r.offset for r in records]),
        member_length=np.concatenate([r.length for r in records]),
        member_checksum=np.concatenate([r.member_checksum for r in records]),
        member_ext=np.asarray([ext_id[e] for e in ext], dtype=np.uint16),
        exts=exts,
        chunk_names=[r.name for r in records],
        chunk_size=np.asarray([r.size for r in records], dtype=np.uint64),
        chunk_checksum=np.asarray([r.checksum for r in records], dtype=np.uint64),
        classes=names,
        extra={"writer": "tierfeed.Writer", "chunk_target_bytes": chunk_size},
    )


def finish_store(
    dst: Path,
    records: list[ChunkRecord],
    labels: str,
    classes: list[str] | None,
    chunk_size: int,
    check_unique: bool,
) -> IndexContent:
    """Write the index of ``records`` (in store order) last: sync every chunk, then publish."""
    keys = [k for r in records for k in r.keys]
    if not keys:
        raise EmptySourceError(f"{dst}: no sample was written; no index written")
    if check_unique and len(set(keys)) != len(keys):
        _refuse_duplicate(dst, keys)
    ext = [e for r in records for e in r.ext]
    counts = np.concatenate([r.member_count for r in records])
    _check_tree(keys, ext, counts)
    label_of, names = resolve_labels(
        keys, [c for r in records for c in r.cls], labels, classes, dst
    )
    content = _content(records, keys, ext, counts, label_of, names, chunk_size)
    try:
        sync_files([dst / r.name for r in records])
        write_index(dst / INDEX_NAME, content)
    except OSError as exc:
        raise cannot_write(Path(os.fsdecode(exc.filename or dst / INDEX_NAME)), exc) from None
    return content
