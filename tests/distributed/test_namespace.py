"""The namespace driver: any range of a chunk held whole, ranges inside one member otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.ranks import make_store
from tierfeed.distributed.inbox import Inbox, mark_punched, punch_holes
from tierfeed.distributed.namespace import NamespaceDriver
from tierfeed.errors import ExchangeError, NotFoundError, ReadOnlyError
from tierfeed.format.index import Index
from tierfeed.storage import MemoryDriver, Tier, TierStack

pytestmark = pytest.mark.timeout(60)
N = 48


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    with Index(make_store(tmp_path, N)) as ix:
        yield ix


def members_of(index: Index, chunk: int) -> np.ndarray:
    return np.flatnonzero(np.asarray(index.member_chunk) == chunk)


def file_bytes(index: Index, chunk: int) -> bytes:
    return (index.path.parent / index.chunk_name(chunk)).read_bytes()


def driver(index: Index, tmp: Path, local: list[bool], **kw: object) -> NamespaceDriver:
    kw.setdefault("punched", tmp / "punched")
    return NamespaceDriver(index, np.asarray(local), tmp / "inbox", timeout_s=0.2, **kw)  # type: ignore[arg-type]


def test_a_chunk_held_whole_serves_any_range(index: Index, tmp_path: Path) -> None:
    n = index.num_chunks
    with driver(index, tmp_path, [True] + [False] * (n - 1)) as ns:
        name, whole = index.chunk_name(0), file_bytes(index, 0)
        assert ns.size(name) == len(whole)
        assert ns.read(name) == whole  # headers and several members in one range
        assert ns.read_range(name, 3, 700) == whole[3:703]
        assert ns.list() == [name]
        with pytest.raises(ReadOnlyError):
            ns.write(name, b"x")


def test_a_chunk_held_in_part_serves_ranges_inside_a_member(index: Index, tmp_path: Path) -> None:
    chunk, name = 1, index.chunk_name(1)
    member = int(members_of(index, chunk)[0])
    offset, length = int(index.member_offset[member]), int(index.member_length[member])
    data = file_bytes(index, chunk)[offset : offset + length]
    Inbox(tmp_path / "inbox").write(
        "e00000-w000000", np.asarray([member]), np.asarray([length]), memoryview(data)
    )
    with driver(index, tmp_path, [False] * index.num_chunks) as ns:
        assert ns.read_range(name, offset, length) == data
        assert ns.read_range(name, offset + 2, 5) == data[2:7]  # a range inside the member
        with pytest.raises(NotFoundError, match=rf"bytes 0\.\.{offset + length} of chunk {name}"):
            ns.read_range(name, 0, offset + length)  # a header too: never wrong bytes
        with pytest.raises(NotFoundError, match="not held whole"):
            ns.size(name)  # so a tier never copies it
        assert ns.list() == []
        other = int(members_of(index, 2)[0])
        with pytest.raises(ExchangeError, match="has not arrived"):
            ns.read_range(index.chunk_name(2), int(index.member_offset[other]), 4)


def test_a_failed_exchange_fails_a_waiting_read_at_once(index: Index, tmp_path: Path) -> None:
    Inbox(tmp_path / "inbox").fail("rank 1 of 2: exchange of epoch 0, window 3 failed: boom")
    member = int(members_of(index, 2)[0])
    ns = driver(index, tmp_path, [False] * index.num_chunks)
    with ns, pytest.raises(ExchangeError, match="window 3"):
        ns.read_range(index.chunk_name(2), int(index.member_offset[member]), 4)


def test_a_punched_chunk_is_no_longer_whole(index: Index, tmp_path: Path) -> None:
    chunk, name = 0, index.chunk_name(0)
    sent, kept = (int(m) for m in members_of(index, chunk)[:2])
    with driver(index, tmp_path, [True] * index.num_chunks, verify_local=True) as ns:
        assert ns.size(name) > 0
        assert ns.read_range(name, 0, 4096) == file_bytes(index, chunk)[:4096]  # a tier's piece
        path = index.path.parent / name
        span = (int(index.member_offset[sent]), int(index.member_length[sent]))
        mark_punched(tmp_path / "punched", chunk)  # what the exchanger does before punching
        if punch_holes(path, [span]) == 0:
            pytest.skip("this file system cannot punch holes")
        with pytest.raises(NotFoundError, match="not on this node whole"):
            ns.read_range(name, 0, 4096)  # marked: no piece of it is taken for whole
        with pytest.raises(NotFoundError, match="not held whole"):
            ns.read(name)
        with pytest.raises(NotFoundError):
            ns.size(name)  # and from now on it is known to be held in part
        offset, length = int(index.member_offset[kept]), int(index.member_length[kept])
        assert ns.read_range(name, offset, length) == file_bytes(index, chunk)[offset:][:length]
        with pytest.raises(ExchangeError, match="has not arrived"):
            ns.read_range(name, *span)  # punched out: waits for it to come back


def test_an_unmarked_punched_chunk_is_never_served_whole(index: Index, tmp_path: Path) -> None:
    """A punch no mark announced (a killed exchanger between the two): a whole read fails its
    checksum, and a tier's copy by pieces fails the whole check before it is placed."""
    chunk, name = 0, index.chunk_name(0)
    sent = int(members_of(index, chunk)[0])
    span = (int(index.member_offset[sent]), int(index.member_length[sent]))
    path = index.path.parent / name
    if punch_holes(path, [span]) == 0:
        pytest.skip("this file system cannot punch holes")
    with driver(index, tmp_path, [True] * index.num_chunks, verify_local=True) as ns:
        with pytest.raises(NotFoundError, match="not on this node whole"):
            ns.read(name)
        ns._punched.clear()  # forget what the whole read taught it: pieces only, as a tier
        tier = Tier(MemoryDriver(), 2**22, name="ram")
        with TierStack(index.chunks(), ns, [tier]) as stack:
            stack.schedule(chunk)
            stack.drain(10)
            assert stack.stats()["ram"]["held_bytes"] == 0  # nothing placed


def test_a_partition_plans_tier_copies_unpunched_chunks(index: Index, tmp_path: Path) -> None:
    origin = driver(index, tmp_path, [True] * index.num_chunks, verify_local=True)
    with TierStack(index.chunks(), origin, [Tier(MemoryDriver(), 2**22, name="ram")]) as stack:
        assert stack.schedule(0) is True
        stack.drain(10)
        assert stack.stats()["ram"]["held_bytes"] == index.chunks()[0].size
        mark_punched(tmp_path / "punched", 1)
        assert stack.schedule(1) is False  # marked punched: the tier does not try


def test_a_tier_copies_only_whole_chunks(index: Index, tmp_path: Path) -> None:
    local = [c % 2 == 0 for c in range(index.num_chunks)]
    origin = driver(index, tmp_path, local)
    with TierStack(index.chunks(), origin, [Tier(MemoryDriver(), 2**22, name="ram")]) as stack:
        inbox = Inbox(tmp_path / "inbox")
        member = int(members_of(index, 1)[0])
        offset, length = int(index.member_offset[member]), int(index.member_length[member])
        data = file_bytes(index, 1)[offset : offset + length]
        inbox.write("e00000-w000000", np.asarray([member]), np.asarray([length]), memoryview(data))
        assert stack.schedule(0) is True
        assert stack.schedule(1) is False  # held in part: the driver says so, nothing queued
        stack.drain(10)
        assert stack.read_range(1, offset, length) == data
        stats = stack.stats()
        assert stats["ram"]["copies"] == 1 and stats["ram"]["held_bytes"] == index.chunks()[0].size
        assert stats["ram"]["corrupt_dropped"] == 0
        assert stats["origin"]["copy_failures"] == 0  # the part-held chunk was never tried
        whole = file_bytes(index, 0)
        assert stack.read_range(0, 10, 100) == whole[10:110]
        assert stack.stats()["ram"]["hits"] == 1


def test_the_moved_dataset_method_names_its_new_place() -> None:
    from tierfeed.distributed.job import Namespace
    from tierfeed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tierfeed\.torch\.job_dataset\(ns"):
        Namespace.dataset(object.__new__(Namespace), batch_size=4)
