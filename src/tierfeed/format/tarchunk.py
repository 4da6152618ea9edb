"""Chunks are plain POSIX tar: build member headers, write a chunk atomically, scan a shard.

Headers come from the standard library's tarfile (ustar, with pax records only where a name
needs them); data is written here so that every member's data offset is known exactly and the
chunk checksum is computed while writing, without a second pass.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tierfeed.errors import ChunkCorruptError, FormatError
from tierfeed.format.chunkref import new_hasher

__all__ = [
    "BLOCK",
    "ChunkWriter",
    "TarMember",
    "header_length",
    "member_header",
    "padding",
    "scan_tar",
    "sync_files",
]

BLOCK = 512
_END = b"\0" * (2 * BLOCK)  # end-of-archive marker: two zero blocks


def padding(size: int) -> int:
    """Bytes of zero padding after a member of ``size`` bytes."""
    return -size % BLOCK


def header_length(path: bytes, size: int, mtime: int) -> int:
    """Length of `member_header`'s result, without building it in the common ustar case."""
    if len(path) <= 100 and path.isascii() and 0 <= size < 8**11 and 0 <= mtime < 8**11:
        return BLOCK  # a plain ustar header: no pax record needed
    return len(member_header(path, size, mtime))


def sync_files(paths: list[Path]) -> None:
    """fsync ``paths`` and their directories, so what is published later is on disk first."""
    for path in [*paths, *{p.parent for p in paths}]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def member_header(path: bytes, size: int, mtime: int = 0, mode: int = 0o644) -> bytes:
    """The tar header block(s) of a regular file member (pax records when the name needs them)."""
    info = tarfile.TarInfo(os.fsdecode(path))
    info.size = size
    info.mtime = mtime
    info.mode = mode & 0o7777
    info.type = tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class ChunkWriter:
    """Writes one chunk under a temporary name, hashing as it goes; `commit` publishes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tmp = path.with_name(path.name + ".partial")
        self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._hasher = new_hasher()
        self.size = 0

    def add(self, header: bytes, data: bytes | memoryview) -> int:
        """Append one member; returns the offset of its data in the chunk."""
        offset = self.size + len(header)
        pad = b"\0" * padding(len(data))
        for part in (header, data, pad):
            self._hasher.update(part)
        os.writev(self._fd, [header, data, pad])
        self.size = offset + len(data) + len(pad)
        return offset

    def commit(self) -> tuple[int, int]:
        """Finish the archive and rename it to the final name; returns (size, checksum).

        No fsync here: the pack syncs every chunk once before it publishes the index (see
        `sync_files`), which lets the kernel write back while the next chunk is filled.
        """
        self._hasher.update(_END)
        os.write(self._fd, _END)
        self.size += len(_END)
        os.close(self._fd)
        self._fd = -1
        os.replace(self._tmp, self.path)
        return self.size, self._hasher.intdigest()

    def abort(self) -> None:
        """Drop the partial chunk."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


@dataclass(frozen=True)
class TarMember:
    """A member of an existing tar, as read from its headers."""

    name: str
    offset: int  # of its data
    size: int
    is_file: bool
    is_dir: bool


def scan_tar(path: Path) -> Iterator[TarMember]:
    """Yield the members of an uncompressed tar without reading their data.

    Raises:
        FormatError: the file is not an uncompressed tar or its headers are damaged.
    """
    try:
        with tarfile.open(path, mode="r:", encoding="utf-8", errors="surrogateescape") as tar:
            for info in tar:
                yield TarMember(info.name, info.offset_data, info.size, info.isreg(), info.isdir())
    except tarfile.ReadError as exc:
        raise ChunkCorruptError(
            f"{path}: not a readable uncompressed tar ({exc}); tierfeed indexes plain .tar "
            "shards only (decompress .tar.gz first)"
        ) from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
