"""Validation of an index's paths: its optional tree sections as it is opened (modes, mtimes
and the directory table, see `tierfeed.format.layout.TREE_SECTIONS`), and the path order.

The directory table is small next to the members (a directory holds many files), so its
paths are checked one by one (O(directory bytes)); the members' parents are checked
vectorised, in blocks, against the sorted table. Each check raises IndexFormatError naming
the file and what is wrong.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from tierfeed.format.headercheck import MAX_MODE, damaged
from tierfeed.format.pathsort import padded_paths, padded_rows, strictly_increasing

__all__ = ["check_path_order", "check_tree", "check_tree_members"]

_SLASH = ord("/")
_BLOCK_BYTES = 32 * 2**20  # padded path bytes built at a time for the members' parents


def check_tree(a: Mapping[str, npt.NDArray[Any]], where: Path) -> list[bytes]:
    """Check the directory table of the tree sections (lengths already match the header's
    counts; O(directories)); return the directory paths, sorted bytewise."""
    if np.any(a["dir_mode"] > MAX_MODE):
        raise damaged(where, f"a file or directory mode has bits above {MAX_MODE:#o}")
    offsets, blob = a["dir_path_offset"], a["dir_paths"]
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(blob):
        raise damaged(where, f"directory path offsets are not monotone from 0 to {len(blob)}")
    if np.any(offsets[1:] < offsets[:-1]):
        raise damaged(where, f"directory path offsets are not monotone from 0 to {len(blob)}")
    if np.any(blob == 0):
        raise damaged(where, "a directory path holds a NUL byte")
    global _checked_table
    table, last = (blob.tobytes(), offsets.tobytes()), _checked_table  # (one read: threads)
    if last is not None and last[0] == table:
        return list(last[1])  # the table the index opened before held, checked then
    dirs = _check_dir_paths(table[0], offsets.tolist(), where)
    _checked_table = (table, tuple(dirs))
    return dirs


# The last directory table `check_tree` passed, and its paths: every part `tierfeed merge`
# opens holds the whole source's table, so it is checked once, not once a part.
_checked_table: tuple[tuple[bytes, bytes], tuple[bytes, ...]] | None = None


def _check_dir_paths(raw: bytes, bounds: list[int], where: Path) -> list[bytes]:
    """The directory paths of a table (its offsets ``bounds`` into ``raw``), each checked."""
    dirs = [raw[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    known: set[bytes] = set()
    previous = b""
    for path in dirs:
        if any(part in (b"", b".", b"..") for part in path.split(b"/")):
            shown = path.decode(errors="replace")
            raise damaged(where, f"directory path {shown!r} has an empty, '.' or '..' component")
        if previous and path <= previous:
            shown = path.decode(errors="replace")
            raise damaged(where, f"directory paths are not strictly increasing at {shown!r}")
        parent = path.rpartition(b"/")[0]
        if parent and parent not in known:
            shown = path.decode(errors="replace")
            raise damaged(where, f"the parent of directory {shown!r} is not in the table")
        known.add(path)
        previous = path
    return dirs


def check_tree_members(a: Mapping[str, npt.NDArray[Any]], dirs: list[bytes], where: Path) -> None:
    """The members' side of the tree (O(members), after `check_tree` and the invariants of the
    sample keys): their modes, and each member's directory in the table."""
    if np.any(a["member_mode"] > MAX_MODE):
        raise damaged(where, f"a file or directory mode has bits above {MAX_MODE:#o}")
    _check_member_parents(a, dirs, where)


def _check_member_parents(
    a: Mapping[str, npt.NDArray[Any]], dirs: list[bytes], where: Path
) -> None:
    """Every member's directory (its key's, as an extension holds no slash) is in the table.

    Vectorised in blocks; within a block only the parents that differ from the sample before
    are looked up (a packed store lists a directory's samples together).
    """
    keys, key_offset = a["keys"], a["sample_key_offset"].astype(np.int64)
    slashes = np.flatnonzero(keys == _SLASH)
    last = np.searchsorted(slashes, key_offset[1:]) - 1  # the last slash before each key ends
    starts = key_offset[:-1]
    nested = last >= 0
    nested[nested] = slashes[last[nested]] >= starts[nested]
    samples = np.flatnonzero(nested)
    if len(samples) == 0:
        return
    lengths = slashes[last[samples]] - starts[samples]
    longest = max(map(len, dirs), default=0)
    if not dirs or int(lengths.max()) > longest:
        bad = int(samples[0] if not dirs else samples[np.argmax(lengths > longest)])
        raise _missing_parent(a, bad, where)
    width = max(longest, 1)
    table = np.array(dirs, dtype=f"S{width}")
    windows = sliding_window_view(np.concatenate([keys, np.zeros(width, np.uint8)]), width)
    step = max(1, _BLOCK_BYTES // width)
    for lo in range(0, len(samples), step):
        block = samples[lo : lo + step]
        parents = padded_rows(windows, starts[block], lengths[lo : lo + step])
        change = np.ones(len(parents), dtype=bool)
        change[1:] = parents[1:] != parents[:-1]
        distinct = parents[change]
        at = np.minimum(np.searchsorted(table, distinct), len(table) - 1)
        missing = np.flatnonzero(table[at] != distinct)
        if len(missing):
            raise _missing_parent(a, int(block[np.flatnonzero(change)[missing[0]]]), where)


def _missing_parent(a: Mapping[str, npt.NDArray[Any]], sample: int, where: Path) -> Exception:
    ko = a["sample_key_offset"]
    key = a["keys"][int(ko[sample]) : int(ko[sample + 1])].tobytes()
    shown = key.decode(errors="replace")
    return damaged(where, f"the directory of sample {shown!r} is not in the directory table")


def check_path_order(a: Mapping[str, npt.NDArray[Any]], exts: list[bytes], where: Path) -> None:
    """Raise IndexFormatError unless every member path is distinct and the path order sorts
    them bytewise (vectorised, `tierfeed.format.pathsort`; `tierfeed verify` runs it)."""
    order = a["path_order"].astype(np.int64)
    members = len(a["member_ext"])
    if len(order) != members or (members and (order.min() < 0 or order.max() >= members)):
        raise damaged(where, "the path order names members that are not there")
    padded = padded_paths(
        a["keys"], a["sample_key_offset"], a["sample_member_start"], a["member_ext"], exts
    )
    if padded is None:
        _check_path_order_bytes(a, exts, where)
        return
    at = strictly_increasing(padded[order])
    if at >= 0:
        shown = os.fsdecode(padded[order[at]])
        raise damaged(where, f"path order broken or duplicate path at {shown!r}")


def _check_path_order_bytes(
    a: Mapping[str, npt.NDArray[Any]], exts: list[bytes], where: Path
) -> None:
    """`check_path_order` one path at a time (paths with a NUL, or too many to lay out)."""
    blob = a["keys"].tobytes()
    offsets = a["sample_key_offset"].tolist()
    keys = [blob[lo:hi] for lo, hi in itertools.pairwise(offsets)]
    counts = np.diff(a["sample_member_start"]).astype(np.int64)
    owner = np.repeat(np.arange(len(keys)), counts)
    order = a["path_order"].astype(np.int64)
    previous = None
    for o, e in zip(owner[order].tolist(), a["member_ext"][order].tolist(), strict=True):
        path = keys[o] + exts[e]
        if previous is not None and path <= previous:
            raise damaged(where, f"path order broken or duplicate path at {os.fsdecode(path)!r}")
        previous = path
