"""`pip install tierfeed` without torch (issue 33, friction 8): a fresh virtual environment
with the project installed from this tree, and nothing else, packs, verifies, inspects and
mounts a store; torch is not there, and its faces say in one line how to get it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.format.conftest import write_tree

pytestmark = [pytest.mark.slow, pytest.mark.fuse, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent


def run(
    *argv: object, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, cwd="/", env=env
    )


def test_a_plain_install_packs_verifies_and_mounts_without_torch(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0
    # A copy of the tree (tracked and new files, not .venv): the build writes beside it.
    src = tmp_path / "project"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    for name in filter(None, files):
        target = src / os.fsdecode(name)
        if (ROOT / os.fsdecode(name)).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((ROOT / os.fsdecode(name)).read_bytes())
    done = run(venv / "bin/python", "-m", "pip", "install", "-q", src)
    assert done.returncode == 0, done.stderr[-3000:]
    python, tierfeed = venv / "bin/python", venv / "bin/tierfeed"
    assert run(python, "-c", "import torch").returncode != 0  # not pulled in

    write_tree(tmp_path / "tree", {b"cat/a.jpg": b"a" * 3000, b"dog/b.jpg": b"b" * 5000})
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    for argv in (["pack", tmp_path / "tree", store, "-q"], ["verify", "-q", store]):
        done = run(tierfeed, *argv)
        assert done.returncode == 0, done.stderr
    assert "samples   2" in run(tierfeed, "inspect", store).stdout
    mnt.mkdir()
    done = run(tierfeed, "mount", store, mnt, timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        assert (mnt / "dog" / "b.jpg").read_bytes() == b"b" * 5000
    finally:
        assert run(tierfeed, "umount", mnt, timeout=60).returncode == 0

    # One rank stages without torch (no process group); on several, and in the PyTorch face,
    # what to install is said in one line.
    done = run(tierfeed, "stage", store, "--to", tmp_path / "local", "-q")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "local").rglob("*.tar")) != []
    two = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    done = run(tierfeed, "stage", store, "--to", tmp_path / "two", env=two)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "stage on 2 ranks" in done.stderr and "tierfeed[torch]" in done.stderr
    done = run(python, "-c", "import tierfeed.torch")
    assert "tierfeed[torch]" in done.stderr.splitlines()[-1]
