"""The one verified copy of a chunk from an origin: read in blocks, hashed, checked whole.

The tier stack fills its tiers with it and stage-in fills node-local directories with it, so
a chunk reaches any local copy only after its size and checksum matched the index.
"""

from __future__ import annotations

from collections.abc import Callable

from tierfeed.errors import ChunkCorruptError
from tierfeed.format.chunkref import ChunkInfo, new_hasher
from tierfeed.storage.driver import Driver

__all__ = ["FETCH_BLOCK", "damaged_chunk", "fetch_verified", "short_chunk"]

FETCH_BLOCK = 8 * 2**20  # bytes per origin read while copying a chunk


def fetch_verified(
    origin: Driver,
    info: ChunkInfo,
    sink: Callable[[bytes], object] | None = None,
    block: int | None = None,
) -> bytes:
    """Chunk ``info`` read from ``origin`` and checked against the index.

    Args:
        origin: where the chunk is (read-only).
        info: the chunk's name, size and checksum.
        sink: given, each block goes to it as it arrives (e.g. a file being published) and
            the return value is empty; otherwise the whole chunk is returned.
        block: bytes per origin read (default: the whole chunk in one read when returned,
            `FETCH_BLOCK` into a sink, so memory stays bounded).

    Raises:
        ChunkCorruptError: the origin's copy has another size or checksum than the index
            says (nothing the caller wrote may be kept: publish only after this returns).
        StorageError: the origin could not be read.
    """
    if block is None:
        block = FETCH_BLOCK if sink is not None else max(1, info.size)
    hasher = new_hasher()
    parts: list[bytes] = []
    done = 0
    while done < info.size:
        data = origin.read_range(info.name, done, min(block, info.size - done))
        if not data:
            break
        hasher.update(data)
        done += len(data)
        if sink is None:
            parts.append(data)
        else:
            sink(data)
    if done != info.size or hasher.intdigest() != info.checksum:
        raise damaged_chunk(info, origin.name, done)
    if sink is not None:
        return b""
    return parts[0] if len(parts) == 1 else b"".join(parts)


def damaged_chunk(info: ChunkInfo, where: str, got: int) -> ChunkCorruptError:
    """The error for chunk ``info`` at ``where`` whose ``got`` bytes are not what the index
    says (another size, or another checksum)."""
    return ChunkCorruptError(
        f"chunk {info.name} at {where} does not match the index (read {got} bytes, "
        f"index says {info.size}, or the checksum differs); the origin copy is damaged: "
        "run `tierfeed verify` on the store and re-pack or restore it"
    )


def short_chunk(info: ChunkInfo, where: str, offset: int, length: int) -> ChunkCorruptError:
    """The error for a range of chunk ``info`` that ``where`` returned short."""
    return ChunkCorruptError(
        f"chunk {info.name} at {where} is shorter than the index says "
        f"(wanted {offset}+{length} bytes); run `tierfeed verify`"
    )
