"""Validation of an index's header and section table as it is opened: every field present,
of its type and in range, and the sections known, whole, inside the file and apart.

Each check raises IndexFormatError naming the file and what is wrong (`damaged`).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tierfeed.errors import IndexFormatError
from tierfeed.format.chunkref import CHECKSUM_ALGO, checksum_bytes
from tierfeed.format.chunkroot import url_root_problem
from tierfeed.format.layout import NARROW, TREE_SECTIONS, as_dtype, present_sections

__all__ = [
    "MAX_EXTS",
    "MAX_MODE",
    "PATH_ORDER_DTYPES",
    "check_header",
    "check_sections",
    "damaged",
    "header_checksum",
]

MAX_EXTS = 2**16  # member_ext is uint16
PATH_ORDER_DTYPES = ("<u4", "<u8")
_REQUIRED: dict[str, type] = {
    "samples": int,
    "members": int,
    "chunks": int,
    "classes": list,
    "exts": list,
    "checksum_algo": str,
    "sections_checksum": int,
    "path_order_dtype": str,
    "sections": dict,
}
_OPTIONAL: dict[str, type] = {
    "extra": dict,
    "header_checksum": int,
    "dirs": int,
    "root": list,
    "dtypes": dict,
    "chunk_root": str,  # format 4: the directory of shards kept outside the store
}
MAX_MODE = 0o7777  # permission bits only: the type bits come from what an entry is


def damaged(where: Path, what: str) -> IndexFormatError:
    """The error for a damaged index: names the file, what is wrong, and what to do."""
    return IndexFormatError(
        f"{where}: damaged index: {what}; re-create it (`tierfeed pack` or `tierfeed index`)"
    )


def header_checksum(header: Mapping[str, Any]) -> int:
    """Checksum of the header's JSON without its ``header_checksum`` field (canonical form)."""
    rest = {k: v for k, v in header.items() if k != "header_checksum"}
    return checksum_bytes(json.dumps(rest, sort_keys=True).encode())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_header(header: object, where: Path, size: int) -> dict[str, Any]:
    """Every header field present, of the right type and within what ``size`` bytes allow."""
    if not isinstance(header, dict):
        raise damaged(where, "the header is not a JSON object")
    for name, kind in (_REQUIRED | _OPTIONAL).items():
        if name not in header:
            if name in _REQUIRED:
                raise damaged(where, f"header field {name!r} is missing")
            continue
        value = header[name]
        if not (_is_int(value) if kind is int else isinstance(value, kind)):
            raise damaged(where, f"header field {name!r} is not a JSON {kind.__name__}")
        if kind is int and not 0 <= value < 2**64:
            raise damaged(where, f"header field {name!r} = {value} is out of range")
    unknown = sorted(set(header) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise damaged(where, f"unknown header field {unknown[0]!r}")
    if "header_checksum" in header and header["header_checksum"] != header_checksum(header):
        raise damaged(where, "header checksum mismatch (the header was altered or damaged)")
    for name in ("samples", "members", "chunks", "dirs"):
        if header.get(name, 0) > size:
            raise damaged(where, f"{header[name]} {name} cannot fit in a {size}-byte file")
    if header["checksum_algo"] != CHECKSUM_ALGO:
        raise damaged(where, f"unknown checksum algorithm {header['checksum_algo']!r}")
    if header["path_order_dtype"] not in PATH_ORDER_DTYPES:
        raise damaged(
            where,
            f"path order dtype {header['path_order_dtype']!r} is not one of "
            f"{', '.join(PATH_ORDER_DTYPES)}",
        )
    dtypes = header.get("dtypes", {})
    for name, dtype in dtypes.items():
        if name not in NARROW or dtype not in PATH_ORDER_DTYPES:
            raise damaged(where, f"header dtype {name!r}: {dtype!r} is not a narrowable section")
    _check_names(header, where, size)
    _check_root(header, where)
    _check_chunk_root(header, where)
    return header


MAX_CHUNK_ROOT_BYTES = 4096  # PATH_MAX


def _check_chunk_root(header: dict[str, Any], where: Path) -> None:
    """A chunk root (`tierfeed.format.chunkroot`) is a directory path (not empty, no NUL, at
    most PATH_MAX bytes) or a URL directory (``s3://bucket/path``: `url_root_problem`). A URL
    root is honoured only in a store's own local index: the index of a store at a URL names
    no root at all (`tierfeed.loader.location.fetch_index` refuses it)."""
    root = header.get("chunk_root")
    if root is None:
        return
    try:
        size = len(os.fsencode(root))
    except UnicodeEncodeError:  # a lone surrogate no file name decodes to
        size = -1
    if not root or "\0" in root or not 0 < size <= MAX_CHUNK_ROOT_BYTES:
        raise damaged(where, f"the header's chunk root {root[:80]!r} is not a directory path")
    problem = url_root_problem(root) if "://" in root else None
    if problem is not None:
        raise damaged(where, f"the header's chunk root {root[:80]!r} {problem}")


def _check_root(header: dict[str, Any], where: Path) -> None:
    """The tree's root, ``[mode, mtime ns]``, comes with the tree (``dirs``) and only with it."""
    if ("root" in header) != ("dirs" in header):
        raise damaged(where, "the header's root and dirs fields come together")
    root = header.get("root", [0, 0])
    if not (len(root) == 2 and all(map(_is_int, root))):
        raise damaged(where, "the header's root is not a [mode, mtime] pair of integers")
    if not (0 <= root[0] <= MAX_MODE and -(2**63) <= root[1] < 2**63):
        raise damaged(where, f"the header's root {root} is out of range")


def _check_names(header: dict[str, Any], where: Path, size: int) -> None:
    classes, exts = header["classes"], header["exts"]
    if len(classes) > size or not all(isinstance(c, str) for c in classes):
        raise damaged(where, "the class list is not a list of names")
    if len(exts) > MAX_EXTS or not all(isinstance(e, str) for e in exts):
        raise damaged(where, f"the extension list is not a list of at most {MAX_EXTS} strings")
    raw = [os.fsencode(e) for e in exts]
    for e in raw:
        if (e and not e.startswith(b".")) or b"/" in e or b"\0" in e:
            raise damaged(where, f"extension {os.fsdecode(e)!r} is not a file extension")
    if len(set(raw)) != len(raw):
        raise damaged(where, "the extension list repeats an extension")


def check_sections(
    header: dict[str, Any], where: Path, size: int, header_end: int
) -> dict[str, tuple[int, int, np.dtype[np.generic]]]:
    """The section table: exactly the known sections (the tree sections all together, with
    the header's ``dirs``, or none of them), each ``[offset, nbytes]`` of whole items, inside
    the file, after the header, not overlapping. Returns name -> (offset, count, dtype)."""
    table = header["sections"]
    known = present_sections(table)
    if set(table) != set(known):
        missing = sorted(set(known) - set(table))
        what = f"lacks section {missing[0]!r}" if missing else "has an unknown section"
        raise damaged(where, f"the section table {what}")
    if ("dirs" in header) != (TREE_SECTIONS.keys() <= table.keys()):
        raise damaged(where, "the header's dirs count and the tree sections come together")
    out: dict[str, tuple[int, int, np.dtype[np.generic]]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, (spec, _) in known.items():
        entry = table[name]
        if not (isinstance(entry, list) and len(entry) == 2 and all(map(_is_int, entry))):
            raise damaged(where, f"section {name} is not an [offset, nbytes] pair of integers")
        offset, nbytes = entry
        if offset < header_end or nbytes < 0:
            raise damaged(where, f"section {name} at byte {offset} overlaps the header")
        if offset + nbytes > size:
            raise IndexFormatError(
                f"{where}: index is truncated (section {name} ends at byte {offset + nbytes}, "
                f"file has {size}); re-create it (`tierfeed pack` or `tierfeed index`)"
            )
        if name == "path_order":
            spec = header["path_order_dtype"]
        dtype = as_dtype(header.get("dtypes", {}).get(name, spec))
        if nbytes % dtype.itemsize or offset % dtype.itemsize:
            raise damaged(where, f"section {name} is not a whole array of {dtype.str} items")
        out[name] = (offset, nbytes // dtype.itemsize, dtype)
        spans.append((offset, offset + nbytes, name))
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise damaged(where, f"sections {a} and {b} overlap")
    return out
