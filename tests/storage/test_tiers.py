"""The tier stack on a real packed store: hits, one fetch per miss, quotas, corruption, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.storage.conftest import FILES
from tierfeed.errors import ChunkCorruptError
from tierfeed.format.index import Index
from tierfeed.loader.compose import open_store
from tierfeed.storage import LatencyModel, MemoryDriver, PosixDriver, SlowDriver, Tier, TierStack
from tierfeed.storage.placing import Landed
from tierfeed.storage.shared_dir import copy_claim
from tierfeed.storage.store import Store
from tierfeed.storage.tiers import cache_key, disk_tier

pytestmark = pytest.mark.timeout(90)


def stack(store_dir: Path, tiers: list[Tier], policy: str = "fill-top", **kw: object) -> TierStack:
    index = Index(store_dir)
    origin = kw.pop("origin", None) or PosixDriver(store_dir, read_only=True)
    return TierStack(index.chunks(), origin, tiers, policy)  # type: ignore[arg-type]


def read_all(store: Store) -> dict[str, bytes]:
    return {store.index.key(i): store.read_sample(i).fields["bin"] for i in range(len(store))}


def test_reads_then_hits_from_the_tier(store_dir: Path) -> None:
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with stack(store_dir, [ram]) as tiers, open_store(store_dir, source=tiers) as store:
        first = read_all(store)
        tiers.drain()
        origin_bytes = tiers.origin_counters.bytes
        assert read_all(store) == first
        assert tiers.origin_counters.bytes == origin_bytes  # second pass: no origin reads
        assert ram.counters.hits > 0 and tiers.origin_counters.copies == len(store.chunks)
    assert {k + ".bin": v for k, v in first.items()} == {
        os.fsdecode(k): v for k, v in FILES.items()
    }


def test_concurrent_misses_fetch_a_chunk_once(store_dir: Path) -> None:
    slow = SlowDriver(PosixDriver(store_dir, read_only=True), LatencyModel(median_ms=20))
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with stack(store_dir, [ram], origin=slow) as tiers:
        go = threading.Barrier(16)

        def reader() -> None:
            go.wait()
            tiers.read_range(0, 512, 100)

        threads = [threading.Thread(target=reader) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tiers.drain()
        assert tiers.origin_counters.copies == 1 and list(ram.held) == [0]


@pytest.mark.parametrize("policy", ["fill-top", "lru", "clairvoyant"])
def test_quota_is_respected(store_dir: Path, policy: str) -> None:
    chunk_size = Index(store_dir).chunk(0).size
    ram = Tier(MemoryDriver(), quota=2 * chunk_size + 100, name="ram")
    with stack(store_dir, [ram], policy) as tiers, open_store(store_dir, source=tiers) as store:
        tiers.set_future(store.index.sample_chunk.tolist() * 2)
        for _ in range(2):
            for i in range(len(store)):
                store.read_sample(i)
                assert sum(ram.held.values()) <= ram.quota
            tiers.drain()
        assert ram.driver.used <= ram.quota  # type: ignore[attr-defined]


def test_corrupt_cache_entry_is_dropped_and_refetched(store_dir: Path, tmp_path: Path) -> None:
    with stack(store_dir, [disk_tier(tmp_path / "cache", 10**9)]) as tiers:
        tiers.read_range(1, 0, 10)
        tiers.drain()
    info = Index(store_dir).chunk(1)
    cached = tmp_path / "cache" / cache_key(info)
    raw = bytearray(cached.read_bytes())
    raw[700] ^= 0xFF
    cached.write_bytes(bytes(raw))
    disk = disk_tier(tmp_path / "cache", 10**9)
    with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
        assert read_all(store)  # correct bytes: the damaged entry was not served
        tiers.drain()
        assert disk.counters.corrupt_dropped == 1
    assert cached.read_bytes() == (store_dir / info.name).read_bytes()  # fetched again


def test_a_verified_entry_is_not_read_whole_again_unless_its_file_changed(
    store_dir: Path, tmp_path: Path
) -> None:
    with stack(store_dir, [disk_tier(tmp_path / "cache", 10**9)]) as tiers:
        tiers.read_range(1, 0, 10)
        tiers.drain()
    info = Index(store_dir).chunk(1)
    cached = tmp_path / "cache" / cache_key(info)
    # Another process (a forked worker) trusts the mark left by the one that copied it.
    disk = disk_tier(tmp_path / "cache", 10**9)
    with stack(store_dir, [disk]) as tiers:
        tiers.read_range(1, 0, 10)
        assert disk.driver.counters.snapshot()["bytes_read"] == 10  # no whole-chunk check
    # Damage written into the file changes its mtime: it no longer matches its mark, so it
    # is checked again, dropped and fetched anew.
    raw = bytearray(cached.read_bytes())
    raw[700] ^= 0xFF
    cached.write_bytes(bytes(raw))
    disk = disk_tier(tmp_path / "cache", 10**9)
    with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
        assert read_all(store)
        tiers.drain()
        assert disk.counters.corrupt_dropped == 1


def test_corrupt_origin_chunk_is_named(store_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    (bad / "chunks").mkdir(parents=True)
    for p in (store_dir / "chunks").iterdir():
        (bad / "chunks" / p.name).write_bytes(p.read_bytes())
    (bad / "index.tfi").write_bytes((store_dir / "index.tfi").read_bytes())
    target = bad / "chunks" / "000000.tar"
    raw = bytearray(target.read_bytes())
    raw[600] ^= 0xFF
    target.write_bytes(bytes(raw))
    with stack(bad, [Tier(MemoryDriver(), 10**9, name="ram")]) as tiers:
        tiers.read_range(0, 0, 10)
        tiers.drain()
        with pytest.raises(ChunkCorruptError, match=r"chunks/000000\.tar at the origin"):
            tiers.read_range(0, 0, 10)


def test_disk_tier_persists_across_processes_and_is_private(
    store_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    child = f"""
import sys; sys.path.insert(0, {str(Path.cwd())!r})
from tests.storage.test_tiers import stack
from tierfeed.storage.tiers import disk_tier
from tierfeed.loader.compose import open_store
from pathlib import Path
with stack(Path({str(store_dir)!r}), [disk_tier({str(cache)!r}, 10**9)]) as t:
    s = open_store({str(store_dir)!r}, source=t)
    [s.read_sample(i) for i in range(len(s))]
    t.drain()
"""
    subprocess.run([sys.executable, "-c", child], check=True, timeout=60)
    assert (cache.stat().st_mode & 0o777) == 0o700
    disk = disk_tier(cache, 10**9)
    with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
        read_all(store)
        assert tiers.origin_counters.bytes == 0 and disk.counters.hits > 0


# A copy is written (a RAM tier's bytes, or a disk tier on another file system), or the file
# it landed in is linked in (a disk tier beside the landing): killed midway, either way, the
# temporary name is all that is left.
_DIE_WRITING = """
def slow_write(path, data):  # die while the temporary file is being written
    tmp = t.tiers[0].driver.root / (".tmp." + str(os.getpid()) + "." + path)
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY)
    os.write(fd, data[: len(data) // 2]); print("writing", flush=True); time.sleep(60)
t.tiers[0].driver._write = slow_write
t.tiers[0].driver.adopt = lambda path, source, fd: False
"""
_DIE_LINKING = """
def slow_adopt(path, source, fd):  # die between the link and the rename
    os.link(source, t.tiers[0].driver.root / (".tmp." + str(os.getpid()) + "." + path))
    print("writing", flush=True); time.sleep(60)
t.tiers[0].driver.adopt = slow_adopt
"""


@pytest.mark.parametrize("die", [_DIE_WRITING, _DIE_LINKING], ids=["writing", "linking"])
def test_kill_9_during_a_copy_leaves_nothing_served(
    store_dir: Path, tmp_path: Path, die: str
) -> None:
    cache = tmp_path / "cache"
    child = f"""
import os, sys, time; sys.path.insert(0, {str(Path.cwd())!r})
from pathlib import Path
from tests.storage.test_tiers import stack
from tierfeed.storage import LatencyModel, PosixDriver, SlowDriver
from tierfeed.storage.tiers import disk_tier
origin = SlowDriver(PosixDriver({str(store_dir)!r}, read_only=True), LatencyModel())
t = stack(Path({str(store_dir)!r}), [disk_tier({str(cache)!r}, 10**9)], origin=origin)
{die}
t.read_range(0, 0, 10)
time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert list(cache.glob(".tmp.*"))  # the half-written temporary is there
    disk = disk_tier(cache, 10**9)
    with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
        assert not list(cache.glob(".tmp.*"))  # cleaned at start
        assert disk.held == {}  # nothing half-written is ever listed, let alone served
        assert read_all(store)
        tiers.drain()
        assert 0 in disk.held


def test_origin_is_never_written(store_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in (store_dir / "chunks").iterdir()}
    origin = PosixDriver(store_dir, read_only=True)
    with stack(store_dir, [Tier(MemoryDriver(), 10**9, name="ram")], origin=origin) as tiers:
        for c in range(len(tiers.chunks)):
            tiers.read_range(c, 0, 100)
        tiers.drain()
        time.sleep(0.01)
    assert origin.counters.snapshot()["writes"] == 0
    assert {p.name: p.stat().st_mtime_ns for p in (store_dir / "chunks").iterdir()} == before


def test_evicted_entries_leave_no_mark_behind(store_dir: Path, tmp_path: Path) -> None:
    chunk_size = Index(store_dir).chunk(0).size
    disk = disk_tier(tmp_path / "cache", 2 * chunk_size + 100)
    with stack(store_dir, [disk], "lru") as tiers, open_store(store_dir, source=tiers) as store:
        for i in range(len(store)):
            store.read_sample(i)
            tiers.drain()
        assert disk.counters.evictions > 0
    marks = {p.name for p in (tmp_path / "cache" / ".verified").iterdir()}
    assert marks == {cache_key(Index(store_dir).chunk(c)) for c in disk.held}


def test_processes_sharing_a_disk_tier_copy_a_chunk_from_the_origin_once(
    store_dir: Path, tmp_path: Path
) -> None:
    # Two stacks over one cache directory stand for two DataLoader workers of a host.
    cache = tmp_path / "cache"
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    disk = disk_tier(cache, 10**9)
    info = Index(store_dir).chunk(0)
    with stack(store_dir, [ram, disk]) as mine:
        cache.mkdir(exist_ok=True)
        with copy_claim(cache, cache_key(info)) as claimed:
            assert claimed  # the sibling process is copying chunk 0 from the origin now
            mine.schedule(0)
            mine.drain()
            assert mine.origin.counters.snapshot()["reads"] == 0  # it did not copy it too
            assert 0 not in ram.held
            with stack(store_dir, [disk_tier(cache, 10**9)]) as sibling:
                sibling.filler.copies.place_all(
                    info, Landed((store_dir / info.name).read_bytes()), 0.0
                )
        # The sibling's copy has landed: the next miss takes it from the shared directory.
        mine.schedule(0)
        mine.drain()
        assert mine.origin.counters.snapshot()["reads"] == 0
        assert 0 in ram.held and 0 in disk.held
        assert mine.origin_counters.copies == 0 and disk.counters.copies == 0
        assert ram.counters.copies == 1


def test_a_copy_placed_by_a_sibling_meanwhile_is_not_read_again(
    store_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    disk = disk_tier(cache, 10**9)
    with stack(store_dir, [disk]) as mine, stack(store_dir, [disk_tier(cache, 10**9)]) as sibling:
        assert 0 not in disk.held  # what this process saw when it queued the copy
        sibling.schedule(0)
        sibling.drain()
        mine.filler.copies.copy(0)  # the queued copy runs after the sibling's landed
        assert disk.driver.counters.snapshot()["reads"] == 0  # not read whole to place it
        assert mine.origin.counters.snapshot()["reads"] == 0
        assert 0 in disk.held and disk.counters.copies == 0


def test_read_samples_is_read_sample_for_many(store_dir: Path, tmp_path: Path) -> None:
    disk = disk_tier(tmp_path / "cache", 10**9)
    with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
        n = len(store)
        ids = [(7 * i + 3) % n for i in range(n)] + [0, 0, n - 1]  # shuffled, repeats
        cold = store.read_samples(ids)  # the origin, chunk by chunk
        tiers.drain()
        warm = store.read_samples(ids)  # the tier: one look and one open per chunk
        assert disk.counters.hits >= n
        one_by_one = [store.read_sample(i) for i in ids]
        assert [(s.key, s.label, s.fields) for s in cold] == [
            (s.key, s.label, s.fields) for s in one_by_one
        ]
        assert [s.fields for s in warm] == [s.fields for s in one_by_one]
        assert store.read_samples([]) == []
        with pytest.raises(IndexError, match=f"sample {n} out of range"):
            store.read_samples([0, n])


def test_read_samples_drops_a_copy_damaged_after_its_check(store_dir: Path, tmp_path: Path) -> None:
    disk = disk_tier(tmp_path / "cache", 10**9)
    with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
        ix = store.index
        in_chunk_1 = [i for i in range(len(store)) if int(ix.sample_chunk[i]) == 1]
        good = [s.fields for s in store.read_samples(in_chunk_1)]
        tiers.drain()
        store.read_samples(in_chunk_1)  # served by the tier: its copy is checked now
        assert disk.counters.hits > 0 and disk.counters.corrupt_dropped == 0
        # Damage the checked copy in place, under a member of the third sample.
        member = ix.members(in_chunk_1[2])[0]
        cached = tmp_path / "cache" / cache_key(ix.chunk(1))
        with open(cached, "r+b") as f:
            f.seek(int(ix.member_offset[member]))
            f.write(b"\xff" * 8)
        again = store.read_samples(in_chunk_1)
        assert [s.fields for s in again] == good  # the bad bytes were never served
        assert disk.counters.corrupt_dropped == 1
