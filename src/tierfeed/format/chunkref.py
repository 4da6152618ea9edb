"""What the rest of tierfeed knows of a chunk: name, size, checksum, and how to read it."""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt
import xxhash

__all__ = [
    "CHECKSUM_ALGO",
    "ChunkInfo",
    "ChunkSource",
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


class ChunkSource(ABC):
    """Anything that serves byte ranges of a store's chunks: a plain directory or a tier stack.

    A source implements `read_range` and `close`. Every other ability is optional and has a
    harmless default here, so callers call it on any source and never test a concrete type:
    a source that lacks the ability does nothing (or reports nothing).
    """

    # True when `set_future` uses the sequence it is given: building one costs a pass over
    # this epoch's and the next epochs' plans, which callers skip for a source that ignores it.
    uses_future: bool = False

    @abstractmethod
    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Return exactly ``length`` bytes of chunk ``chunk`` starting at ``offset``.

        Raises:
            ChunkCorruptError: the chunk is shorter than the range (names the chunk).
            StorageError: the chunk cannot be read.
        """

    @abstractmethod
    def close(self) -> None:
        """Release files, threads and sockets; idempotent."""

    def discard(self, chunk: int) -> str | None:
        """The bytes just served of ``chunk`` failed their check: drop the cached copy that
        served them, so that the next read of the chunk goes one level further down.

        Returns:
            What was dropped (e.g. a tier's file), or None when no cache held the chunk: the
            bytes came from the origin itself. The default holds no cache.
        """
        return None

    def open_ahead(self, chunks: Sequence[int]) -> None:
        """Hint: these chunks are read next, in this order; open them in the background so a
        stalled lookup or open is paid off the read path. The default opens nothing."""
        return None

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """Hint: the chunk of every read to come, in order (from the plan), for placement
        that knows the future; ``read_bytes`` is the mean bytes of one read. The default
        ignores it (and says so with `uses_future` False)."""
        return None

    def prefetch(self) -> int:
        """Queue copies of the chunks the known future needs next; returns how many were
        queued. The default caches nothing and queues none."""
        return 0

    def schedule(self, chunk: int) -> bool:
        """Hint: ``chunk`` is read soon; queue a background copy of it into a cache. Returns
        True if a copy was queued. The default has no cache and queues nothing."""
        return False

    def begin_epoch(self) -> None:
        """A new epoch starts: pick up what changed since the last one (e.g. samples peers
        moved here). The default has nothing to pick up."""
        return None

    def stats(self) -> dict[str, Any]:
        """Counters per tier (and the origin), as plain values. An empty dict means nothing to
        report: callers treat ``{}`` as "no tiers". The default reports nothing."""
        return {}

    def drain(self, timeout: float = 60.0) -> None:
        """Wait up to ``timeout`` seconds for background copies to finish (raises
        StorageError if they do not). The default runs none, so it returns at once."""
        return None
