"""Stage-in, one namespace and partial shuffling over real gloo groups (spawned ranks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.distributed import workers
from tests.distributed.ranks import make_store, run_ranks
from tierfeed.format.index import Index

pytestmark = [pytest.mark.dist, pytest.mark.timeout(150)]
N = 192


@pytest.mark.parametrize("plan", ["global", "partial:0.5"])
def test_stage_in_reads_each_chunk_once_and_resumes(tmp_path: Path, plan: str) -> None:
    from tierfeed.distributed.holders import SPLIT, SampleHolders
    from tierfeed.loader.compose import plan_for
    from tierfeed.world import World

    store = make_store(tmp_path, N)
    to = str(tmp_path / "local" / "node{node}")
    codes, results = run_ranks(workers.stage_twice, 4, tmp_path, str(store), to, plan)
    assert codes == [0, 0, 0, 0]
    with Index(store) as ix:
        sizes = np.asarray(ix.chunk_size, dtype=np.int64)
        p = plan_for(ix, plan)
        holdings = SampleHolders.of(p.shape, sizes, p.spec, World(0, 4, 0, 2))
        parts = [part for r in range(4) for part in holdings.parts_of(r)]
        starts = np.asarray(ix.sample_member_start)
        ends = np.asarray(ix.member_offset, np.int64) + np.asarray(ix.member_length, np.int64)
        offsets = np.asarray(ix.member_offset, dtype=np.int64)
        # a part is read from its first member's data to its last one's end
        part_bytes = sum(int(ends[starts[q.end] - 1] - offsets[starts[q.first]]) for q in parts)
        names = [ix.chunk_name(c).split("/")[-1] for c in range(ix.num_chunks)]
    whole = np.flatnonzero(holdings.holder != SPLIT)
    if plan == "global":
        assert len(whole) == len(sizes) and not parts
    else:  # partitions balanced to the sample: a chunk cut between ranks is staged in parts
        assert len(parts) > 0 and len(whole) >= len(sizes) - 3
    first = results[0]["first"]
    assert first["chunks_copied"] == len(whole) and first["parts_copied"] == len(parts)
    assert first["bytes_copied"] == int(sizes[whole].sum()) + part_bytes
    assert first["origin_opens"] == len(whole) + len(parts)  # each chunk file once per stager
    second = results[0]["second"]
    assert second["chunks_copied"] == second["parts_copied"] == 0
    assert second["chunks_present"] == len(whole) and second["parts_present"] == len(parts)
    # Two pretend nodes (two ranks each) hold disjoint halves of the whole chunks, which with
    # the parts cover the store.
    node0, node1 = set(results[0]["chunks"]), set(results[2]["chunks"])
    assert results[1]["chunks"] == results[0]["chunks"]
    assert not node0 & node1 and node0 | node1 == {names[c] for c in whole}
    assert len(node0) > 0 and len(node1) > 0
    for r, result in enumerate(results):
        assert result["parts"] == sorted(f"chunk{q.chunk}.idx" for q in holdings.parts_of(r))
    if plan != "global":  # the cut between node 0 (ranks 0, 1) and node 1 falls inside a chunk
        assert set(results[1]["parts"]) & set(results[2]["parts"])


@pytest.mark.parametrize(("world", "workers_"), [(2, 1), (4, 0)])
def test_global_over_exchange_reads_every_sample_once_without_the_origin(
    tmp_path: Path, world: int, workers_: int
) -> None:
    store = make_store(tmp_path, N)
    to = str(tmp_path / "local" / "node{node}")
    hidden = str(tmp_path / "origin-gone")
    args = (str(store), to, "global", 2, workers_, hidden)
    codes, results = run_ranks(workers.train, world, tmp_path, *args)
    assert codes == [0] * world, codes
    for epoch in range(2):
        seen = [v for r in results for v in r["seen"][epoch]]
        assert sorted(seen) == list(range(N))  # exactly once across ranks
        for r in results:
            assert r["seen"][epoch] and sorted(r["seen"][epoch]) == sorted(r["planned"][epoch])
    assert sum(r["stats"]["samples_received"] for r in results) > 0  # peers did serve


def test_local_reads_balanced_partitions_from_whole_chunks_and_parts(tmp_path: Path) -> None:
    """4 ranks on two nodes: each reads N/M samples, its split chunks from its parts, never
    the origin, and nothing moves between ranks."""
    n = 190  # 47 or 48 samples a rank: every cut falls inside a chunk
    store = make_store(tmp_path, n)
    to = str(tmp_path / "local" / "node{node}")
    args = (str(store), to, "local", 2, 1, str(tmp_path / "origin-gone"))
    codes, results = run_ranks(workers.train, 4, tmp_path, *args)
    assert codes == [0] * 4, codes
    for epoch in range(2):
        shares = [sorted(set(r["seen"][epoch])) for r in results]
        assert sorted(v for s in shares for v in s) == list(range(n))  # once across ranks
        assert {len(s) for s in shares} <= {n // 4, -(-n // 4)}
        for r in results:
            assert sorted(r["seen"][epoch]) == sorted(r["planned"][epoch])
    assert all(r["stats"]["samples_received"] == 0 for r in results)


@pytest.mark.parametrize("world", [2, 4])
def test_partial_moves_keep_exactly_once_and_the_storage_bound(tmp_path: Path, world: int) -> None:
    q = 0.5
    store = make_store(tmp_path, N)
    to = str(tmp_path / "local" / "node{node}")
    args = (str(store), to, f"partial:{q}", 3, 1, str(tmp_path / "origin-gone"))
    codes, results = run_ranks(workers.train, world, tmp_path, *args)
    assert codes == [0] * world, codes
    for epoch in range(3):
        shares = [set(r["seen"][epoch]) for r in results]
        assert sum(len(s) for s in shares) == N and set().union(*shares) == set(range(N))
        for r in results:  # every rank read its own evolving partition (padded as planned)
            assert sorted(r["seen"][epoch]) == sorted(r["planned"][epoch])
    for r in results:  # partitions balanced to the sample: no slack for whole chunks
        assert max(r["held"]) <= (1 + q) * N / world + 1
        assert r["stats"]["samples_sent"] > 0 and r["stats"]["punched_bytes"] > 0
    # The partitions really evolved: some rank read in epoch 2 what another held in epoch 0.
    moved = sum(len(set(a["planned"][2]) - set(a["planned"][0])) for a in results)
    assert moved > 0


def test_a_killed_rank_makes_the_others_fail_fast(tmp_path: Path) -> None:
    store = make_store(tmp_path, N)
    to = str(tmp_path / "local" / "node{node}")
    codes, results = run_ranks(workers.die_midway, 2, tmp_path, str(store), to, "global")
    assert codes[1] == 17
    survivor = results[0]
    assert survivor is not None and survivor["error"] is not None, survivor
    assert "rank 0" in survivor["error"] and "steps" in survivor["error"]
    assert survivor["seconds"] < 60


def test_the_pls_scheduler_api_shape(tmp_path: Path) -> None:
    store = make_store(tmp_path, N)
    to = str(tmp_path / "local" / "node{node}")
    codes, results = run_ranks(workers.pls_loop, 2, tmp_path, str(store), to, 0.3)
    assert codes == [0, 0], codes
    for epoch in range(3):
        shares = [set(r["seen"][epoch]) for r in results]
        assert sum(len(s) for s in shares) == N and set().union(*shares) == set(range(N))
    assert all(r["sent"] > 0 for r in results)
    assert all(r["left"] == [] for r in results)  # clean_local_storage removed the chunks


def test_partial_resumes_exactly_once_after_a_crash(tmp_path: Path) -> None:
    from tierfeed.torch.dataset import plan_for

    store = make_store(tmp_path, N)
    to, plan = str(tmp_path / "local" / "node{node}"), "partial:0.5"
    _, before = run_ranks(workers.crash_mid_epoch, 2, tmp_path / "a", str(store), to, plan)
    assert all(b is not None for b in before)
    states = [b["state"] for b in before]  # each rank's own checkpoint
    codes, after = run_ranks(
        workers.resume_after_crash, 2, tmp_path / "b", str(store), to, plan, states
    )
    assert codes == [0, 0], codes
    with Index(store) as ix:
        p = plan_for(ix, plan)
    for r in range(2):
        epoch2 = before[r]["seen"] + after[r]["rest"]
        assert sorted(epoch2) == sorted(p.order(2, r, 2).tolist())  # once, nothing lost
        assert sorted(after[r]["next"]) == sorted(p.order(3, r, 2).tolist())
    assert sum(a["recopied"] for a in after) > 0  # chunks whose samples had been sent away
