"""One conformance suite that every driver passes, and one that every ChunkSource passes."""

from __future__ import annotations

import os
import random
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.chunk_sources import SOURCES, build_store
from tierfeed.errors import NotFoundError, ReadOnlyError, StorageError, TierfeedError
from tierfeed.format.index import Index
from tierfeed.storage import Driver
from tierfeed.storage.source import ChunkSource

pytestmark = pytest.mark.timeout(60)


def test_write_read_range_size(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    data = bytes(range(256)) * 40
    d.write("chunks/000001.tar", data)
    assert d.read("chunks/000001.tar") == data
    assert d.read_range("chunks/000001.tar", 1000, 300) == data[1000:1300]
    assert d.read_range("chunks/000001.tar", len(data) - 10, 100) == data[-10:]  # short at end
    assert d.size("chunks/000001.tar") == len(data)
    assert d.exists("chunks/000001.tar") and not d.exists("chunks/nope.tar")


def test_read_block_reads_what_read_range_does(make_driver: Callable[..., Driver]) -> None:
    # A copy's pieces: page-aligned and not (a chunk's last piece, pieces read as halves),
    # short where the object ends; every driver counts them as reads.
    d = make_driver()
    data = random.Random(5).randbytes(3 * 65536 + 1234)
    d.write("chunks/000002.tar", data)
    before = d.counters.snapshot()
    ranges = [(0, 65536), (65536, 131072), (131072, 70000), (4096, 5), (7, 4096), (196608, 9999)]
    for offset, length in ranges:
        assert d.read_block("chunks/000002.tar", offset, length) == data[offset : offset + length]
    after = d.counters.snapshot()
    assert after["reads"] - before["reads"] == len(ranges)
    want = sum(len(data[o : o + n]) for o, n in ranges)
    assert after["bytes_read"] - before["bytes_read"] == want
    with pytest.raises(NotFoundError):
        d.read_block("chunks/nope.tar", 0, 10)


def test_get_file_copies_an_object_whole(
    make_driver: Callable[..., Driver], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tierfeed.storage.driver as driver_module

    monkeypatch.setattr(driver_module, "GET_BLOCK", 1000)  # several ranged reads
    d = make_driver()
    data = bytes(range(256)) * 13
    d.write("chunks/000002.tar", data)
    ro = make_driver(read_only=True)  # a reader's driver: the origin is never written
    local = tmp_path / "local"
    local.mkdir()
    assert ro.get_file("chunks/000002.tar", local / "copy.tar") == len(data)
    assert (local / "copy.tar").read_bytes() == data
    assert [p.name for p in local.iterdir()] == ["copy.tar"]  # no temporary left


def test_overwrite_is_whole(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    d.write("a.bin", b"first version")
    d.write("a.bin", b"2nd")
    assert d.read("a.bin") == b"2nd"


def test_list_and_delete(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    for name in ("x/1.tar", "x/2.tar", "y/3.tar"):
        d.write(name, b"z")
    assert d.list() == ["x/1.tar", "x/2.tar", "y/3.tar"]
    assert d.list("x/") == ["x/1.tar", "x/2.tar"]
    d.delete("x/1.tar")
    assert d.list() == ["x/2.tar", "y/3.tar"]
    with pytest.raises(NotFoundError):
        d.delete("x/1.tar")


def test_missing_objects(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    with pytest.raises(NotFoundError, match=r"missing\.tar"):
        d.read("missing.tar")
    with pytest.raises(NotFoundError):
        d.size("missing.tar")
    with pytest.raises(FileNotFoundError):  # NotFoundError is also the builtin
        d.read_range("missing.tar", 0, 1)


def test_read_only_refuses_writes_and_deletes(make_driver: Callable[..., Driver]) -> None:
    make_driver().write("keep.tar", b"origin bytes")
    ro = make_driver(read_only=True)
    with pytest.raises(ReadOnlyError):
        ro.write("new.tar", b"x")
    with pytest.raises(ReadOnlyError):
        ro.delete("keep.tar")
    assert ro.read("keep.tar") == b"origin bytes"


def test_counters(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    d.write("c.tar", b"0123456789")
    d.read_range("c.tar", 2, 5)
    snap = d.counters.snapshot()
    assert snap["writes"] == 1 and snap["bytes_written"] == 10
    assert snap["reads"] >= 1 and snap["bytes_read"] >= 5


def test_paths_cannot_escape(make_driver: Callable[..., Driver]) -> None:
    d = make_driver()
    if type(d).__name__ == "MemoryDriver" or type(d).__name__ == "SlowDriver":
        return  # keys in a dict: no file system to escape
    for path in ("../escape.tar", "a/../../escape.tar", "/etc/escape.tar", "a\0b.tar", ""):
        with pytest.raises(StorageError):
            d.write(path, b"x")
        with pytest.raises(StorageError):
            d.read_range(path, 0, 1)


# --- ChunkSource conformance: every source in SOURCES serves the same bytes ---------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Index, list[bytes]]]:
    """The packed store's index and every chunk file's bytes, read straight from disk."""
    root = build_store(tmp_path_factory.mktemp("sources"))
    with Index(root) as index:
        chunks = [(root / info.name).read_bytes() for info in index.chunks()]
        sizes = [info.size for info in index.chunks()]
        assert len(chunks) >= 3 and [len(c) for c in chunks] == sizes
        yield index, chunks


@pytest.fixture(params=sorted(SOURCES))
def source(
    request: pytest.FixtureRequest, store: tuple[Index, list[bytes]], tmp_path: Path
) -> Iterator[ChunkSource]:
    made = SOURCES[request.param](store[0], tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_every_member_at_its_index_offset(
    source: ChunkSource, store: tuple[Index, list[bytes]]
) -> None:
    index, chunks = store
    for m in range(len(index.member_chunk)):
        c, off = int(index.member_chunk[m]), int(index.member_offset[m])
        length = int(index.member_length[m])
        assert source.read_range(c, off, length) == chunks[c][off : off + length], m


def edge_ranges(index: Index, chunk: int, size: int) -> list[tuple[int, int]]:
    """Offset 0, length 0, the last byte, the whole chunk, and from the first member's data to
    the last member's end (every tar header between them included)."""
    members = np.flatnonzero(index.member_chunk == chunk)
    first = int(index.member_offset[members[0]])
    last = int(index.member_offset[members[-1]] + index.member_length[members[-1]])
    return [(0, 0), (0, 1), (0, 512), (size - 1, 1), (size, 0), (0, size), (first, last - first)]


def test_edge_ranges(source: ChunkSource, store: tuple[Index, list[bytes]]) -> None:
    index, chunks = store
    for c, data in enumerate(chunks):
        for off, length in edge_ranges(index, c, len(data)):
            assert source.read_range(c, off, length) == data[off : off + length], (c, off, length)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # one source, many reads
)
@given(data=st.data())
def test_arbitrary_ranges(
    source: ChunkSource, store: tuple[Index, list[bytes]], data: st.DataObject
) -> None:
    _, chunks = store
    c = data.draw(st.integers(0, len(chunks) - 1), label="chunk")
    size = len(chunks[c])
    off = data.draw(st.integers(0, size), label="offset")
    length = data.draw(st.integers(0, size - off), label="length")
    assert source.read_range(c, off, length) == chunks[c][off : off + length]


def test_a_range_past_the_end_raises(source: ChunkSource, store: tuple[Index, list[bytes]]) -> None:
    _, chunks = store
    for c, data in enumerate(chunks):
        size = len(data)
        for off, length in ((size - 1, 2), (size, 1), (0, size + 1), (size + 100, 10)):
            with pytest.raises(TierfeedError):
                source.read_range(c, off, length)  # never a short read
    assert source.read_range(0, 0, 16) == chunks[0][:16]  # and the source still serves


def test_eight_threads_read_the_right_bytes(
    source: ChunkSource, store: tuple[Index, list[bytes]]
) -> None:
    _, chunks = store
    start = threading.Barrier(8)

    def reads(seed: int) -> int:
        rng = random.Random(seed)
        start.wait(timeout=10)
        for _ in range(200):
            c = rng.randrange(len(chunks))
            off = rng.randrange(len(chunks[c]) + 1)
            length = rng.randrange(len(chunks[c]) - off + 1)
            if source.read_range(c, off, length) != chunks[c][off : off + length]:
                return 1
        return 0

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(reads, range(8))) == 0


def _running(before: set[threading.Thread]) -> list[str]:
    """Names of the threads alive now that were not before."""
    return sorted(t.name for t in threading.enumerate() if t not in before)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_close_is_idempotent_and_ends_reads(
    name: str, store: tuple[Index, list[bytes]], tmp_path: Path
) -> None:
    """close() joins what the source started; a second close() is a no-op without error; a
    read after close() fails with a StorageError that names the chunk and says closed."""
    index, chunks = store
    before = set(threading.enumerate())
    source = SOURCES[name](index, tmp_path)
    try:
        for c, data in enumerate(chunks):  # every chunk read, and copied where a tier copies
            assert source.read_range(c, 0, len(data)) == data
        source.drain(timeout=30)
        source.close()
        assert _running(before) == []
        source.close()
        assert _running(before) == []
        for c, info in enumerate(index.chunks()):
            with pytest.raises(StorageError, match=rf"{re.escape(info.name)}: closed"):
                source.read_range(c, 0, 1)
    finally:
        source.close()


def test_capability_defaults_answer(source: ChunkSource, store: tuple[Index, list[bytes]]) -> None:
    index, chunks = store
    every = list(range(len(chunks)))
    assert isinstance(source.uses_future, bool)
    source.begin_epoch()
    source.open_ahead(every)
    source.set_future(np.asarray(index.member_chunk, dtype=np.int64), read_bytes=1000.0)
    assert isinstance(source.prefetch(), int)
    assert isinstance(source.schedule(0), bool)
    source.drain(timeout=30)
    assert isinstance(source.stats(), dict)
    dropped = source.discard(0)
    assert dropped is None or isinstance(dropped, str)
    for c in every:  # every chunk still served, whatever the hints did
        assert source.read_range(c, 0, len(chunks[c])) == chunks[c]


def test_direct_reads_on_a_disk_that_wants_them_aligned(tmp_path: Path) -> None:
    # ext4 and the like refuse an O_DIRECT read into an unaligned buffer (EINVAL): an aligned
    # offset is read again into an aligned buffer, past the page cache (never reopened: a
    # path that does not exist proves it); any other falls back to the page cache.
    from tierfeed.pread import pread

    path = tmp_path / "chunk.tar"
    data = random.Random(9).randbytes(200_000)
    path.write_bytes(data)
    flags = os.O_RDONLY | os.O_DIRECT
    try:
        fd = os.open(path, flags)
    except OSError:
        pytest.skip("this file system refuses O_DIRECT opens (reads use the page cache)")
    try:
        nowhere = str(tmp_path / "not-there")
        assert pread(fd, nowhere, 65536, 65536, flags) == data[65536:131072]
        assert pread(fd, nowhere, 70000, 131072, flags) == data[131072:]  # short at the end
        assert pread(fd, str(path), 100, 4097, flags) == data[4097:4197]  # unaligned: cached
    finally:
        os.close(fd)
