"""A tier stack's views of its chunks by cache key and by size, made entry by entry: O(1) to set
up however many chunks the store has (an index of millions of chunks gives a `ChunkTable`,
whose entries are made when first used), where dictionaries of them all cost seconds and
hundreds of MB in every process."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.disktier import cache_key

__all__ = ["ChunkKeys", "ChunkSizes", "mean_chunk_size", "total_chunk_size"]


class ChunkKeys(Mapping[str, ChunkInfo]):
    """Chunks by their cache key (`cache_key`: the chunk's id, then its checksum): a key
    names its chunk's id, so a lookup is one parse and one comparison, and anything else a
    tier's directory holds is not a key."""

    def __init__(self, chunks: Sequence[ChunkInfo]) -> None:
        self._chunks = chunks
        self._keys: dict[int, str] = {}

    def key(self, chunk: int) -> str:
        """The cache key of chunk ``chunk`` (formatted once)."""
        key = self._keys.get(chunk)
        if key is None:
            key = self._keys[chunk] = cache_key(self._chunks[chunk])
        return key

    def __getitem__(self, key: str) -> ChunkInfo:
        head = key.partition("-")[0]
        if not (head.isascii() and head.isdigit()) or int(head) >= len(self._chunks):
            raise KeyError(key)
        chunk = int(head)
        if self.key(chunk) != key:
            raise KeyError(key)
        return self._chunks[chunk]

    def __len__(self) -> int:
        return len(self._chunks)

    def __iter__(self) -> Iterator[str]:
        return (self.key(c) for c in range(len(self._chunks)))


class ChunkSizes(Mapping[int, int]):
    """Chunk id -> size in bytes, read from the chunks when asked."""

    def __init__(self, chunks: Sequence[ChunkInfo]) -> None:
        self._chunks = chunks

    def __getitem__(self, chunk: int) -> int:
        if not 0 <= chunk < len(self._chunks):
            raise KeyError(chunk)
        return self._chunks[chunk].size

    def __len__(self) -> int:
        return len(self._chunks)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._chunks)))


def total_chunk_size(chunks: Sequence[ChunkInfo]) -> int:
    """The chunks' bytes in all, exactly: from the index's section where ``chunks`` is its
    table (no entry made), else from the entries."""
    total = getattr(chunks, "total_size", None)
    if total is not None:
        return int(total())
    return sum(c.size for c in chunks)


def mean_chunk_size(chunks: Sequence[ChunkInfo]) -> float:
    """The chunks' mean size (`total_chunk_size` over their count)."""
    return total_chunk_size(chunks) / max(1, len(chunks))
