"""bench/device_check.py --cpu --tiny: the device check's whole flow on the CPU (a tiny CNN, 500
images), as CI runs it: every row ends in figures or in a stated reason, and the JSON is whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_or_show_stacks(
    cmd: list[str], env: dict[str, str], tmp: Path, out: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; past ``timeout``, fail with what it was waiting on: every process of its
    session prints its threads' stacks (SIGUSR1, faulthandler's), then all are killed."""
    with (tmp / "stdout").open("w+") as o, (tmp / "stderr").open("w+") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, text=True, env=env, cwd=ROOT,
                                start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGUSR1)
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        o.seek(0), e.seek(0)
        stdout, stderr = o.read(), e.read()
    if proc.returncode == -signal.SIGKILL:
        saved = out.read_text() if out.exists() else "(no JSON saved)"
        pytest.fail(f"no end in {timeout} s; rows saved: {saved[-2000:]}\n{stderr[-8000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cpu_tiny_runs_the_whole_check(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = ["--cpu", "--tiny", "--data", str(tmp_path / "d"), "--out", str(out)]
    args += ["--epoch-s", "8", "--budget-s", "150"]
    done = run_or_show_stacks([sys.executable, str(ROOT / "bench" / "device_check.py"), *args],
                              env, tmp_path, out, timeout=200)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "synthetic on device (ceiling)" in done.stdout
    result = json.loads(out.read_text())
    assert result["complete"] and result["ceiling"]["images_per_s"] > 0
    names = [row["name"] for row in result["rows"]]
    assert any(n.startswith("tierfeed cpu-decode") for n in names)
    for row in result["rows"]:
        if "error" in row:
            assert row["error"].startswith("skipped:")  # a missing torchvision, said
        else:
            assert [e["epoch"] for e in row["epochs"]] == [1, 2]
            assert all(e["images"] > 0 and e["wait_p99_ms"] >= 0 for e in row["epochs"])
    cpu = next(r for r in result["rows"] if r["name"].startswith("tierfeed cpu-decode"))
    assert 0 < cpu["epochs"][0]["images"] <= 480  # 500 images, batches of 32, the last dropped
    assert {r["system"] for r in result["scaling"]} >= {"tierfeed", "per-file", "over-store"}
    assert all("error" not in r for r in result["scaling"])


@pytest.mark.timeout(60)
def test_the_shell_script_checks_what_is_installed_and_says_what_is_missing(
    tmp_path: Path,
) -> None:
    """bench/device_check.sh is run once, on a machine with no network: its first step must
    say in one line what is missing (here, where torchvision does not import beside the tests'
    torch), or go on, never fail with a traceback."""
    fake = tmp_path / "bin"
    fake.mkdir()
    # This interpreter without its site-packages: torch, torchvision, numpy and the rest are
    # missing whatever this environment holds, and nothing is imported before the script.
    base = getattr(sys, "_base_executable", sys.executable)
    (fake / "python").write_text(f'#!/bin/sh\nexec {base} -I -S "$@"\n')
    (fake / "python").chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake / "python"), "TF_CHECK_DIR": str(tmp_path / "d")}
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_check.sh")],
        capture_output=True, text=True, timeout=50, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "device_check: error: not installed:" in done.stderr
    assert "torch" in done.stderr.splitlines()[-1]
