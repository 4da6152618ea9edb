"""What the rest of tierfeed knows of a chunk: name, size, checksum, and how to read it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import xxhash

__all__ = [
    "CHECKSUM_ALGO",
    "ChunkInfo",
    "ChunkSource",
    "checksum_bytes",
    "checksum_file",
    "new_hasher",
]

CHECKSUM_ALGO = "xxh3_64"


def new_hasher() -> xxhash.xxh3_64:
    """A fresh streaming hasher of the chunk checksum algorithm."""
    return xxhash.xxh3_64()


def checksum_bytes(data: bytes | memoryview) -> int:
    """Checksum of a whole chunk held in memory (same value as the streaming hasher)."""
    return int(xxhash.xxh3_64_intdigest(data))


def checksum_file(
    path: str | os.PathLike[str], on_block: Callable[[int], object] | None = None
) -> tuple[int, int]:
    """(size, checksum) of a file, read in 8 MiB blocks; ``on_block(n)`` after each block
    (a progress bar's ``update``). Raises OSError."""
    hasher = new_hasher()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(8 * 2**20):
            hasher.update(block)
            size += len(block)
            if on_block is not None:
                on_block(len(block))
    return size, hasher.intdigest()


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


class ChunkSource(Protocol):
    """Anything that serves byte ranges of a store's chunks: a plain directory or a tier stack.

    Implementations subclass it explicitly to inherit the defaults of optional abilities.
    """

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Return exactly ``length`` bytes of chunk ``chunk`` starting at ``offset``.

        Raises:
            ChunkCorruptError: the chunk is shorter than the range (names the chunk).
            StorageError: the chunk cannot be read.
        """
        ...

    def discard(self, chunk: int) -> str | None:
        """The bytes just served of ``chunk`` failed their check: drop the cached copy that
        served them, so that the next read of the chunk goes one level further down.

        Returns:
            What was dropped (e.g. a tier's file), or None when no cache held the chunk: the
            bytes came from the origin itself. The default holds no cache.
        """
        return None

    def close(self) -> None:
        """Release files, threads and sockets; idempotent."""
        ...
