"""An index file's bytes: mapped (or read), its header parsed and checked, its sections
mapped as arrays, and their checksum (the section map `Index` is built on)."""

from __future__ import annotations

import errno
import json
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tierfeed.errors import IndexFormatError
from tierfeed.format.chunkref import new_hasher
from tierfeed.format.headercheck import check_header, damaged
from tierfeed.format.indexwrite import PREFIX
from tierfeed.format.layout import (
    CHUNK_ROOT_SINCE,
    INDEX_NAME,
    MAGIC,
    READS,
    VERSION,
    expected_length,
    present_sections,
)
from tierfeed.hedging import first_to_end
from tierfeed.pread import pread

__all__ = [
    "map_arrays",
    "open_index_file",
    "open_index_path",
    "read_header",
    "sections_checksum",
]


# An index read that has not ended in `_AGAIN_S` is made again beside it (`first_to_end`), past
# the page cache: a mount holds the first request of a page while a second request of it is
# answered. Indexes up to `_TOUCH_MAX` are read in full as they open, their mapping too, so
# that no page of theirs is read later, unhedged; a larger one is mapped and read as used.
_AGAIN_S = 0.5
_TRIES = 3
_BOUND_S = 120.0
_TOUCH_MAX = 64 << 20
_BLOCK = 64 << 20


def _read_all(fd: int, size: int, path: Path, flags: int = os.O_RDONLY) -> bytes:
    data = bytearray()
    while len(data) < size:
        block = pread(fd, str(path), min(size - len(data), _BLOCK), len(data), flags)
        if not block:
            raise IndexFormatError(f"{path}: index shrank while being read") from None
        data += block
    return bytes(data)


def _map_or_read(fd: int, size: int, path: Path) -> mmap.mmap | bytes:
    """Map the index; where the file system cannot map files (direct-I/O FUSE, some network
    file systems), read it into memory instead."""
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError:
        return _read_all(fd, size, path)


def _opened(path: Path, attempt: int) -> tuple[Path, os.stat_result, mmap.mmap | bytes]:
    """The index at ``path`` (a store's directory or the file) opened: a first try maps it,
    a later one reads it past the page cache (O_DIRECT where the file system allows)."""
    if path.is_dir():
        path = path / INDEX_NAME
    direct = os.O_DIRECT if attempt else 0
    try:
        try:
            fd = os.open(path, os.O_RDONLY | direct)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            direct, fd = 0, os.open(path, os.O_RDONLY)  # the file system refuses O_DIRECT
    except FileNotFoundError:
        if path.name != INDEX_NAME or not path.parent.is_dir():  # nothing at all there
            where = path if path.name != INDEX_NAME else path.parent
            raise IndexFormatError(
                f"{where}: no such file or directory; give a store (the directory "
                "`tierfeed pack SRC DST` made)"
            ) from None
        raise IndexFormatError(
            f"{path}: no index here; pack a dataset with `tierfeed pack SRC DST` "
            "(an interrupted pack leaves no index: re-run it to resume)"
        ) from None
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot open index: {exc.strerror}") from None
    try:
        st = _checked_stat(fd, path)
        if attempt:
            return path, st, _read_all(fd, st.st_size, path, os.O_RDONLY | direct)
        mm = _map_or_read(fd, st.st_size, path)
        if not isinstance(mm, bytes) and st.st_size <= _TOUCH_MAX:  # mapped, small
            xxhash.xxh3_64(mm)  # every page read here, under the hedge, not later
        return path, st, mm
    finally:
        os.close(fd)


def _unmap(opened: tuple[Path, os.stat_result, mmap.mmap | bytes]) -> None:
    if isinstance(opened[2], mmap.mmap):
        opened[2].close()


def open_index_path(path: Path) -> tuple[Path, os.stat_result, mmap.mmap | bytes]:
    """The index file at ``path`` (a store's directory, or the file), its fstat and its bytes,
    mapped (or read). The open and the read are made again where they hang (`_AGAIN_S`,
    `first_to_end`): a stall of the mount holds no process's start-up past its bound.

    Raises:
        IndexFormatError: no index there, or it cannot be opened.
        StuckReadError: no try was answered in `_BOUND_S`.
    """
    return first_to_end(
        lambda attempt: _opened(path, attempt),
        again_after_s=_AGAIN_S,
        tries=_TRIES,
        bound_s=_BOUND_S,
        what=f"{path}: the index read",
        discard=_unmap,
    )


def open_index_file(path: Path, fd: int) -> tuple[os.stat_result, mmap.mmap | bytes]:
    """The fstat of index file ``path``, already open as ``fd`` (its caller keeps it: a file
    opened in a checked cache directory, on local disk), and its bytes, mapped (or read)."""
    st = _checked_stat(fd, path)
    return st, _map_or_read(fd, st.st_size, path)


def _checked_stat(fd: int, path: Path) -> os.stat_result:
    st = os.fstat(fd)
    if st.st_size < PREFIX.size:
        raise IndexFormatError(f"{path}: not a tierfeed index (file too short)")
    return st


def read_header(mm: mmap.mmap | bytes, size: int, path: Path) -> tuple[dict[str, Any], int, int]:
    """The checked header of the index mapped as ``mm`` (``size`` bytes), its format version
    and the offset where the header ends."""
    magic, version, hlen = PREFIX.unpack_from(mm, 0)
    if magic != MAGIC:
        raise IndexFormatError(f"{path}: not a tierfeed index (bad magic {magic!r})")
    if version not in READS:
        raise IndexFormatError(
            f"{path}: index format version {version}, this tierfeed reads version "
            f"{VERSION}; re-index the store with this version (`tierfeed pack` or "
            "`tierfeed index`) or use a matching tierfeed"
        )
    end = PREFIX.size + hlen
    if end > size:
        raise IndexFormatError(
            f"{path}: index is truncated (header ends at byte {end}, "
            f"file has {size}); re-create it (`tierfeed pack` or `tierfeed index`)"
        )
    try:
        header = json.loads(mm[PREFIX.size : end])
    except (ValueError, RecursionError):
        raise IndexFormatError(f"{path}: index header is corrupt") from None
    header = check_header(header, path, size)
    if "chunk_root" in header and version < CHUNK_ROOT_SINCE:
        raise damaged(path, f"a format {version} index names a chunk root (format 4 does)")
    return header, version, end


def map_arrays(
    mm: mmap.mmap | bytes,
    header: dict[str, Any],
    table: dict[str, tuple[int, int, Any]],
    path: Path,
    rows: tuple[int, int, int, int],
) -> dict[str, Any]:
    """Each present section of ``header`` as an array viewing ``mm``, where ``table``
    (`headercheck.check_sections`) puts it; ``rows``: the samples, members, chunks and
    directories, that fix each section's length."""
    arrays: dict[str, Any] = {}
    for name, (_, kind) in present_sections(header["sections"]).items():
        offset, count, dtype = table[name]
        want = expected_length(kind, *rows)
        if want is not None and count != want:
            raise damaged(path, f"section {name} has {count} entries, expected {want}")
        arrays[name] = np.frombuffer(mm, dtype=dtype, count=count, offset=offset)
    return arrays


def sections_checksum(mm: mmap.mmap | bytes, header: dict[str, Any]) -> int:
    """Checksum of every section as stored now (compare with the header's, to verify)."""
    hasher = new_hasher()
    for name in present_sections(header["sections"]):
        offset, nbytes = header["sections"][name]
        hasher.update(mm[offset : offset + nbytes])
    return hasher.intdigest()
