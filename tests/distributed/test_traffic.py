"""`job_traffic` and `tierfeed simulate STORE`: a staged job's bytes computed from the index,
checked against what stage-in really copied (the exchange's are checked against real runs in
`bench/simulate_check.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.ranks import make_store
from tests.distributed.test_parts import M, world
from tierfeed.cli import main
from tierfeed.distributed import stage
from tierfeed.distributed.traffic import job_traffic
from tierfeed.format.index import Index

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("plan", ["local", "partial:0.3", "global"])
def test_origin_bytes_are_what_each_rank_stages(tmp_path: Path, plan: str) -> None:
    store = make_store(tmp_path, 61)
    copied = [
        stage(store, tmp_path / "node{node}", plan, world=world(r), progress=False)
        for r in range(M)
    ]
    with Index(store) as ix:
        rows = job_traffic(ix, plan, M, 2, epochs=3, window=16)
        total = int(np.asarray(ix.chunk_size).sum())
    assert [(r.epoch, r.rank) for r in rows] == [(e, r) for e in range(3) for r in range(M)]
    first = [r for r in rows if r.epoch == 0]
    assert [r.origin for r in first] == [c.rank_bytes_copied for c in copied]
    assert sum(r.origin for r in first) <= total  # parts leave out the headers before them
    assert all(r.origin == 0 for r in rows if r.epoch > 0)
    for e in range(3):
        here = [r for r in rows if r.epoch == e]
        assert sum(r.sent for r in here) == sum(r.received for r in here)
        if plan == "local":
            assert all(r.sent == r.received == 0 for r in here)
        else:
            assert all(r.received > 0 for r in here)


def test_simulate_a_real_store_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_store(tmp_path, 61)
    argv = [
        "simulate",
        str(store),
        "--ranks",
        "4",
        "--ranks-per-node",
        "2",
        "--plan",
        "partial:0.3",
    ]
    assert main([*argv, "--json", "--epochs", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 8 and {"origin", "sent", "received", "held", "cache"} <= set(rows[0])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "61 samples" in out and "rank" in out and len(out.splitlines()) == 2 + 3 * 4
    assert main(["simulate", str(store), "--ranks", "3", "--ranks-per-node", "2"]) == 1
    assert "does not divide" in capsys.readouterr().err
    assert main(["simulate", "--ranks", "4"]) == 1
    assert "give a STORE, or --samples" in capsys.readouterr().err
