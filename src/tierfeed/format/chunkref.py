"""What the rest of tierfeed knows of a chunk: its name, size and checksum (how to read one is
`tierfeed.storage.source.ChunkSource`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

__all__ = [
    "CHECKSUM_ALGO",
    "ChunkInfo",
    "checksum_bytes",
    "checksum_file",
    "checksum_range",
    "new_hasher",
]

CHECKSUM_ALGO = "xxh3_64"


def new_hasher() -> xxhash.xxh3_64:
    """A fresh streaming hasher of the chunk checksum algorithm."""
    return xxhash.xxh3_64()


def checksum_bytes(data: bytes | memoryview) -> int:
    """Checksum of a whole chunk held in memory (same value as the streaming hasher)."""
    return int(xxhash.xxh3_64_intdigest(data))


_BLOCK = 8 * 2**20  # bytes hashed at a time: memory stays bounded whatever the size


def checksum_range(
    fd: int, offset: int, size: int, on_block: Callable[[int], object] | None = None
) -> tuple[int, int]:
    """(bytes read, checksum) of ``size`` bytes of ``fd`` at ``offset``, read in 8 MiB blocks;
    fewer bytes where the file ends first. ``on_block(n)`` after each block (a progress bar's
    ``update``). Raises OSError."""
    hasher = new_hasher()
    done = 0
    while done < size:
        block = os.pread(fd, min(_BLOCK, size - done), offset + done)
        if not block:
            break
        hasher.update(block)
        done += len(block)
        if on_block is not None:
            on_block(len(block))
    return done, hasher.intdigest()


def checksum_file(
    path: str | os.PathLike[str], on_block: Callable[[int], object] | None = None
) -> tuple[int, int]:
    """(size, checksum) of a whole file, read to its end in 8 MiB blocks. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return checksum_range(fd, 0, sys.maxsize, on_block)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk of a store.

    Attributes:
        id: chunk id, its position in the index's chunk table.
        name: path relative to the store root, ``/``-separated (e.g. ``chunks/000000.tar``).
        size: size of the chunk file in bytes.
        checksum: xxh3_64 of the whole chunk file.
    """

    id: int
    name: str
    size: int
    checksum: int
