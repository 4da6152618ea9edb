"""`tierfeed stage` in one process and under torchrun --standalone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.ranks import make_store
from tests.objectstore import env as objectstore_env
from tests.objectstore import upload
from tierfeed.cli import main
from tierfeed.format.index import Index
from tierfeed.format.verify import verify_store


def test_stage_in_one_process_copies_a_store_that_verifies(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    store = make_store(tmp_path, 64)
    assert main(["stage", str(store), "--to", str(tmp_path / "local"), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    with Index(store) as ix:
        assert report["chunks_copied"] == ix.num_chunks
        assert report["bytes_copied"] == int(np.asarray(ix.chunk_size).sum())
    assert verify_store(tmp_path / "local", progress=False) == []
    assert main(["stage", str(store), "--to", str(tmp_path / "local"), "--json", "--quiet"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["chunks_copied"] == 0 and again["origin_reads"] == 0


def test_stage_refuses_to_write_into_the_origin(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    store = make_store(tmp_path, 16)
    assert main(["stage", str(store), "--to", str(store / "inside"), "--quiet"]) == 1
    assert "read-only" in capsys.readouterr().err


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_stage_under_torchrun_splits_the_work(tmp_path: Path) -> None:
    store = make_store(tmp_path, 96)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "tierfeed", "stage", str(store), "--to", str(tmp_path / "node{node}"),
        "--json", "--quiet", "--timeout", "60",
    ]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    with Index(store) as ix:
        assert report["chunks_copied"] == ix.num_chunks  # summed over both ranks, once each
    # torchrun puts both ranks on one node: they share one directory.
    assert verify_store(tmp_path / "node0", progress=False) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.dist)])
def test_stage_from_an_s3_url(tmp_path: Path, s3_endpoint: str, bucket: str, ranks: int) -> None:
    store = make_store(tmp_path, 64)
    url = upload(s3_endpoint, store, bucket, "staged")
    env = dict(os.environ, **objectstore_env(s3_endpoint), TIERFEED_CACHE=str(tmp_path / "cache"))
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    stage = ["-m", "tierfeed", "stage", url, "--to", str(tmp_path / "node{node}"), "--json"]
    stage += ["--quiet", "--timeout", "60"]
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    cmd = [sys.executable, *(launch if ranks > 1 else []), *stage]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    with Index(store) as ix:
        assert report["chunks_copied"] == ix.num_chunks  # once each, over every rank
    assert verify_store(tmp_path / "node0", progress=False) == []
    assert (tmp_path / "node0" / "index.tfi").read_bytes() == (store / "index.tfi").read_bytes()


@pytest.mark.timeout(120)
def test_stage_with_a_damaged_chunk_at_the_origin_keeps_the_good_ones(
    tmp_path: Path, s3_endpoint: str, bucket: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # Chunks are copied several at once: one that fails its checksum names itself, leaves no
    # file (whole-and-verified or absent), and the next run copies only what is missing.
    store = make_store(tmp_path, 64)
    with Index(store) as ix:
        chunks, bad = ix.num_chunks, ix.chunk_name(1)
    good = (store / bad).read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF
    (store / bad).write_bytes(bytes(damaged))
    url = upload(s3_endpoint, store, bucket, "damaged")
    for name, value in {**objectstore_env(s3_endpoint), "TIERFEED_CACHE": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    local = tmp_path / "local"
    assert main(["stage", url, "--to", str(local), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"{url}/{bad}" in err and "does not match the index" in err
    assert not (local / bad).exists()
    assert not [p for p in local.rglob("*") if p.name.startswith(".tmp.")]
    (store / bad).write_bytes(good)
    upload(s3_endpoint, store, bucket, "damaged")
    assert main(["stage", url, "--to", str(local), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chunks_copied"] + report["chunks_present"] == chunks
    assert report["chunks_copied"] >= 1 and report["chunks_present"] >= 1  # good ones kept
    assert verify_store(local, progress=False) == []
