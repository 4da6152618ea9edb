"""Copies in flight: reads served from the pieces that landed, one origin read per byte, and
no half chunk served as whole after a crash, a damaged map or tampered bytes."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.storage.test_tiers import read_all
from tierfeed.errors import ReadOnlyError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.format.index import Index
from tierfeed.loader.compose import open_store
from tierfeed.storage import LatencyModel, MemoryDriver, PosixDriver, SlowDriver, Tier, TierStack
from tierfeed.storage.disktier import cache_key
from tierfeed.storage.filelanding import FileLanding
from tierfeed.storage.landing import Arrival, MemoryLanding
from tierfeed.storage.shared_dir import marked
from tierfeed.storage.tiers import TierOptions, disk_tier

pytestmark = pytest.mark.timeout(90)
PIECE = 8 * 1024  # the store's chunks are ~32 KiB: four pieces each


def slow_stack(store_dir: Path, tiers: list[Tier], median_ms: float = 150.0) -> TierStack:
    """A stack whose origin takes ``median_ms`` per read: a copy is in flight for that long."""
    origin = SlowDriver(PosixDriver(store_dir, read_only=True), LatencyModel(median_ms=median_ms))
    options = TierOptions(piece_bytes=PIECE, fetch_threads=4, landing_wait_s=5)
    return TierStack(Index(store_dir).chunks(), origin, tiers, options=options)


def until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_reads_during_a_copy_are_served_from_its_pieces(store_dir: Path) -> None:
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with slow_stack(store_dir, [ram]) as tiers:
        info = tiers.chunks[0]
        want = (store_dir / info.name).read_bytes()
        assert tiers.schedule(0)
        until(lambda: tiers.filler.landing.find(info) is not None)
        got: dict[int, bytes] = {}

        def reader(k: int) -> None:
            offset = (k * 3331) % (info.size - 600)
            got[offset] = tiers.read_range(0, offset, 600)

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tiers.drain()
        assert all(data == want[o : o + 600] for o, data in got.items())
        fetch = tiers.fetch.counters.snapshot()
        assert fetch["served"] == 8 and fetch["gave_up"] == 0
        pieces = -(-info.size // PIECE)
        assert tiers.origin.counters.snapshot()["bytes_read"] == info.size  # each byte once
        assert fetch["pieces"] == pieces and 0 in ram.held
        assert tiers.filler.landing.find(info) is None  # ended once placed


def test_a_sibling_process_reads_from_the_copy_in_flight(store_dir: Path, tmp_path: Path) -> None:
    # Two stacks over one directory stand for two DataLoader workers of a host.
    cache = tmp_path / "cache"
    with (
        slow_stack(store_dir, [disk_tier(cache, 10**9)]) as copier,
        slow_stack(store_dir, [disk_tier(cache, 10**9)], median_ms=0) as sibling,
    ):
        info = copier.chunks[1]
        copier.schedule(1)
        until(lambda: sibling.filler.landing.find(info) is not None)
        data = sibling.read_range(1, 100, 5000)
        assert data == (store_dir / info.name).read_bytes()[100:5100]
        assert sibling.origin.counters.snapshot()["reads"] == 0
        assert sibling.fetch.counters.snapshot()["served"] == 1
        copier.drain()
        # Landed and ended: the sibling finds the chunk in the directory, not at the origin.
        assert sibling.read_range(1, 0, 10) == (store_dir / info.name).read_bytes()[:10]
        assert sibling.origin.counters.snapshot()["reads"] == 0


class StallingCopies(PosixDriver):
    """A read-only origin whose large reads (the pieces of copies) take 1 s; small ones none."""

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if length > 1000:
            time.sleep(1)
        return super().read_range(path, offset, length)

    read_block = read_range  # a copy's pieces too


def test_a_read_that_would_wait_too_long_reads_the_origin(store_dir: Path) -> None:
    origin = StallingCopies(store_dir, read_only=True)
    options = TierOptions(piece_bytes=PIECE, landing_wait_s=0.1)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with TierStack(Index(store_dir).chunks(), origin, [ram], options=options) as tiers:
        started = time.monotonic()
        assert tiers.read_range(0, 0, 100) == (store_dir / tiers.chunks[0].name).read_bytes()[:100]
        assert time.monotonic() - started < 0.8  # not the copy's 1 s
        assert tiers.fetch.counters.snapshot()["gave_up"] == 1
        assert tiers.origin_counters.hits == 1  # the read's own, beside the copy


CHILD = """
import sys, time
sys.path.insert(0, {cwd!r})
from pathlib import Path
from tierfeed.format.index import Index
from tierfeed.storage.filelanding import FileLanding
info = Index(Path({store!r})).chunk(0)
arrival = FileLanding(Path({cache!r})).begin(info, {piece})
arrival.put(0, (Path({store!r}) / info.name).read_bytes()[:{piece}])
print("landed", flush=True)
time.sleep(60)
"""


def test_a_killed_fetcher_holds_no_reader_and_leaves_nothing_served(
    store_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    code = CHILD.format(cwd=str(Path.cwd()), store=str(store_dir), cache=str(cache), piece=PIECE)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"landed"
        disk = disk_tier(cache, 10**9)
        with slow_stack(store_dir, [disk], median_ms=0) as tiers:
            info = tiers.chunks[0]
            want = (store_dir / info.name).read_bytes()
            assert tiers.read_range(0, 10, 100) == want[10:110]  # piece 0 landed: served
            assert tiers.fetch.counters.snapshot()["served"] == 1
            assert tiers.origin.counters.snapshot()["reads"] == 0
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            started = time.monotonic()
            assert tiers.read_range(0, PIECE + 10, 100) == want[PIECE + 10 : PIECE + 110]
            assert time.monotonic() - started < 1.0  # the dead fetch is not waited for
            assert 0 not in disk.held or tiers.chunks[0].size == disk.held[0]
    finally:
        proc.kill()
    landing = cache / ".landing"
    # Left behind by the killed fetcher, or replaced by this stack's own copy, which then
    # placed the chunk whole and ended.
    assert list(landing.iterdir()) or disk.held.get(0) == info.size
    disk = disk_tier(cache, 10**9)
    with (
        slow_stack(store_dir, [disk], median_ms=0) as tiers,
        open_store(store_dir, source=tiers) as store,
    ):
        assert read_all(store)
        tiers.drain()
        assert 0 in disk.held  # whole and verified: copied anew, not taken from the arrival
        assert (cache / tiers.chunks[0].name).exists() is False  # cached under its key only
    assert not [p for p in landing.iterdir() if not p.name.startswith(".")]


def _info(size: int = 3 * PIECE + 5) -> ChunkInfo:
    return ChunkInfo(id=7, name="chunks/x.tar", size=size, checksum=0x1234)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_arrival_reads_only_landed_ranges(kind: str, tmp_path: Path) -> None:
    landing = MemoryLanding() if kind == "memory" else FileLanding(tmp_path)
    info = _info()
    payload = os.urandom(info.size)
    arrival = landing.begin(info, PIECE)
    assert arrival.pieces == 4
    reader = landing.find(info)
    assert reader is not None
    assert reader.read(0, 10, wait_s=0.05) is None  # nothing landed: gives up in time
    arrival.put(1, payload[PIECE : 2 * PIECE])
    assert reader.read(PIECE + 5, 100, wait_s=0) == payload[PIECE + 5 : PIECE + 105]
    assert reader.read(PIECE - 5, 10, wait_s=0) is None  # straddles a piece not landed
    assert reader.read(info.size - 1, 2, wait_s=0) is None  # past the end
    timer = threading.Timer(0.05, arrival.put, args=(0, payload[:PIECE]))
    timer.start()
    assert reader.read(PIECE - 5, 10, wait_s=5) == payload[PIECE - 5 : PIECE + 5]  # waited
    timer.join()
    assert not reader.complete()
    for i in (2, 3):
        start, length = arrival.span(i)
        arrival.put(i, payload[start : start + length])
    assert reader.complete() and reader.whole() == payload
    reader.close()
    landing.end(arrival)
    assert landing.find(info) is None


@pytest.mark.parametrize(
    "damage",
    [b"", b"TFL1", b"XXXX" + bytes(40), b"TFL1\x01\x00\x00\x00" + bytes(16) + bytes(4)],
)
def test_a_damaged_map_is_never_served(damage: bytes, tmp_path: Path) -> None:
    landing = FileLanding(tmp_path)
    info = _info()
    arrival = landing.begin(info, PIECE)
    for i in range(arrival.pieces):
        _, length = arrival.span(i)
        arrival.put(i, bytes(length))
    map_path = next(p for p in (tmp_path / ".landing").iterdir() if p.name.endswith(".map"))
    map_path.write_bytes(damage)
    found = landing.find(info)
    assert found is None or found.read(0, 10, wait_s=0.05) is None


def in_flight(store_dir: Path, tmp_path: Path) -> tuple[Path, ChunkInfo, Arrival]:
    """A disk tier's directory and a copy of chunk 0 begun in it, "in flight" in this live
    process (the test lands its pieces)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    info = Index(store_dir).chunk(0)
    return cache, info, FileLanding(cache).begin(info, PIECE)


def test_tampered_bytes_in_flight_are_refused_and_read_from_the_origin(
    store_dir: Path, tmp_path: Path
) -> None:
    cache, info, arrival = in_flight(store_dir, tmp_path)
    for i in range(arrival.pieces):
        _, length = arrival.span(i)
        arrival.put(i, os.urandom(length))  # every piece landed, none of them right
    disk = disk_tier(cache, 10**9)
    with (
        slow_stack(store_dir, [disk], median_ms=0) as tiers,
        open_store(store_dir, source=tiers) as store,
    ):
        members = [
            m for m in range(len(store.index.member_chunk)) if store.index.member_chunk[m] == 0
        ]
        want = store_dir.joinpath(info.name).read_bytes()
        for m in members:
            o, n = int(store.index.member_offset[m]), int(store.index.member_length[m])
            assert store.read_member(m) == want[o : o + n]
        assert tiers.fetch.counters.snapshot()["served"] == 1  # the first, refused; then origin
    arrival.close()


def test_a_copy_landed_whole_reads_as_local_until_it_ends(store_dir: Path, tmp_path: Path) -> None:
    # A sibling process's copy whose last piece lands while it is still checked and placed:
    # this process reads it as local (whole batches, no wait) from then on, never the origin.
    cache, info, arrival = in_flight(store_dir, tmp_path)
    want = (store_dir / info.name).read_bytes()
    with slow_stack(store_dir, [disk_tier(cache, 10**9)], median_ms=0) as sibling:
        for i in range(arrival.pieces - 1):
            start, length = arrival.span(i)
            arrival.put(i, want[start : start + length])
        assert sibling.read_range(0, 0, 100) == want[:100]
        assert not sibling.local(0)  # a piece is still on its way
        last = arrival.pieces - 1
        arrival.put(last, want[arrival.span(last)[0] :])
        assert sibling.read_range(0, 0, 100) == want[:100]
        assert sibling.local(0)  # landed whole
        offsets, lengths = [0, 5000, info.size - 10], [10, 300, 10]
        got = sibling.read_ranges(0, offsets, lengths)
        assert got == [want[o : o + n] for o, n in zip(offsets, lengths, strict=True)]
        assert sibling.fetch.counters.snapshot()["served"] == 5
        assert sibling.origin.counters.snapshot()["reads"] == 0
        FileLanding(cache).end(arrival)  # the copy is over without a placement (it failed)
        assert sibling.read_range(0, 7, 10) == want[7:17]  # read as any miss is: copied anew
        assert sibling.origin.counters.snapshot()["reads"] > 0


def test_a_bad_byte_in_a_copy_landed_whole_is_refused_and_read_from_the_origin(
    store_dir: Path, tmp_path: Path
) -> None:
    cache, info, arrival = in_flight(store_dir, tmp_path)
    want = bytearray((store_dir / info.name).read_bytes())
    with (
        slow_stack(store_dir, [disk_tier(cache, 10**9)], median_ms=0) as tiers,
        open_store(store_dir, source=tiers) as store,
    ):
        members = [
            m for m in range(len(store.index.member_chunk)) if store.index.member_chunk[m] == 0
        ]
        bad = members[len(members) // 2]
        damaged = bytearray(want)
        damaged[int(store.index.member_offset[bad])] ^= 0xFF
        for i in range(arrival.pieces):
            start, length = arrival.span(i)
            arrival.put(i, bytes(damaged[start : start + length]))
        first = members[0] if members[0] != bad else members[1]
        o, n = int(store.index.member_offset[first]), int(store.index.member_length[first])
        assert store.read_member(first) == want[o : o + n]  # served from the copy in flight
        assert tiers.local(0)
        samples = [s for s in range(len(store)) if store.index.sample_chunk[s] == 0]
        for got, s in zip(store.read_samples(samples), samples, strict=True):
            assert got.fields == store.read_sample(s).fields
        o, n = int(store.index.member_offset[bad]), int(store.index.member_length[bad])
        assert store.read_member(bad) == want[o : o + n]
        assert not tiers.holdings.is_landed_whole(0) and tiers.holdings.shuns(
            0
        )  # from the origin from now on
    arrival.close()


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_reader_stops_waiting_when_the_copy_ends_unfinished(kind: str, tmp_path: Path) -> None:
    landing = MemoryLanding() if kind == "memory" else FileLanding(tmp_path)
    info = _info()
    arrival = landing.begin(info, PIECE)
    reader = landing.find(info)
    assert reader is not None
    threading.Timer(0.05, landing.end, args=(arrival,)).start()  # the copy failed
    started = time.monotonic()
    assert reader.read(0, 10, wait_s=5) is None
    assert time.monotonic() - started < 2
    reader.close()


class RecordingOrigin(PosixDriver):
    """A read-only origin that notes the offset of every read, in order; each takes 50 ms (a
    copy is in flight for a while: the read that started it waits for its piece)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, read_only=True)
        self.offsets: list[int] = []

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        self.offsets.append(offset)
        time.sleep(0.05)
        return super().read_range(path, offset, length)

    read_block = read_range  # a copy's pieces too


def test_the_piece_a_read_waits_for_is_fetched_first(store_dir: Path) -> None:
    origin = RecordingOrigin(store_dir)
    options = TierOptions(piece_bytes=PIECE, fetch_threads=1)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with TierStack(Index(store_dir).chunks(), origin, [ram], options=options) as tiers:
        info = tiers.chunks[0]
        offset = 3 * PIECE + 7  # in the last piece
        want = (store_dir / info.name).read_bytes()[offset : offset + 50]
        assert tiers.read_range(0, offset, 50) == want
        tiers.drain()
        assert origin.offsets[0] // PIECE == 3  # its piece first, then the rest in order
        assert sorted({o // PIECE for o in origin.offsets}) == [0, 1, 2, 3]
        assert tiers.fetch.counters.snapshot()["served"] == 1


class OneStalledPiece(PosixDriver):
    """A read-only origin whose first piece of chunk 0 takes 2 s: that copy holds its copy
    thread (and one request in flight) that long; every other read is quick."""

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if path.endswith("000000.tar") and offset == 0 and length > 1000:
            time.sleep(2)
        return super().read_range(path, offset, length)

    read_block = read_range  # a copy's pieces too


def test_a_read_whose_copy_waits_for_a_busy_thread_starts_it_beside(store_dir: Path) -> None:
    origin = OneStalledPiece(store_dir, read_only=True)
    options = TierOptions(threads=1, piece_bytes=PIECE, landing_wait_s=0.5)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with TierStack(Index(store_dir).chunks(), origin, [ram], options=options) as tiers:
        assert tiers.schedule(0)
        until(lambda: tiers.filler.landing.find(tiers.chunks[0]) is not None)  # the one thread busy
        want = (store_dir / tiers.chunks[1].name).read_bytes()[5000:5100]
        assert tiers.read_range(1, 5000, 100) == want  # queued, it waited 0.5 s, then the origin
        fetch = tiers.fetch.counters.snapshot()
        # From its piece, or from the tier where the copy (quick) was placed meanwhile.
        assert fetch["served"] + ram.counters.hits == 1 and fetch["gave_up"] == 0
        assert tiers.origin_counters.hits == 0  # no read of its own beside the copy
        tiers.drain()
        assert {0, 1} <= set(ram.held)


def test_sweep_removes_dead_arrivals_and_leaves_stray_files_alone(tmp_path: Path) -> None:
    landing = FileLanding(tmp_path)
    live = landing.begin(_info(), PIECE)  # this process: alive
    stray = tmp_path / ".landing"
    (stray / "notes.txt").write_text("not ours")
    (stray / "odd.map").mkdir()  # a directory where a map would be
    dead = ChunkInfo(id=8, name="chunks/y.tar", size=PIECE, checksum=0x99)
    landing.begin(dead, PIECE).close()
    dead_map = next(p for p in stray.glob("00000008-*.map"))
    raw = bytearray(dead_map.read_bytes())
    raw[4:8] = (2**31 - 2).to_bytes(4, "little")  # an owner pid that does not exist
    dead_map.write_bytes(bytes(raw))
    assert landing.sweep() == 1
    assert not list(stray.glob("00000008-*"))  # its map and its data
    found = landing.find(live.info)
    assert landing.find(dead) is None and found is not None
    assert (stray / "notes.txt").exists() and (stray / "odd.map").is_dir()
    found.close()
    live.close()


def test_a_claim_found_taken_is_awaited_briefly_not_for_the_whole_wait(
    store_dir: Path, tmp_path: Path
) -> None:
    # Another process claimed chunk 0's copy; its arrival never appears (it was refused, or
    # it ended). A read waits for that arrival only as long as a claim takes to become a map,
    # then reads the origin, though the stack would wait 5 s for a copy in flight.
    origin = PosixDriver(store_dir, read_only=True)
    options = TierOptions(piece_bytes=PIECE, landing_wait_s=5)
    disk = disk_tier(tmp_path / "disk", 10**9)
    with TierStack(Index(store_dir).chunks(), origin, [disk], options=options) as tiers:
        with disk.files.claim(cache_key(tiers.chunks[0])) as mine:
            assert mine  # held here: this stack's own copier finds it taken
            started = time.monotonic()
            data = tiers.read_range(0, 0, 100)
            took = time.monotonic() - started
        assert data == (store_dir / tiers.chunks[0].name).read_bytes()[:100]
        assert 0.1 < took < 2.0  # awaited ~0.2 s, not the 5 s wait for a copy in flight


class CostlyOrigin(PosixDriver):
    """An origin whose every request is billed, as an object store's."""

    costly_requests = True


def test_a_costly_origin_is_read_once_per_piece_and_never_to_measure(store_dir: Path) -> None:
    origin = CostlyOrigin(store_dir, read_only=True)
    options = TierOptions(piece_bytes=PIECE, landing_wait_s=5)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with TierStack(Index(store_dir).chunks(), origin, [ram], options=options) as tiers:
        with open_store(store_dir, source=tiers) as store:
            read_all(store)
        tiers.drain(timeout=30)
        # No piece read as halves for the tuner, no read beside a copy: one request per piece,
        # each byte of the store once.
        assert origin.counters.reads == tiers.fetch.counters.snapshot()["pieces"]
        assert origin.counters.bytes_read == sum(c.size for c in tiers.chunks)


def test_a_landed_chunk_is_linked_into_the_disk_tier_not_written_again(
    store_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    disk = disk_tier(cache, 10**9, shared=True)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    with slow_stack(store_dir, [ram, disk], median_ms=0) as tiers:
        for chunk in range(len(tiers.chunks)):
            assert tiers.schedule(chunk)
        tiers.drain()
        n = len(tiers.chunks)
        ops = disk.driver.counters.snapshot()
        assert ops["links"] == ops["writes"] == n and ops["bytes_written"] == 0
        assert ram.driver.counters.snapshot()["writes"] == n  # RAM gets the bytes themselves
        for info in tiers.chunks:
            cached = cache / cache_key(info)
            assert cached.read_bytes() == (store_dir / info.name).read_bytes()
            assert cached.stat().st_nlink == 1  # the landing's names are gone
            assert cached.stat().st_mode & 0o777 == 0o644  # the tier's mode, not the landing's
        assert not [p for p in (cache / ".landing").iterdir()]
    # Another process of the host sees whole, checked entries, and serves them.
    with slow_stack(store_dir, [disk_tier(cache, 10**9)], median_ms=0) as again:
        with open_store(store_dir, source=again) as store:
            assert read_all(store)
        assert again.origin.counters.snapshot()["bytes_read"] == 0


class MarkSeenOnAdopt(PosixDriver):
    """A disk tier's driver that notes, the moment a landed chunk is linked in, whether its
    mark (checked whole, `shared_dir.marked`) is there already."""

    seen: list[bool]

    def adopt(self, path: str, source: Path, fd: int) -> bool:
        linked = super().adopt(path, source, fd)
        self.seen.append(linked and marked(self.root, path))
        return linked


def test_a_linked_chunk_is_marked_checked_before_it_appears(
    store_dir: Path, tmp_path: Path
) -> None:
    # Else a sibling's read that finds it in between reads all of it to check it again.
    driver = MarkSeenOnAdopt(tmp_path / "cache")
    driver.seen = []
    disk = Tier(driver, 10**9, name="disk")
    with slow_stack(store_dir, [disk], median_ms=0) as tiers:
        for chunk in range(len(tiers.chunks)):
            tiers.schedule(chunk)
        tiers.drain()
    assert driver.seen == [True] * len(tiers.chunks)


def test_a_damaged_landed_chunk_is_never_linked(store_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    bad = tmp_path / "bad"
    shutil.copytree(store_dir, bad)
    info = Index(bad).chunk(0)
    with open(bad / info.name, "r+b") as f:  # same size, one byte flipped
        f.seek(info.size // 2)
        byte = f.read(1)
        f.seek(info.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    disk = disk_tier(cache, 10**9)
    with slow_stack(bad, [disk], median_ms=0) as tiers:
        tiers.schedule(0)
        tiers.drain()
        assert 0 not in disk.held and not (cache / cache_key(info)).exists()
        assert disk.driver.counters.snapshot()["links"] == 0
        assert not [p for p in (cache / ".landing").iterdir()]  # ended all the same


def test_adopt_takes_only_the_file_it_was_given(tmp_path: Path) -> None:
    driver = PosixDriver(tmp_path / "tier")
    source = tmp_path / "landed"
    source.write_bytes(b"checked bytes")
    fd = os.open(source, os.O_RDONLY)
    try:
        # The name now holds another file (a new fetch began): nothing is linked.
        source.unlink()
        source.write_bytes(b"a new fetch, half written")
        assert not driver.adopt("x", source, fd)
        assert not (tmp_path / "tier" / "x").exists()
        assert not [p for p in (tmp_path / "tier").iterdir()]  # no temporary left either
    finally:
        os.close(fd)
    fd = os.open(source, os.O_RDONLY)
    try:
        assert driver.adopt("x", source, fd)
        assert driver.read("x") == b"a new fetch, half written"
        with pytest.raises(ReadOnlyError):
            PosixDriver(tmp_path / "tier", read_only=True).adopt("y", source, fd)
    finally:
        os.close(fd)


def test_where_no_link_can_be_made_the_bytes_are_written(
    store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cross_device(src: object, dst: object, **at: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr("tierfeed.storage.posix.os.link", cross_device)
    cache = tmp_path / "cache"
    disk = disk_tier(cache, 10**9)
    with slow_stack(store_dir, [disk], median_ms=0) as tiers:
        tiers.schedule(0)
        tiers.drain()
        info = tiers.chunks[0]
        ops = disk.driver.counters.snapshot()
        assert ops["links"] == 0 and ops["bytes_written"] == info.size
        assert (cache / cache_key(info)).read_bytes() == (store_dir / info.name).read_bytes()


def test_in_flight_names_the_copies_landing_on_the_host(store_dir: Path, tmp_path: Path) -> None:
    infos = Index(store_dir).chunks()
    (tmp_path / "tier").mkdir()
    for landing in (FileLanding(tmp_path / "tier"), MemoryLanding()):
        assert landing.in_flight() == set()
        first, second = landing.begin(infos[0], PIECE), landing.begin(infos[1], PIECE)
        if isinstance(landing, FileLanding):  # stray names in the directory are not copies
            (landing.dir / "notes.map").write_bytes(b"x")
            (landing.dir / ".00000002-0123456789abcdef.map.tmp").write_bytes(b"x")
            (landing.dir / "00000003-0123456789abcdef.map").write_bytes(b"short")
            crashed = landing.begin(infos[2], PIECE)  # its fetcher killed: nothing lands
            _rewrite_owner(landing.dir, infos[2], _exited_pid())
            crashed.close()
        want = {(infos[0].id, infos[0].checksum), (infos[1].id, infos[1].checksum)}
        assert landing.in_flight() == want
        landing.end(first)
        assert landing.in_flight() == {(infos[1].id, infos[1].checksum)}
        landing.end(second)
        assert landing.in_flight() == set()


def test_a_copy_landing_for_a_sibling_takes_room_in_the_shared_tier(
    store_dir: Path, tmp_path: Path
) -> None:
    # Two stacks over one directory stand for two DataLoader workers of a host. The tier has
    # room for one chunk: while the first worker's copy of chunk 0 lands, the second does not
    # start a copy of chunk 1 (both would land; one would be evicted, its bytes read for
    # nothing), neither by a read's demand nor by a clairvoyant prefetch.
    cache = tmp_path / "cache"
    sizes = [c.size for c in Index(store_dir).chunks()]
    quota = max(sizes[0], sizes[1]) + 1
    with (
        slow_stack(store_dir, [disk_tier(cache, quota)], median_ms=400) as first,
        TierStack(
            Index(store_dir).chunks(),
            PosixDriver(store_dir, read_only=True),
            [disk_tier(cache, quota)],
            policy="clairvoyant",
            options=TierOptions(piece_bytes=PIECE),
        ) as second,
    ):
        assert second.filler.copies.needed(1)  # nothing held, nothing landing: room for it
        assert first.schedule(0)
        until(lambda: first.filler.landing.find(first.chunks[0]) is not None)
        assert not second.filler.copies.needed(1)
        second.holdings.ask_again()
        second.set_future([0, 1] * 25)  # its prefetch copies nothing while chunk 0 lands
        second.drain()
        assert second.stats()["fetch"]["pieces"] == 0 and 1 not in second.tiers[0].held
        first.drain()
        assert 0 in first.tiers[0].held
        time.sleep(0.15)  # past the sibling's view of the directory
        second.holdings.ask_again()
        assert not second.filler.copies.needed(1)  # placed now: held, still no room


def test_the_future_told_starts_the_first_chunks_a_host_can_copy_at_once(
    store_dir: Path,
) -> None:
    # One copy thread: the future's first look reaches the first two chunks read (twice the
    # copy threads: a sibling process's threads take what this one's cannot start yet), even
    # where the second is first read after many reads of the first, as the small last chunk
    # of an object store's few large ones is; the third is left to the look-ahead.
    assert len(Index(store_dir).chunks()) >= 3
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    options = TierOptions(threads=1, piece_bytes=PIECE)
    origin = PosixDriver(store_dir, read_only=True)
    chunks = Index(store_dir).chunks()
    with TierStack(chunks, origin, [ram], policy="clairvoyant", options=options) as tiers:
        tiers.set_future([0] * 100 + [1] * 10 + [0] * 100 + [2] * 10)
        tiers.drain()
        assert sorted(ram.held) == [0, 1]


def _exited_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _rewrite_owner(directory: Path, info: ChunkInfo, pid: int) -> None:
    """Make the map of ``info``'s arrival name ``pid`` as its fetcher."""
    from tierfeed.storage.filelanding import _HEADER

    path = directory / f"{info.id:08d}-{info.checksum:016x}.map"
    raw = bytearray(path.read_bytes())
    magic, _, piece, size = _HEADER.unpack_from(raw)
    raw[: _HEADER.size] = _HEADER.pack(magic, pid, piece, size)
    path.write_bytes(bytes(raw))


class CountingReads(PosixDriver):
    """A disk tier's driver that counts whole-file reads (what checking a copy costs)."""

    whole: int = 0

    def read(self, path: str) -> bytes:
        self.whole += 1
        time.sleep(0.05)  # a large chunk: the other readers come while it is read
        return super().read(path)


def test_readers_of_an_unchecked_copy_wait_for_one_check(store_dir: Path, tmp_path: Path) -> None:
    # A copy in the directory that no process has marked checked (placed by an older
    # tierfeed, say): it is read whole and checked once in this process, not once per reader.
    cache = tmp_path / "cache"
    cache.mkdir()
    info = Index(store_dir).chunk(0)
    shutil.copy(store_dir / info.name, cache / cache_key(info))
    driver = CountingReads(cache)
    with slow_stack(store_dir, [Tier(driver, 10**9, name="disk")], median_ms=0) as tiers:
        want = (store_dir / info.name).read_bytes()
        got: list[bytes] = []
        threads = [
            threading.Thread(target=lambda k=k: got.append(tiers.read_range(0, 97 * k, 50)))
            for k in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == sorted(want[97 * k : 97 * k + 50] for k in range(8))
        assert driver.whole == 1
        assert tiers.origin.counters.snapshot()["reads"] == 0


def test_threads_listing_arrivals_at_once_each_see_them_all(tmp_path: Path) -> None:
    # The copy threads and readers of a worker ask which arrivals are in flight at the same
    # moment. Listed through one shared directory descriptor (whose duplicates share its
    # offset), each saw part of them: two DataLoader workers then copied one chunk twice
    # (1.05-1.12x the store from the origin in 1 run of 6, tests/torch/test_half_cache_workers).
    landing = FileLanding(tmp_path)
    arrivals = [
        landing.begin(ChunkInfo(i, f"chunks/{i:06d}.tar", 4096, i + 1), 1024) for i in range(300)
    ]
    want = landing.in_flight()
    assert len(want) == 300
    seen: list[set[tuple[int, int]]] = []

    def look() -> None:
        for _ in range(40):
            seen.append(landing.in_flight())

    threads = [threading.Thread(target=look) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(seen) == 160 and all(s == want for s in seen)
    for arrival in arrivals:
        landing.end(arrival)


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_piece_lands_from_the_buffers_it_arrived_in(where: str, tmp_path: Path) -> None:
    """A copy's piece as its client handed it over (`Driver.read_parts`): several buffers, of
    any kind with the buffer protocol, written as they are (a file: one pwritev), in order, and
    no more of them than the piece holds."""
    from tierfeed.format.chunkref import checksum_bytes

    data = os.urandom(3 * 4096 + 100)
    info = ChunkInfo(0, "chunks/000000.tar", len(data), checksum_bytes(data))
    landing = FileLanding(tmp_path) if where == "file" else MemoryLanding()
    arrival = landing.begin(info, 4096)
    first = data[:4096]
    arrival.put(0, [memoryview(bytearray(first[:1000])), first[1000:3000], first[3000:] + b"x"])
    arrival.put(1, [bytearray(data[4096:8192])])
    arrival.put(2, data[8192:12288])
    arrival.put(3, [data[12288:12300], data[12300:] + b"past the end"])
    assert arrival.complete() and arrival.whole() == data
    assert arrival.digest() == (len(data), info.checksum)
    arrival.close()
