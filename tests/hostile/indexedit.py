"""Edit an index file's bytes as an attacker would: header JSON, sections, checksums."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from tierfeed.format.chunkref import new_hasher
from tierfeed.format.index import Index, IndexContent
from tierfeed.format.indexcheck import header_checksum
from tierfeed.format.layout import INDEX_NAME, present_sections

PREFIX = struct.Struct("<8sII")


def read_header(raw: bytes) -> dict[str, Any]:
    """The parsed JSON header of an index file's bytes."""
    _, _, hlen = PREFIX.unpack_from(raw, 0)
    header: dict[str, Any] = json.loads(raw[PREFIX.size : PREFIX.size + hlen])
    return header


def header_slot(raw: bytes) -> int:
    """Bytes before the first section: the room a rewritten header may take."""
    return min(offset for offset, _ in read_header(raw)["sections"].values())


def with_header(raw: bytes, header: dict[str, Any], reseal: bool = True) -> bytes:
    """``raw`` with its JSON header replaced (padded into the same slot).

    With ``reseal`` the header checksum is recomputed (a crafted edit); without, the old one
    is kept (damage).
    """
    header = dict(header)
    if reseal and "header_checksum" in header:
        header["header_checksum"] = header_checksum(header)
    blob = json.dumps(header).encode()
    magic, version, _ = PREFIX.unpack_from(raw, 0)
    head = PREFIX.pack(magic, version, len(blob)) + blob
    slot = header_slot(raw)
    if len(head) > slot:  # an edit too large for the slot: the header overruns the sections
        return head + raw[len(head) :]
    return head.ljust(slot, b"\0") + raw[slot:]


def reseal(raw: bytes) -> bytes:
    """Recompute the sections checksum (and the header's) after editing sections: the index
    an attacker crafts, or a buggy writer leaves."""
    header = read_header(raw)
    hasher = new_hasher()
    for name in present_sections(header["sections"]):
        if name not in header["sections"]:
            continue  # a section taken out of the table: what is left is checksummed
        offset, nbytes = header["sections"][name]
        hasher.update(raw[offset : offset + nbytes])
    header["sections_checksum"] = hasher.intdigest()
    return with_header(raw, header)


def section(raw: bytes, name: str) -> tuple[int, int]:
    """(offset, nbytes) of a section."""
    offset, nbytes = read_header(raw)["sections"][name]
    return int(offset), int(nbytes)


def edit_array(raw: bytes, name: str, change: Any, sealed: bool = True) -> bytes:
    """``raw`` with section ``name`` replaced by ``change(array)`` (same byte length),
    resealed so only the invariant checks can catch it; without ``sealed``, left as rot
    leaves it (the sections checksum stale, every row check as written)."""
    header = read_header(raw)
    offset, nbytes = section(raw, name)
    known = present_sections(header["sections"])
    spec = header["path_order_dtype"] if name == "path_order" else known[name][0]
    spec = header.get("dtypes", {}).get(name, spec)  # format 2 narrows some sections
    array = np.frombuffer(raw, dtype=spec, count=nbytes // np.dtype(spec).itemsize, offset=offset)
    new = np.asarray(change(array.copy()), dtype=spec).tobytes()
    assert len(new) == nbytes, f"edit of {name} changed its length"
    edited = raw[:offset] + new + raw[offset + nbytes :]
    return reseal(edited) if sealed else edited


def boundaries(raw: bytes) -> list[int]:
    """Every section start and end, and the header's end: where truncation hurts most."""
    _, _, hlen = PREFIX.unpack_from(raw, 0)
    out = {0, PREFIX.size, PREFIX.size + hlen}
    for offset, nbytes in read_header(raw)["sections"].values():
        out.update((offset, offset + nbytes))
    return sorted(b for b in out if b < len(raw))


def content_of(index: Index) -> IndexContent:
    """Everything ``index`` holds, as the `IndexContent` that writes it again (a crafted index
    is this with a field replaced, written whole: every checksum is right)."""
    ix = index
    return IndexContent(
        keys=[ix.key_bytes(s) for s in range(ix.num_samples)],
        labels=ix.sample_label.copy(),
        member_start=ix.sample_member_start.copy(),
        member_chunk=ix.member_chunk.copy(),
        member_offset=ix.member_offset.copy(),
        member_length=ix.member_length.copy(),
        member_checksum=ix.member_checksum.copy(),
        member_ext=ix.member_ext.copy(),
        exts=list(ix.exts),
        chunk_names=[c.name for c in ix.chunks()],
        chunk_size=ix.chunk_size.copy(),
        chunk_checksum=ix.chunk_checksum.copy(),
        classes=list(ix.classes),
        extra=dict(ix.header.get("extra", {})),
        member_mode=None if ix.member_mode is None else ix.member_mode.copy(),
        member_mtime=None if ix.member_mtime is None else ix.member_mtime.copy(),
        dir_paths=list(ix.dir_paths) if ix.has_tree else None,
        dir_mode=None if ix.dir_mode is None else ix.dir_mode.copy(),
        dir_mtime=None if ix.dir_mtime is None else ix.dir_mtime.copy(),
        root=ix.root,
    )


def store_with_index(store: Path, chunks_of: Path, raw: bytes) -> Path:
    """A store directory ``store`` holding index bytes ``raw`` and, by a symlink, the chunks of
    the store ``chunks_of``: a damaged index over good chunks, without copying them."""
    store.mkdir(exist_ok=True)
    if not (store / "chunks").exists():
        (store / "chunks").symlink_to(chunks_of / "chunks")
    (store / INDEX_NAME).write_bytes(raw)
    return store


def content_without_tree(index: Index) -> IndexContent:
    """`content_of` less the tree: what an index written before the tree existed (or by
    `tierfeed index` and Writer) holds."""
    return dataclasses.replace(
        content_of(index),
        member_mode=None,
        member_mtime=None,
        dir_paths=None,
        dir_mode=None,
        dir_mtime=None,
        root=None,
    )
