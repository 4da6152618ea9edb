"""Writing the metadata snapshot: `IndexContent` (plain arrays) to an index file, atomically."""

from __future__ import annotations

import itertools
import json
import os
import struct
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import IndexFormatError
from tierfeed.format.chunkref import CHECKSUM_ALGO, new_hasher
from tierfeed.format.headercheck import header_checksum
from tierfeed.format.layout import (
    MAGIC,
    NARROW,
    ROW_CHECK_SECTIONS,
    aligned,
    present_sections,
    version_of,
)
from tierfeed.format.pathsort import padded_paths, sorted_order
from tierfeed.format.rowcheck import write_checks
from tierfeed.publish import PendingFile, publishing

__all__ = ["PREFIX", "IndexContent", "KeyBlob", "write_index"]

PREFIX = struct.Struct("<8sII")
Payload = bytes | memoryview  # a section's bytes in file order, or a piece of them
Section = npt.NDArray[Any] | bytes | tuple[Payload, ...]  # a section before encoding


@dataclass(frozen=True)
class KeyBlob:
    """Sample keys as one blob: key ``i`` is ``blob[offsets[i]:offsets[i + 1]]``. What
    `IndexContent.keys` may be instead of a list, where the keys come as blobs already (a
    merge of parts' indexes): no Python bytes object per key, and the blob kept in the
    ``pieces`` it came in (each part's key section, where it lies), written as they are."""

    offsets: npt.NDArray[np.uint64]  # samples + 1, from 0 to the blob's length
    pieces: tuple[Payload, ...]  # the blob, in pieces one after the other

    @cached_property
    def blob(self) -> bytes:
        """The pieces joined (a copy: for what needs the blob whole)."""
        return b"".join(self.pieces)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> bytes:
        return self.blob[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def __iter__(self) -> Iterator[bytes]:
        bounds, blob = self.offsets.tolist(), self.blob
        return (blob[lo:hi] for lo, hi in itertools.pairwise(bounds))


@dataclass
class IndexContent:
    """Everything an index holds, as plain arrays: what `write_index` takes.

    Samples are in store order; the members of a sample are contiguous and sorted by
    extension; every member of a sample lies in the sample's chunk.
    """

    keys: list[bytes] | KeyBlob
    labels: npt.NDArray[np.int32]
    member_start: npt.NDArray[np.uint64]  # samples + 1
    member_chunk: npt.NDArray[np.uint32]
    member_offset: npt.NDArray[np.uint64]
    member_length: npt.NDArray[np.uint64]
    member_checksum: npt.NDArray[np.uint64]
    member_ext: npt.NDArray[np.uint16]
    exts: list[bytes]
    chunk_names: list[str]
    chunk_size: npt.NDArray[np.uint64]
    chunk_checksum: npt.NDArray[np.uint64]
    classes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # The packed tree (all given, or none): per member, then per directory (root excluded,
    # sorted bytewise by path, every parent listed).
    member_mode: npt.NDArray[np.uint16] | None = None
    member_mtime: npt.NDArray[np.int64] | None = None  # nanoseconds
    dir_paths: list[bytes] | None = None
    dir_mode: npt.NDArray[np.uint16] | None = None
    dir_mtime: npt.NDArray[np.int64] | None = None  # nanoseconds
    root: tuple[int, int] | None = None  # (mode, mtime ns) of the tree's root
    # The directory the chunk names are relative to, when not the index's own: absolute, or
    # relative to it (`tierfeed.format.chunkroot`; format 4).
    chunk_root: str | None = None
    # Each key's own check (`tierfeed.format.rowcheck.name_check`), when the caller holds
    # them already (a merge: its parts' checked indexes); computed from the keys when None.
    key_checks: npt.NDArray[np.uint64] | None = None
    # The members in bytewise order of their paths, when the caller holds it already (a
    # merge of parts whose orders it checked, `tierfeed.format.merge`); sorted when None.
    path_order: npt.NDArray[np.unsignedinteger[Any]] | None = None


def _tree_arrays(content: IndexContent) -> dict[str, npt.NDArray[Any] | bytes]:
    """The tree sections of ``content``, or none when it carries no tree."""
    tree = (
        content.member_mode,
        content.member_mtime,
        content.dir_paths,
        content.dir_mode,
        content.dir_mtime,
        content.root,
    )
    if all(part is None for part in tree):
        return {}
    if any(part is None for part in tree):
        raise IndexFormatError("internal error: an index's tree is given in part")
    dir_offset, dir_paths = _blob(content.dir_paths or [])
    return {
        "member_mode": content.member_mode,  # type: ignore[dict-item]
        "member_mtime": content.member_mtime,  # type: ignore[dict-item]
        "dir_path_offset": dir_offset,
        "dir_paths": dir_paths,
        "dir_mode": content.dir_mode,  # type: ignore[dict-item]
        "dir_mtime": content.dir_mtime,  # type: ignore[dict-item]
    }


def _blob(parts: Sequence[bytes]) -> tuple[npt.NDArray[np.uint64], bytes]:
    lengths = np.fromiter((len(p) for p in parts), dtype=np.uint64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, b"".join(parts)


def _order_dtype(members: int) -> str:
    return "<u4" if members < 2**32 else "<u8"


def _path_order(
    content: IndexContent, key_offset: npt.NDArray[np.uint64], keys: bytes
) -> npt.NDArray[np.generic]:
    """The members in bytewise order of their paths (`tierfeed.format.pathsort`)."""
    start, dtype = content.member_start, _order_dtype(len(content.member_ext))
    blob = np.frombuffer(keys, dtype=np.uint8)
    padded = padded_paths(blob, key_offset, start, content.member_ext, content.exts)
    if padded is not None:
        return sorted_order(padded).astype(dtype)
    owner = np.repeat(np.arange(len(content.keys)), np.diff(start).astype(np.int64)).tolist()
    exts = content.member_ext.tolist()
    paths = [content.keys[s] + content.exts[e] for s, e in zip(owner, exts, strict=True)]
    return np.asarray(sorted(range(len(paths)), key=paths.__getitem__), dtype=dtype)


def _section_arrays(content: IndexContent, narrow: bool = True) -> dict[str, Section]:
    """Every section of the index for ``content``, by name, before encoding; the row checks
    as arrays not yet filled (`write_checks` fills them)."""
    keys: bytes | tuple[Payload, ...]
    if isinstance(content.keys, KeyBlob):
        key_offset, keys = content.keys.offsets, content.keys.pieces
    else:
        key_offset, keys = _blob(content.keys)
    name_offset, names = _blob([os.fsencode(n) for n in content.chunk_names])
    arrays: dict[str, Section] = {
        "sample_member_start": content.member_start,
        "sample_key_offset": key_offset,
        "sample_label": content.labels,
        "sample_chunk": content.member_chunk[content.member_start[:-1].astype(np.int64)]
        if len(content.keys)
        else np.zeros(0, np.uint32),
        "member_chunk": content.member_chunk,
        "member_offset": content.member_offset,
        "member_length": content.member_length,
        "member_checksum": content.member_checksum,
        "member_ext": content.member_ext,
        "path_order": _path_order(content, key_offset, _whole(keys))
        if content.path_order is None
        else np.asarray(content.path_order, dtype=_order_dtype(len(content.member_ext))),
        "keys": keys,
        "chunk_name_offset": name_offset,
        "chunk_names": names,
        "chunk_size": content.chunk_size,
        "chunk_checksum": content.chunk_checksum,
        "sample_check": np.empty(len(content.keys), "<u8"),
        "chunk_check": np.empty(len(content.chunk_names), "<u8"),
    }
    arrays |= _tree_arrays(content)
    return _narrowed(arrays, content, narrow)


def _whole(keys: bytes | tuple[Payload, ...]) -> bytes:
    """The key blob whole: as it is, or its pieces joined (a copy)."""
    return keys if isinstance(keys, bytes) else b"".join(keys)


def _checks(content: IndexContent, arrays: dict[str, Section]) -> None:
    """Fill the row check sections of ``arrays`` (`write_checks`)."""
    columns = {k: v for k, v in arrays.items() if isinstance(v, np.ndarray)}
    keys, names = arrays["keys"], arrays["chunk_names"]
    assert isinstance(names, bytes) and not isinstance(keys, np.ndarray)  # blobs, as made
    whole = None if content.key_checks is not None else _whole(keys)
    out = (columns["sample_check"], columns["chunk_check"])
    write_checks(columns, whole, names, content.key_checks, out)


def _narrowed(
    arrays: dict[str, Section], content: IndexContent, narrow: bool
) -> dict[str, Section]:
    """The `NARROW` sections as <u4 where every value fits (member offsets and lengths only
    when every chunk is below 4 GiB, so that their sums fit as well), else <u8."""
    small_chunks = len(content.chunk_size) == 0 or int(np.max(content.chunk_size)) < 2**32
    for name in NARROW:
        value = arrays[name]
        if not isinstance(value, np.ndarray):
            continue
        fits = len(value) == 0 or int(np.max(value)) < 2**32
        fits = fits and narrow and (small_chunks or not name.startswith("member_"))
        arrays[name] = np.asarray(value, dtype="<u4" if fits else "<u8")
    return arrays


Encoded = list[tuple[str, tuple[Payload, ...]]]  # each section's bytes in pieces, file order


def _payloads(arrays: dict[str, Section]) -> Encoded:
    """The sections' bytes in file order, each in its on-disk dtype, as the arrays hold them
    (no copy: the row checks' are filled in place later)."""
    payloads: Encoded = []
    for name, (dtype, _) in present_sections(arrays).items():
        value = arrays[name]
        if isinstance(value, bytes):
            payloads.append((name, (value,)))
        elif isinstance(value, tuple):
            payloads.append((name, value))
        else:
            own = name == "path_order" or name in NARROW  # their dtype is the array's
            spec = value.dtype.newbyteorder("<").str if own else dtype
            data = np.ascontiguousarray(value, dtype=spec)
            payloads.append((name, (data.data.cast("B"),)))  # (no copy of the array)
    return payloads


def _length(pieces: tuple[Payload, ...]) -> int:
    return sum(map(len, pieces))


def _header(content: IndexContent, arrays: dict[str, Section]) -> dict[str, Any]:
    """The JSON header's fields, except the section offsets and its own checksum; the
    sections' checksum as wide as any (set once the sections are whole)."""
    header: dict[str, Any] = {
        "samples": len(content.keys),
        "members": len(content.member_offset),
        "chunks": len(content.chunk_names),
        "classes": content.classes,
        "exts": [os.fsdecode(e) for e in content.exts],
        "checksum_algo": CHECKSUM_ALGO,
        "sections_checksum": 2**64 - 1,
        "path_order_dtype": arrays["path_order"].dtype.str,  # type: ignore[union-attr]
        "dtypes": {
            name: "<u4"
            for name in NARROW
            if isinstance(arrays[name], np.ndarray) and arrays[name].dtype.itemsize == 4  # type: ignore[union-attr]
        },
        "extra": content.extra,
    }
    if content.dir_paths is not None and content.root is not None:
        header["dirs"] = len(content.dir_paths)
        header["root"] = list(content.root)
    if content.chunk_root is not None:
        header["chunk_root"] = content.chunk_root
    return header


def _lay_out(header: dict[str, Any], payloads: Encoded) -> int:
    """Place every section after the header; set ``header["sections"]``; return the
    header's slot length (where the first section starts)."""
    header_slack = 64  # room for the header checksum added once the offsets are known
    # Section offsets depend on the header length, which depends on the offsets: lay out with
    # a header padded to a fixed aligned size.
    sections: dict[str, list[int]] = {name: [0, _length(data)] for name, data in payloads}
    header["sections"] = sections
    header_len = aligned(len(json.dumps(header)) + 32 * len(sections) + header_slack + PREFIX.size)
    offset = header_len
    for name, data in payloads:
        sections[name] = [offset, _length(data)]
        offset = aligned(offset + _length(data))
    return header_len


def _write_sections(out: PendingFile, sections: dict[str, list[int]], payloads: Encoded) -> None:
    for name, data in payloads:
        out.write_at(sections[name][0], *data)


def write_index(
    path: str | os.PathLike[str], content: IndexContent, narrow: bool = True, mode: int = 0o666
) -> None:
    """Write ``content`` to ``path`` atomically (temporary name in the same directory, rename).

    ``narrow`` writes the `NARROW` offsets as 32-bit where they fit (12 bytes less per
    one-file sample); False keeps them 64-bit, as format version 1 had them. ``mode``: the
    file's permission bits (the umask applies); pack's keep a private source private.
    The sections are written while the row checks are computed; then the checks, the
    header last (at the file's start), each at its place: the gaps are holes that read as
    zeros, and nothing is padded after the last section, so a truncated index is seen.
    """
    if len(content.exts) > 2**16:
        raise IndexFormatError(
            f"{path}: {len(content.exts)} distinct file extensions; the index holds at most "
            f"{2**16} (are sample keys split as intended?)"
        )
    arrays = _section_arrays(content, narrow)
    payloads = _payloads(arrays)
    header = _header(content, arrays)
    header_len = _lay_out(header, payloads)
    sections: dict[str, list[int]] = header["sections"]
    checks = [(n, d) for n, d in payloads if n in ROW_CHECK_SECTIONS]
    with publishing(path, mode=mode) as out:
        with ThreadPoolExecutor(1) as writer:  # (writes let go of the GIL, and numpy too)
            rest = [(n, d) for n, d in payloads if n not in ROW_CHECK_SECTIONS]
            written = writer.submit(_write_sections, out, sections, rest)
            _checks(content, arrays)
            written.result()
        _write_sections(out, sections, checks)
        hasher = new_hasher()
        for _, data in payloads:
            for piece in data:
                hasher.update(piece)
        header["sections_checksum"] = hasher.intdigest()
        header["header_checksum"] = header_checksum(header)
        blob = json.dumps(header).encode()
        head = PREFIX.pack(MAGIC, version_of(header), len(blob)) + blob
        if len(head) > header_len:
            raise IndexFormatError(f"{path}: internal error, index header overflows its slot")
        out.write_at(0, head.ljust(header_len, b"\0"))
        os.ftruncate(out.fd, max(at + n for at, n in sections.values()))  # an empty last one
