"""TierFiles and SharedDirectory: the one object per tier that TierStack calls."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from tierfeed.errors import NotFoundError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.storage.disktier import SharedDirectory, Tier, TierFiles, cache_key, disk_tier
from tierfeed.storage.memory import MemoryDriver
from tierfeed.storage.posix import PosixDriver

DATA = os.urandom(5000)
INFO = ChunkInfo(3, "chunks/000003.tar", len(DATA), checksum_bytes(DATA))
KEY = cache_key(INFO)


def test_a_ram_tier_gets_the_trivial_files() -> None:
    ram = Tier(MemoryDriver(), 10**6, name="ram")
    files = ram.files
    assert type(files) is TierFiles and not ram.shared and ram.directory is None
    with files.claim(KEY) as mine, files.placing():
        assert mine
    ram.driver.write(KEY, DATA)
    files.mark(KEY)
    assert files.usable(INFO) and files.where(KEY) == KEY
    assert files.scan({KEY: INFO, "other": INFO}) == {3: len(DATA)}
    files.evict(KEY)
    files.evict(KEY)  # gone already: fine
    assert files.scan({KEY: INFO}) == {}
    assert files.sweep() == 0


def test_a_disk_tier_shares_its_directory(tmp_path: Path) -> None:
    disk = disk_tier(tmp_path / "cache", 10**6)
    files = disk.files
    assert isinstance(files, SharedDirectory) and disk.shared
    assert disk.directory == tmp_path / "cache"
    assert files.where(KEY) == str(tmp_path / "cache" / KEY)


def test_a_disk_tier_scans_its_own_directory_not_its_folders(tmp_path: Path) -> None:
    """A shared tier's scan (made under the host's placement lock) lists the directory its
    keys are names in, once: what the driver's walk of every folder found, the claims,
    marks, landings and temporaries beside them left out, and a directory by a key's name."""
    other = ChunkInfo(4, "chunks/000004.tar", 7, 1)
    files = SharedDirectory(PosixDriver(tmp_path), tmp_path)
    files.driver.write(KEY, DATA)
    with files.claim(cache_key(other)):
        files.mark(KEY)
        for folder in (".landing", ".elsewhere"):
            (tmp_path / folder).mkdir(exist_ok=True)
            (tmp_path / folder / cache_key(other)).write_bytes(b"x" * 7)  # not held
        (tmp_path / f".tmp.1.{cache_key(other)}").write_bytes(b"x")
        (tmp_path / cache_key(other)).mkdir()  # a directory by a key's name: not a copy
        catalog = {KEY: INFO, cache_key(other): other}
        walked = {catalog[p].id: catalog[p].size for p in files.driver.list() if p in catalog}
        assert files.scan(catalog) == walked == {3: len(DATA)}


def test_claims_exclude_other_holders(tmp_path: Path) -> None:
    a = SharedDirectory(PosixDriver(tmp_path), tmp_path)
    b = SharedDirectory(PosixDriver(tmp_path), tmp_path)
    with a.claim(KEY) as first:
        assert first
        with b.claim(KEY) as second:
            assert not second
    with b.claim(KEY) as again:
        assert again  # released with the holder's context
    with a.placing():  # the placement lock can be taken and given back
        pass
    assert (tmp_path / ".tier.lock").exists()


def test_usable_checks_once_then_trusts_the_mark(tmp_path: Path) -> None:
    files = SharedDirectory(PosixDriver(tmp_path), tmp_path)
    files.driver.write(KEY, DATA)
    assert files.usable(INFO)  # read and checksummed, then marked
    assert (tmp_path / ".verified" / KEY).exists()
    reads = files.driver.counters.snapshot()["reads"]
    assert files.usable(INFO)
    assert files.driver.counters.snapshot()["reads"] == reads  # the mark spared the read


def test_usable_refuses_a_changed_or_missing_file(tmp_path: Path) -> None:
    files = SharedDirectory(PosixDriver(tmp_path), tmp_path)
    files.driver.write(KEY, DATA)
    files.mark(KEY)
    damaged = bytearray(DATA)
    damaged[10] ^= 1
    files.driver.write(KEY, bytes(damaged))  # a new file: the mark no longer fits
    assert not files.usable(INFO)
    files.evict(KEY)
    assert not (tmp_path / ".verified" / KEY).exists()
    with pytest.raises(NotFoundError):
        files.usable(INFO)


def test_sweep_removes_temporaries_of_dead_processes(tmp_path: Path) -> None:
    files = SharedDirectory(PosixDriver(tmp_path), tmp_path)
    (tmp_path / f".tmp.{2**22 + 12345}.{KEY}").write_bytes(b"partial")
    assert files.sweep() == 1
    assert files.scan({KEY: INFO}) == {}


def test_tier_counters_snapshot_and_pickle() -> None:
    ram = Tier(MemoryDriver(), 10**6, name="ram")
    ram.counters.add(hits=2, copy_s=0.5)
    assert ram.counters.snapshot()["hits"] == 2
    again = pickle.loads(pickle.dumps(ram.counters))
    assert again == ram.counters
    again.add(hits=1)
    assert again.hits == 3


def test_an_origins_linked_file_is_read_through_its_link_a_caches_is_not(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.tar"
    elsewhere.write_bytes(DATA)
    store, cache = tmp_path / "store", tmp_path / "cache"
    store.mkdir()
    (store / "linked.tar").symlink_to(elsewhere)
    origin = PosixDriver(store, read_only=True)  # a store of linked chunks is a store
    assert origin.size("linked.tar") == len(DATA) and origin.read("linked.tar") == DATA
    tier = disk_tier(cache, 10**6)
    (cache / "linked.tar").symlink_to(elsewhere)  # only its owner can plant one: still refused
    with pytest.raises(OSError):
        tier.driver.read("linked.tar")
    tier.driver.write("linked.tar", b"replaced")  # the link is replaced, not written through
    assert elsewhere.read_bytes() == DATA and (cache / "linked.tar").read_bytes() == b"replaced"


def test_every_read_of_a_cache_names_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reads of a cache go relative to its checked directory: a read a file system refuses
    # with O_DIRECT (unaligned) is made again by opening the file anew, which by a bare
    # relative path would open whatever the working directory holds there. A read running
    # past the end of the file is read on (the retry policy's path): it names it too.
    from tierfeed.storage import posix

    seen: list[int | None] = []
    real = posix.pread

    def spy(
        fd: int, path: str, length: int, offset: int, flags: int, dir_fd: int | None = None
    ) -> bytes:
        seen.append(dir_fd)
        return real(fd, path, length, offset, flags, dir_fd)

    monkeypatch.setattr(posix, "pread", spy)
    cache = PosixDriver(tmp_path / "cache", read_only=False)
    cache.write("c.bin", b"cached" * 1000)
    assert cache.read_block("c.bin", 5001, 4096) == (b"cached" * 1000)[5001:]
    assert cache.read_range("c.bin", 5001, 4096) == (b"cached" * 1000)[5001:]
    assert len(seen) >= 4 and all(d is not None and d >= 0 for d in seen), seen
    cache.close()
