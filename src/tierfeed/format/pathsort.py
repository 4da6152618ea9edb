"""Member paths (a sample's key, then a member's extension) in bytewise order, vectorised.

An index's path order lists its members sorted by path. Sorting or checking millions of
paths one Python bytes object at a time takes seconds a million; here the paths are laid
out once as one fixed-width bytes array (``S<width>``, zero padded) and sorted or compared
by numpy. No path holds a NUL (keys are file or member names, extensions their suffixes), so
the zero padding sorts a shorter path before its extensions exactly as bytewise order does.
When a path does hold a NUL, or the array would pass `PADDED_LIMIT` bytes (one very long key
widens every row), `padded_paths` gives None and the callers fall back to Python bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["PADDED_LIMIT", "padded_paths", "padded_rows", "sorted_order", "strictly_increasing"]

PADDED_LIMIT = 1 << 30  # bytes of the fixed-width array of every member's path


def padded_paths(
    keys: npt.NDArray[np.uint8],
    key_offset: npt.NDArray[Any],
    member_start: npt.NDArray[Any],
    member_ext: npt.NDArray[Any],
    exts: Sequence[bytes],
    limit: int = PADDED_LIMIT,
) -> npt.NDArray[np.bytes_] | None:
    """Every member's path as one fixed-width bytes array, in member order: the key bytes
    ``keys[key_offset[s]:key_offset[s + 1]]`` of its sample ``s`` (the samples' members are
    ``member_start[s]:member_start[s + 1]``), then ``exts[member_ext[m]]``. None when a path
    would hold a NUL or the array would pass ``limit`` bytes."""
    first: npt.NDArray[np.int64] = np.asarray(member_start, dtype=np.int64)
    counts = first[1:] - first[:-1]
    members = int(counts.sum())
    if members == 0:
        return np.zeros(0, dtype="S1")
    owner = np.repeat(np.arange(len(counts)), counts)
    bounds = np.asarray(key_offset, dtype=np.int64)
    starts, key_len = bounds[:-1][owner], np.diff(bounds)[owner]
    ext_len = np.fromiter(map(len, exts), dtype=np.int64, count=len(exts))
    ext_id = np.asarray(member_ext, dtype=np.intp)
    width = max(1, int((key_len + ext_len[ext_id]).max()))
    if members * width > limit or np.any(keys == 0) or any(b"\0" in e for e in exts):
        return None
    windows = sliding_window_view(np.concatenate([keys, np.zeros(width, np.uint8)]), width)
    paths = padded_rows(windows, starts, key_len)
    flat, rows = paths.view(np.uint8), np.arange(members, dtype=np.int64) * width + key_len
    for i, ext in enumerate(exts):  # each extension after its members' keys
        at = rows if len(exts) == 1 else rows[ext_id == i]
        for j, byte in enumerate(ext):
            flat[at + j] = byte
    return paths


def padded_rows(
    windows: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.bytes_]:
    """The byte strings ``blob[start:start + length]`` as one fixed-width bytes array (a
    copy), from the blob's sliding ``windows`` (as wide as the longest): zero padded, which
    compares as bytewise order does where no string holds a NUL."""
    width = windows.shape[1]
    matrix = windows[starts]  # one gather of whole rows: a copy
    matrix *= np.arange(width) < lengths[:, None]  # zero past each string
    return matrix.view(f"S{width}").ravel()


def sorted_order(paths: npt.NDArray[np.bytes_]) -> npt.NDArray[np.intp]:
    """The indices of ``paths`` in bytewise order (stable: a run already in order, as a
    store's members mostly are, costs one pass)."""
    return np.argsort(paths, kind="stable")


def strictly_increasing(paths: npt.NDArray[np.bytes_]) -> int:
    """-1 when every path is above the one before it, else the first position where it is
    not (a path equal to or below the one before)."""
    if len(paths) < 2:
        return -1
    bad = np.flatnonzero(paths[1:] <= paths[:-1])
    return int(bad[0]) + 1 if len(bad) else -1
