"""fetch_verified: a chunk reaches a local copy only after its size and checksum matched."""

from __future__ import annotations

import os

import pytest

from tierfeed.errors import ChunkCorruptError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.storage.fetch import fetch_verified
from tierfeed.storage.memory import MemoryDriver

DATA = os.urandom(10_000)


def origin_with(data: bytes) -> MemoryDriver:
    origin = MemoryDriver()
    origin.write("chunks/000000.tar", data)
    return origin


def info(size: int = len(DATA), checksum: int | None = None) -> ChunkInfo:
    return ChunkInfo(
        0, "chunks/000000.tar", size, checksum_bytes(DATA) if checksum is None else checksum
    )


def test_a_good_chunk_comes_back_whole() -> None:
    assert fetch_verified(origin_with(DATA), info()) == DATA


def test_a_good_chunk_in_small_blocks() -> None:
    origin = origin_with(DATA)
    assert fetch_verified(origin, info(), block=999) == DATA
    assert origin.counters.snapshot()["reads"] == -(-len(DATA) // 999)


@pytest.mark.parametrize("stored", [DATA[:-1], b""])
def test_a_short_chunk_is_corrupt(stored: bytes) -> None:
    with pytest.raises(ChunkCorruptError, match=r"chunks/000000\.tar .*index says 10000"):
        fetch_verified(origin_with(stored), info())


def test_a_chunk_longer_than_the_index_says_is_corrupt() -> None:
    with pytest.raises(ChunkCorruptError, match="read 10000 bytes, index says 10001"):
        fetch_verified(origin_with(DATA), info(size=len(DATA) + 1))


def test_a_wrong_checksum_is_corrupt() -> None:
    damaged = bytearray(DATA)
    damaged[5000] ^= 0xFF
    with pytest.raises(ChunkCorruptError, match="damaged"):
        fetch_verified(origin_with(bytes(damaged)), info())


def test_sink_mode_streams_blocks_and_returns_nothing() -> None:
    blocks: list[bytes] = []
    assert fetch_verified(origin_with(DATA), info(), sink=blocks.append, block=4096) == b""
    assert [len(b) for b in blocks] == [4096, 4096, len(DATA) - 8192]
    assert b"".join(blocks) == DATA


def test_sink_mode_still_raises_on_a_bad_chunk() -> None:
    blocks: list[bytes] = []
    with pytest.raises(ChunkCorruptError):
        fetch_verified(origin_with(DATA), info(checksum=1), sink=blocks.append)
    assert b"".join(blocks) == DATA  # the caller must not publish what it was given


def test_an_empty_chunk_is_fine() -> None:
    empty = ChunkInfo(0, "chunks/000000.tar", 0, checksum_bytes(b""))
    assert fetch_verified(origin_with(b""), empty) == b""
