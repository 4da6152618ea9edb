"""The tier stack under damage and contention: rotted cache copies, racing threads, failing
copies, a cache directory that exists with the wrong mode, a cache disk that fills up."""

from __future__ import annotations

import os
import random
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.hostile.edits import flip
from tierfeed.errors import ChunkCorruptError, StorageError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions
from tierfeed.storage import (
    DirectoryChunks,
    MemoryDriver,
    PosixDriver,
    Tier,
    TierOptions,
    TierStack,
    disk_tier,
)
from tierfeed.storage.store import Store
from tierfeed.storage.tiers import cache_key

FILES = {f"c{i % 3}/s{i:03d}.bin".encode(): bytes([i % 251]) * (700 + 37 * i) for i in range(90)}


@pytest.fixture
def store_dir(packed: Callable[..., Path]) -> Path:
    return packed(FILES)


def tiered(store_dir: Path, cache: Path, policy: str = "fill-top") -> Store:
    index = Index(store_dir)
    origin = PosixDriver(store_dir, read_only=True)
    stack = TierStack(index.chunks(), origin, [disk_tier(cache, 2**30)], policy)
    return Store(index, stack)


def expected(store: Store, sample: int) -> bytes:
    return FILES[store.index.key_bytes(sample) + b".bin"]


def first_member(store_dir: Path, chunk: int) -> tuple[ChunkInfo, int, int]:
    """(the chunk, the data offset of its first member, the sample owning that member)."""
    with Index(store_dir) as ix:
        member = next(m for m in range(ix.num_members) if int(ix.member_chunk[m]) == chunk)
        return ix.chunk(chunk), int(ix.member_offset[member]), ix.member_owner(member)


def fill_cache(store_dir: Path, cache: Path) -> None:
    with tiered(store_dir, cache) as store:
        for s in range(len(store)):
            store.read_sample(s)
        store.source.drain()  # type: ignore[attr-defined]


def read_all_dropping_a_bad_copy(store_dir: Path, cache: Path) -> None:
    """Every sample read right through a tier stack over ``cache``, which drops a bad copy."""
    with tiered(store_dir, cache) as store:
        for s in range(len(store)):
            assert store.read_sample(s).fields["bin"] == expected(store, s)
        stack = store.source
        assert isinstance(stack, TierStack)
        assert stack.stats()[stack.tiers[0].name]["corrupt_dropped"] >= 1
        stack.drain()


@pytest.mark.timeout(60)
def test_rotted_disk_copy_is_dropped_and_refetched(store_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fill_cache(store_dir, cache)
    info, offset, _ = first_member(store_dir, 0)
    flip(cache / cache_key(info), offset + 3, keep_mtime=True)

    # A later run (a new process would see the same): the cached copy is marked verified.
    read_all_dropping_a_bad_copy(store_dir, cache)
    # The bad copy is gone for good: the copy there now is whole and verified.
    data = (cache / cache_key(info)).read_bytes()
    assert data == (store_dir / info.name).read_bytes()


@pytest.mark.timeout(60)
def test_bad_cache_and_bad_origin_names_both(store_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fill_cache(store_dir, cache)
    info, offset, sample = first_member(store_dir, 0)
    flip(cache / cache_key(info), offset, keep_mtime=True)
    flip(store_dir / info.name, offset)  # the test damages its own origin on purpose
    with tiered(store_dir, cache) as store, pytest.raises(ChunkCorruptError) as err:
        store.read_sample(sample)
    message = str(err.value)
    assert cache_key(info) in message  # the cached copy that was bad (and dropped)
    assert str(store_dir / info.name) in message  # and the origin, bad as well
    assert not (cache / cache_key(info)).exists()


class BadCopyThenBadOrigin(DirectoryChunks):
    """A cached copy serves altered bytes; once it is dropped, the origin's copy turns out bad
    too, as a tier stack reports it when the copy that replaces it fails its check first."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.dropped = False

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        if self.dropped:
            raise ChunkCorruptError(f"chunk {self.chunks[chunk].name} at the origin is bad")
        data = bytearray(super().read_range(chunk, offset, length))
        data[0] ^= 0xFF  # not what was packed
        return bytes(data)

    def discard(self, chunk: int) -> str | None:
        self.dropped = True
        return "copy /cache/00000000-x.tar of tier disk"


@pytest.mark.timeout(60)
def test_a_bad_origin_found_after_dropping_a_bad_copy_names_both(store_dir: Path) -> None:
    index = Index(store_dir)
    member = next(m for m in range(index.num_members) if int(index.member_length[m]) > 0)
    source = BadCopyThenBadOrigin(store_dir, index.chunks(), index.path)
    chunk = int(index.member_chunk[member])
    with Store(index, source) as store, pytest.raises(ChunkCorruptError) as err:
        store.read_member(member)
    message = str(err.value)
    assert "/cache/00000000-x.tar" in message  # the cached copy that was bad (and dropped)
    assert str(store_dir / index.chunk(chunk).name) in message  # and the origin, bad as well


@pytest.mark.timeout(60)
def test_bad_origin_is_blamed_as_origin(store_dir: Path) -> None:
    info, offset, sample = first_member(store_dir, 1)
    flip(store_dir / info.name, offset)
    index = Index(store_dir)
    origin = DirectoryChunks(store_dir, index.chunks(), index.path)
    with Store(index, origin) as store, pytest.raises(ChunkCorruptError) as err:
        store.read_sample(sample)
    assert str(store_dir / info.name) in str(err.value)


class FlakyRam(MemoryDriver):
    """A RAM tier whose first writes fail with errors no driver documents."""

    def __init__(self, budget: int, failures: int) -> None:
        super().__init__(budget)
        self.failures = failures

    def _write(self, path: str, data: bytes) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ValueError("injected: not a StorageError")
        super()._write(path, data)


@pytest.mark.timeout(60)
def test_copy_threads_survive_any_error_and_count_it(store_dir: Path) -> None:
    index = Index(store_dir)
    origin = PosixDriver(store_dir, read_only=True)
    ram = Tier(FlakyRam(2**30, failures=3), 2**30, name="ram")
    options = TierOptions(threads=2)
    with Store(index, TierStack(index.chunks(), origin, [ram], "fill-top", options)) as store:
        stack = store.source
        assert isinstance(stack, TierStack)
        for _ in range(3):  # misses until every chunk got copied (3 copies fail first)
            for s in range(len(store)):
                assert store.read_sample(s).fields["bin"] == expected(store, s)
            stack.drain()
        assert all(t.is_alive() for t in stack.filler.copier.threads)
        stats = stack.stats()
        assert stats["ram"]["copy_failures"] == 3
        assert set(ram.held) == set(range(index.num_chunks))


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads often, so that races show within a test's seconds."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("policy", ["lru", "clairvoyant", "fill-top"])
def test_racing_readers_and_copies(
    packed: Callable[..., Path], policy: str, fast_switching: None
) -> None:
    """Reader threads record accesses while copy threads choose victims: no lost thread,
    no error, every read correct, and the quota holds."""
    store_dir = packed(FILES, PackOptions(chunk_size=4096, workers=2, progress=False))
    index = Index(store_dir)
    chunks = index.chunks()
    quota = 2 * max(c.size for c in chunks)
    origin = PosixDriver(store_dir, read_only=True)
    ram = Tier(MemoryDriver(quota), quota, name="ram")
    stack = TierStack(chunks, origin, [ram], policy, TierOptions(threads=4))
    store = Store(index, stack)
    if policy == "clairvoyant":
        rng0 = random.Random(1)
        stack.set_future([rng0.randrange(len(chunks)) for _ in range(20000)])
    errors: list[BaseException] = []
    stop = time.monotonic() + 2.0

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while time.monotonic() < stop:
                s = rng.randrange(len(store))
                assert store.read_sample(s).fields["bin"] == expected(store, s)
                if rng.random() < 0.05:
                    stack.prefetch()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert all(t.is_alive() for t in stack.filler.copier.threads)
        assert stack.stats()["ram"]["copy_failures"] == 0
        assert sum(ram.held.values()) <= quota
        assert ram.driver.used <= quota  # type: ignore[attr-defined]
    finally:
        store.close()


def test_existing_cache_dir_keeps_its_mode_and_its_files_are_private(tmp_path: Path) -> None:
    # tierfeed never chmods a directory it did not create (tests/hostile/test_cache_dir.py);
    # a private tier's files are 0600 whatever the directory's mode.
    private, shared = tmp_path / "private", tmp_path / "shared"
    for d in (private, shared):
        d.mkdir(mode=0o755)
        d.chmod(0o755)
    disk_tier(private, 2**20).driver.write("x.tar", b"x")
    disk_tier(shared, 2**20, shared=True).driver.write("x.tar", b"x")
    assert stat.S_IMODE(private.stat().st_mode) == 0o755
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((private / "x.tar").stat().st_mode) == 0o600
    assert stat.S_IMODE((shared / "x.tar").stat().st_mode) == 0o644


def test_cache_dir_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cache"
    path.write_bytes(b"not a directory")
    for target in (path, path / "sub"):
        with pytest.raises(StorageError) as err:
            disk_tier(target, 2**20)
        assert str(target) in str(err.value)
    assert path.read_bytes() == b"not a directory"


@pytest.mark.timeout(60)
def test_full_cache_disk_is_counted_and_reads_go_on(
    store_dir: Path, tmpfs: Callable[..., Path]
) -> None:
    tiny_disk = tmpfs("tiny", "size=64k")  # a cache disk that fills up at once
    before = {p: p.read_bytes() for p in store_dir.rglob("*") if p.is_file()}
    index = Index(store_dir)
    origin = PosixDriver(store_dir, read_only=True)
    tier = disk_tier(tiny_disk / "cache", 2**30)  # the quota allows what the disk does not
    with Store(index, TierStack(index.chunks(), origin, [tier], "fill-top")) as store:
        stack = store.source
        assert isinstance(stack, TierStack)
        for _ in range(2):
            for s in range(len(store)):
                assert store.read_sample(s).fields["bin"] == expected(store, s)
            stack.drain()
        assert stack.stats()[tier.name]["copy_failures"] >= 1
        assert all(t.is_alive() for t in stack.filler.copier.threads)
    assert not [p.name for p in (tiny_disk / "cache").iterdir() if p.name.startswith(".tmp.")]
    assert {p: p.read_bytes() for p in store_dir.rglob("*") if p.is_file()} == before


@pytest.mark.timeout(90)
def test_a_full_cache_disk_under_the_main_process_copies_loses_no_sample(
    store_dir: Path, tmpfs: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Loader's main process copies the opening chunks while its workers start
    # (`ColdStart`), into a disk that fills up at once: its failures are counted, the workers
    # read on, every sample comes once an epoch, and nothing half-written is kept.
    from tierfeed.torch import Dataset, Loader, TierConfig
    from tierfeed.torch import dataset as dataset_module

    freeze = dataset_module.freeze_inherited

    def late() -> None:  # each worker starts a second late: the main process copies first
        if dataset_module._frozen_in != os.getpid():
            time.sleep(1.0)
        freeze()

    monkeypatch.setattr(dataset_module, "freeze_inherited", late)

    tiny = tmpfs("tiny", "size=1m")
    filler = os.open(tiny / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # the store (~200 KB) fits the quota; the disk has ~16 KB left for it
        os.write(filler, b"\0" * (1008 * 1024))
    finally:
        os.close(filler)
    before = {p: p.read_bytes() for p in store_dir.rglob("*") if p.is_file()}
    tiers = TierConfig(disk_dir=str(tiny / "cache"), disk_bytes=2**19)
    ds = Dataset(store_dir, "global", batch_size=8, decode=lambda s: bytes(s.fields["bin"]),
                 tiers=tiers)  # fmt: skip
    wanted = sorted(FILES.values())
    with Loader(ds, num_workers=2) as loader:
        for _ in range(2):
            got = sorted(sample for batch in loader for sample in batch)
            assert got == wanted
        cold = loader._cold
        assert cold is not None and cold.stop() and cold.stats is not None
        tiers_seen = loader.last_epoch["tiers"]
    disk = f"disk:{tiny / 'cache'}"
    assert cold.stats[disk]["copy_failures"] >= 1  # the main process met the full disk
    assert tiers_seen[disk]["copy_failures"] > cold.stats[disk]["copy_failures"]  # workers too
    chunks = {cache_key(c): c for c in Index(store_dir).chunks()}
    for path in (tiny / "cache").iterdir():  # (claims and landings lie in dot-directories)
        if path.is_file() and path.name in chunks:  # a cache entry: whole and right, or absent
            info = chunks[path.name]
            assert path.read_bytes() == (store_dir / info.name).read_bytes(), path
    assert not [p for p in (tiny / "cache").rglob(".tmp.*")]
    assert {p: p.read_bytes() for p in store_dir.rglob("*") if p.is_file()} == before


@pytest.mark.timeout(60)
def test_an_origin_chunk_shorter_than_the_index_says_is_refused(
    store_dir: Path, tmp_path: Path
) -> None:
    # The copy reads its pieces past the page cache (`read_block`, aligned on this disk): a
    # chunk cut short behind the index's back ends in a tierfeed error naming it, never in a
    # short or zero-filled copy in the tier.
    info = Index(store_dir).chunk(1)
    path = store_dir / info.name
    path.write_bytes(path.read_bytes()[: info.size // 2])
    with Index(store_dir) as ix:
        last = max(s for s in range(ix.num_samples) if int(ix.sample_chunk[s]) == 1)
    cache = tmp_path / "cache"
    with tiered(store_dir, cache) as store:
        with pytest.raises(ChunkCorruptError, match=info.name):
            store.read_sample(last)  # its bytes lie past the cut
        store.source.drain()  # type: ignore[attr-defined]
        with pytest.raises(ChunkCorruptError, match=info.name):
            store.read_sample(last)
    assert not (cache / cache_key(info)).exists()


@pytest.mark.timeout(60)
def test_a_mark_made_for_a_copy_that_never_arrived_vouches_for_no_other_file(
    store_dir: Path, tmp_path: Path
) -> None:
    # A copy is marked checked just before it is linked in; a process killed in between leaves
    # a mark naming a file that is not at the key. A file put there later (rotted, planted) is
    # checked all the same, and dropped.
    from tierfeed.storage.shared_dir import mark

    cache = tmp_path / "cache"
    fill_cache(store_dir, cache)
    info, offset, _ = first_member(store_dir, 0)
    elsewhere = tmp_path / "landed-but-never-linked"
    elsewhere.write_bytes((store_dir / info.name).read_bytes())
    fd = os.open(elsewhere, os.O_RDONLY)
    try:
        mark(cache, cache_key(info), fd)  # the early mark of the copy that never arrived
    finally:
        os.close(fd)
    flip(cache / cache_key(info), offset + 3, keep_mtime=True)
    read_all_dropping_a_bad_copy(store_dir, cache)
