"""The `tierfeed slowfs` command: flags, serving until SIGTERM, the final summary, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tierfeed.fuse.process import is_mounted
from tierfeed.slowfs import FuseProcess, SlowFSStats

pytestmark = pytest.mark.timeout(60)
CLI = [sys.executable, "-m", "tierfeed", "slowfs"]


def test_help_lists_the_flags() -> None:
    out = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--latency", "--seed", "--cache", "--attr-timeout", "--threads", "--stats-file"):
        assert flag in out
    assert "heavy-tail" in out


@pytest.mark.fuse
def test_serves_until_sigterm_and_writes_stats(src: Path, mnt: Path, tmp_path: Path) -> None:
    out = tmp_path / "final.json"
    argv = [*CLI, str(src), str(mnt), "--latency", "nfs", "--seed", "3", "--stats-file", str(out)]
    server = FuseProcess(argv, mnt, name="tierfeed slowfs")
    with server:
        assert (mnt / "a/one.bin").read_bytes() == (src / "a/one.bin").read_bytes()
        live = SlowFSStats.from_json((mnt / ".slowfs/stats.json").read_bytes())
        assert live.opens == 1 and live.delay_s > 0
        assert server.pid is not None
        # SIGTERM: libfuse unmounts, the command prints its summary and exits 0.
        os.kill(server.pid, signal.SIGTERM)
        assert server.wait(20) == 0
        assert not is_mounted(mnt)
        assert "unmounted; 1 opens" in server.output()
    assert not is_mounted(mnt)
    doc = json.loads(out.read_text())
    assert doc["model"]["seed"] == 3 and doc["model"]["median_ms"] == 1.0
    assert doc["counters"]["opens"] == 1


@pytest.mark.fuse
def test_background_serves_until_umount(src: Path, mnt: Path, tmp_path: Path) -> None:
    # Issue 33, friction 9: slowfs has mount's lifecycle, and `tierfeed umount` stops it.
    from tierfeed.fuse.process import unmount

    out = tmp_path / "final.json"
    argv = [*CLI, str(src), str(mnt), "--background", "--latency", "nfs", "--stats-file", str(out)]
    try:
        started = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert started.returncode == 0, started.stderr
        assert "tierfeed umount" in started.stdout + started.stderr
        assert is_mounted(mnt)
        assert (mnt / "a/one.bin").read_bytes() == (src / "a/one.bin").read_bytes()
        stopped = subprocess.run(
            [sys.executable, "-m", "tierfeed", "umount", str(mnt)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert stopped.returncode == 0, stopped.stderr
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            unmount(mnt, lazy=True)
    # The detached server wrote its final counters when it was unmounted.
    for _ in range(100):
        if out.exists():
            break
        __import__("time").sleep(0.1)
    assert json.loads(out.read_text())["counters"]["opens"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--latency", "median_ms=x"], "not a number"),
        (["--latency", "bogus"], "bad latency spec"),
        (["--cache", "keep", "--threads", "0"], "threads"),
    ],
)
def test_bad_options_exit_1_with_a_message(
    src: Path, mnt: Path, args: list[str], message: str
) -> None:
    result = subprocess.run([*CLI, str(src), str(mnt), *args], capture_output=True, text=True)
    assert result.returncode == 1
    assert message in result.stderr


def test_bad_paths_exit_1(src: Path, tmp_path: Path) -> None:
    for argv in ([str(tmp_path / "none"), str(tmp_path)], [str(src), str(src / "a")]):
        result = subprocess.run([*CLI, *argv], capture_output=True, text=True)
        assert result.returncode == 1, result.stderr
        assert "slowfs" in result.stderr
