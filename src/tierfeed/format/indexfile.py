"""An index file's bytes: mapped (or read), its header parsed and checked, its sections
mapped as arrays, and their checksum (the section map `Index` is built on)."""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from tierfeed.errors import IndexFormatError
from tierfeed.format.chunkref import new_hasher
from tierfeed.format.headercheck import check_header, damaged
from tierfeed.format.indexwrite import PREFIX
from tierfeed.format.layout import MAGIC, READS, VERSION, expected_length, present_sections

__all__ = ["map_arrays", "open_index_file", "read_header", "sections_checksum"]


def _map_or_read(fd: int, size: int, path: Path) -> mmap.mmap | bytes:
    """Map the index; where the file system cannot map files (direct-I/O FUSE, some network
    file systems), read it into memory instead."""
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError:
        data = bytearray()
        while len(data) < size:
            block = os.pread(fd, min(size - len(data), 64 * 2**20), len(data))
            if not block:
                raise IndexFormatError(f"{path}: index shrank while being read") from None
            data += block
        return bytes(data)


def open_index_file(path: Path, fd: int | None = None) -> tuple[os.stat_result, mmap.mmap | bytes]:
    """The fstat of index file ``path`` and its bytes, mapped (or read); from ``fd`` when
    given (the file already open, its caller keeps it: a file opened in a checked cache
    directory), else opened by path."""
    if fd is not None:
        return _fstat_and_map(fd, path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise IndexFormatError(
            f"{path}: no index here; pack a dataset with `tierfeed pack SRC DST` "
            "(an interrupted pack leaves no index: re-run it to resume)"
        ) from None
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot open index: {exc.strerror}") from None
    try:
        return _fstat_and_map(fd, path)
    finally:
        os.close(fd)


def _fstat_and_map(fd: int, path: Path) -> tuple[os.stat_result, mmap.mmap | bytes]:
    st = os.fstat(fd)
    if st.st_size < PREFIX.size:
        raise IndexFormatError(f"{path}: not a tierfeed index (file too short)")
    return st, _map_or_read(fd, st.st_size, path)


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
    return check_header(header, path, size), version, end


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
