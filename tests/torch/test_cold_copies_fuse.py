"""A cold epoch through two DataLoader workers over a slowed FUSE origin with the kernel's page
cache (as `bench/cold_path.py` runs it): the copies read each origin byte once, their pieces
past the page cache (`Driver.read_block`), so no readahead reads any of it twice."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tierfeed.format.pack import PackOptions, pack
from tierfeed.latency import LatencyModel
from tierfeed.slowfs import SlowFS
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, TierConfig

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]


def length(sample: Sample) -> int:
    return len(sample.fields["bin"])


def test_a_cold_epoch_reads_each_origin_byte_once_through_the_page_cache(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    rng = random.Random(7)
    for i in range(2400):  # ~8 chunks of 2 MiB, samples of 1-13 KB (they straddle pieces)
        folder = raw / f"c{i % 8}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{i:05d}.bin").write_bytes(os.urandom(rng.randrange(1000, 13000)))
    store = tmp_path / "origin" / "store"
    pack(raw, store, PackOptions(chunk_size=2 * 2**20, progress=False))
    chunks = sum(f.stat().st_size for f in (store / "chunks").iterdir())
    index = sum(f.stat().st_size for f in store.iterdir() if f.is_file())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with SlowFS(tmp_path / "origin", mnt, LatencyModel.parse("median_ms=0.5,sigma=0.5")) as fs:
        tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
        ds = Dataset(mnt / "store", "global", batch_size=32, decode=length, tiers=tiers)
        with Loader(ds, num_workers=2) as loader:
            delivered = sum(len(batch) for batch in loader)
            copies = loader.last_epoch["tiers"]["fetch"]["piece_bytes"]
            origin = loader.last_epoch["tiers"]["origin"]["bytes"]
            head_reads = loader.last_epoch["tiers"]["origin"]["hits"]
        read = fs.stats().bytes_read
    assert delivered == 2400
    assert copies == chunks  # every chunk copied whole, once
    # Beside the copies, each worker's head: its first batch (and the next epoch's, begun as
    # this one ends), read at once as exact ranges.
    heads = origin - copies
    assert 0 <= heads <= 2 * 2 * 32 * 14_000
    # The chunks once (through the page cache 6-15% more here), each head read with the
    # kernel's readahead around it at most once, and the index at most once per process: the
    # training process plans and each worker reads. FUSE drops a file's pages at an open, but
    # a process that opens it while another reads it may find some of them cached (a head
    # read, the pages of a copy's).
    low = chunks + index
    high = chunks + heads + head_reads * 256 * 1024 + 3 * index + 64 * 1024
    assert low <= read <= high, (read - chunks - heads) / index
