"""A faster tier fills from a slower one that holds the chunk: RAM from the disk tier, with no
origin read and no repeated copy of what the faster tier will not take (issue 16)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage.test_tiers import read_all, stack
from tierfeed.format.index import Index
from tierfeed.loader.compose import open_store
from tierfeed.storage import MemoryDriver, Tier
from tierfeed.storage.tiers import disk_tier

pytestmark = pytest.mark.timeout(90)


def fill_disk(store_dir: Path, cache: Path) -> int:
    """A first process fills the disk tier with every chunk; returns the store's bytes."""
    tiers = stack(store_dir, [disk_tier(cache, 10**9)])
    with tiers, open_store(store_dir, source=tiers) as store:
        read_all(store)
        tiers.drain()
        assert tiers.origin_counters.copies == len(store.chunks)
    return sum(c.size for c in Index(store_dir).chunks())


def test_the_ram_tier_fills_from_the_disk_tier(store_dir: Path, tmp_path: Path) -> None:
    fill_disk(store_dir, tmp_path / "disk")
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    disk = disk_tier(tmp_path / "disk", 10**9)
    with stack(store_dir, [ram, disk]) as tiers, open_store(store_dir, source=tiers) as store:
        first = read_all(store)
        tiers.drain()
        chunks = len(store.chunks)
        assert disk.counters.hits > 0 and ram.counters.copies == chunks  # promoted, each once
        assert set(ram.held) == set(range(chunks))
        hits = ram.counters.hits
        assert read_all(store) == first
        assert ram.counters.hits - hits == len(store.index.member_offset)  # every read from RAM
        assert tiers.origin_counters.bytes == 0 and tiers.origin_counters.copies == 0


def test_a_full_ram_tier_is_not_offered_every_chunk_again(store_dir: Path, tmp_path: Path) -> None:
    size = max(c.size for c in Index(store_dir).chunks())
    fill_disk(store_dir, tmp_path / "disk")
    ram = Tier(MemoryDriver(), quota=size, name="ram")  # room for one chunk, fill-top
    disk = disk_tier(tmp_path / "disk", 10**9)
    with stack(store_dir, [ram, disk]) as tiers, open_store(store_dir, source=tiers) as store:

        def whole_chunk_reads() -> int:  # disk bytes read beyond the ranges it served
            return int(disk.driver.counters.snapshot()["bytes_read"] - disk.counters.bytes)

        read_all(store)
        tiers.drain()
        # Copy threads that started before the tier filled may each have read one chunk.
        first = whole_chunk_reads()
        assert first <= tiers.options.threads * size
        for _ in range(2):
            read_all(store)
            tiers.drain()
        assert ram.counters.copies == 1 and len(ram.held) == 1
        assert whole_chunk_reads() == first  # refused chunks are not read whole again
        assert tiers.origin_counters.bytes == 0
