"""Partitions balanced to the sample: stage-in copies each rank's part of a chunk cut between
partitions (checked member by member), and the namespace serves it; damaged input never is."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.ranks import make_store
from tierfeed.distributed import stage
from tierfeed.distributed.holders import SPLIT, SampleHolders
from tierfeed.distributed.inbox import parts_dir
from tierfeed.distributed.namespace import NamespaceDriver, inbox_dir
from tierfeed.errors import ChunkCorruptError, ExchangeError
from tierfeed.format.index import Index
from tierfeed.loader.compose import TierConfig, plan_for, tier_stack
from tierfeed.storage.store import Store
from tierfeed.world import World

pytestmark = pytest.mark.timeout(60)
M = 4


def world(rank: int, per_node: int = 2) -> World:
    return World(rank, M, rank % per_node, per_node)


ONE = world(1, per_node=1)  # rank 1 alone on its node (its part of chunk 2 has 6 samples)


def stage_all(store: Path, to: str, plan: str, per_node: int = 2) -> list[str]:
    """Every rank's stage-in, one after the other in this process; their local dirs."""
    reports = [stage(store, to, plan, world=world(r, per_node), progress=False) for r in range(M)]
    return [r.local_dir for r in reports]


def holdings_of(store: Path, plan: str, per_node: int = 2) -> SampleHolders:
    with Index(store) as ix:
        p = plan_for(ix, plan)
        return SampleHolders.of(p.shape, np.asarray(ix.chunk_size), p.spec, world(0, per_node))


def namespace_store(local_dir: str, holdings: SampleHolders, rank: int) -> Store:
    index = Index(local_dir)
    origin = NamespaceDriver(
        index, holdings.local_to(rank), inbox_dir(local_dir, rank), timeout_s=0.3,
        verify_local=holdings.per_rank, parts=parts_dir(local_dir, rank),
    )  # fmt: skip
    return Store(index, tier_stack(index, TierConfig(), origin))


def payload(sample: int) -> bytes:
    return b"%d" % sample + b" " * 200  # make_store's content of sample i


@pytest.mark.parametrize("plan", ["local", "partial:0.5"])
@pytest.mark.parametrize("chunk_size", [8192, 1 << 20])  # ~8 samples a chunk; one chunk
def test_each_rank_reads_its_balanced_partition_from_local_storage(
    tmp_path: Path, plan: str, chunk_size: int
) -> None:
    n = 61
    store = make_store(tmp_path, n, chunk_size=chunk_size)
    locals_ = stage_all(store, str(tmp_path / "node{node}"), plan)
    holdings = holdings_of(store, plan)
    split = np.flatnonzero(holdings.holder == SPLIT)
    assert 1 <= len(split) <= M - 1
    os.rename(store, tmp_path / "origin-gone")  # nothing below may read the origin
    with Index(locals_[0]) as ix:
        p = plan_for(ix, plan)
    sizes = [len(p.partition(0, r, M)) for r in range(M)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n  # floor or ceil of N/M
    for r in range(M):
        with namespace_store(locals_[r], holdings, r) as s:
            for sample in p.partition(0, r, M).tolist():
                fields = s.read_sample(sample).fields
                assert next(iter(fields.values())) == payload(sample)


def test_two_nodes_each_hold_part_of_one_chunk(tmp_path: Path) -> None:
    store = make_store(tmp_path, 61)
    locals_ = stage_all(store, str(tmp_path / "node{node}"), "partial:0.5")
    holdings = holdings_of(store, "partial:0.5")
    # Ranks 1 (node 0) and 2 (node 1) share the chunk their partitions are cut in.
    shared = {q.chunk for q in holdings.parts_of(1)} & {q.chunk for q in holdings.parts_of(2)}
    assert len(shared) == 1
    chunk = shared.pop()
    assert locals_[1] != locals_[2]
    for r in (1, 2):
        assert (parts_dir(locals_[r], r) / f"chunk{chunk}.idx").exists()
        assert not (Path(locals_[r]) / "chunks" / f"{chunk:05d}.tar").exists()


def test_a_damaged_member_at_the_origin_publishes_no_part(tmp_path: Path) -> None:
    store = make_store(tmp_path, 61)
    holdings = holdings_of(store, "local")
    part = holdings.parts_of(1)[0]
    with Index(store) as ix:
        member = int(ix.sample_member_start[part.first])
        path = store / ix.chunk_name(part.chunk)
        offset = int(ix.member_offset[member])
    damaged = bytearray(path.read_bytes())
    damaged[offset] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(ChunkCorruptError, match=f"{path.name}.*does not match the index"):
        stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    assert list(parts_dir(tmp_path / "node1", 1).glob("*.idx")) == []  # nothing published


def test_a_damaged_part_is_never_served_and_is_copied_again(tmp_path: Path) -> None:
    store = make_store(tmp_path, 61)
    local = stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    holdings = holdings_of(store, "local")
    part = holdings.parts_of(1)[0]
    segment = parts_dir(local.local_dir, 1) / f"chunk{part.chunk}.bin"
    damaged = bytearray(segment.read_bytes())
    damaged[0] ^= 0xFF  # the first member of the part
    segment.write_bytes(bytes(damaged))
    with namespace_store(local.local_dir, holdings, 1) as s:
        with pytest.raises(ExchangeError, match="has not arrived"):
            s.read_sample(part.first)  # not wrong bytes: the part no longer holds it
        assert next(iter(s.read_sample(part.first + 1).fields.values())) == payload(part.first + 1)
    stale = parts_dir(local.local_dir, 1) / "chunk999.idx"
    shutil.copy(parts_dir(local.local_dir, 1) / f"chunk{part.chunk}.idx", stale)
    again = stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    assert again.parts_copied == 1 and again.chunks_copied == 0
    assert not stale.exists()  # a part this rank no longer stages is removed
    with namespace_store(local.local_dir, holdings, 1) as s:
        assert next(iter(s.read_sample(part.first).fields.values())) == payload(part.first)


def test_an_origin_failing_midway_leaves_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierfeed.distributed import parts
    from tierfeed.errors import StorageError
    from tierfeed.storage import PosixDriver

    store = make_store(tmp_path, 61)
    part = holdings_of(store, "local").parts_of(1)[0]
    assert part.end - part.first >= 2  # rank 1's part of chunk 2: several samples
    monkeypatch.setattr(parts, "_PART_READ", 1)  # one origin read per member
    calls: list[str] = []
    real = PosixDriver.read_range

    def failing(self: PosixDriver, path: str, offset: int, length: int) -> bytes:
        calls.append(path)
        if len(calls) == 2:
            raise StorageError(f"{path}: the origin went away")
        return real(self, path, offset, length)

    monkeypatch.setattr(PosixDriver, "read_range", failing)
    with pytest.raises(StorageError, match="went away"):
        stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    assert sorted(p.name for p in parts_dir(tmp_path / "node1", 1).iterdir()) == []


def test_the_summary_counts_parts(tmp_path: Path) -> None:
    store = make_store(tmp_path, 61)
    first = stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    assert "2 parts of split chunks" in first.summary()  # rank 1's run is cut at both ends
    again = stage(store, tmp_path / "node{node}", "local", world=ONE, progress=False)
    assert "0 chunks and 0 parts of split chunks" in again.summary()
    assert "and 2 parts already present" in again.summary()
