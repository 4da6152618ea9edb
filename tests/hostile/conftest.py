"""Hostile and clumsy input: every test here carries the `hostile` marker.

Each test feeds tierfeed something damaged, crafted or simply wrong and checks that it ends,
under a time bound, in a tierfeed error naming the file (or in correct bytes) - never in a
hang, a traceback, an unbounded allocation or a write to the origin.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.hostile)


# --- pack and CLI errors (test_pack_hostile.py, test_cli_errors.py) -------------------------
# Real mounts and a real unprivileged user: a tiny tmpfs fills up, a read-only tmpfs refuses
# writes, and a directory with mode 000 is unlistable only for someone who is not root.


NOBODY = 65534


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount a tmpfs at ``tmp_path/<name>`` with mount options; unmounted after the test.

    ``tmpfs("full", "size=512k")`` is a disk that fills up; ``tmpfs("ro", "ro")`` is read-only.
    Skips (saying why) where this process may not mount.
    """
    mounted: list[Path] = []

    def make(name: str, *options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        args = ["mount", "-t", "tmpfs", "-o", ",".join(options or ("size=1m",)), "tmpfs"]
        done = subprocess.run([*args, str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); needs root")
        mounted.append(where)
        return where

    yield make
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A fresh directory under /tmp that user `nobody` can enter and write (tmp_path cannot)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as user nobody")
    path = Path(tempfile.mkdtemp(prefix="tierfeed-hostile-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def empty_mountpoint(path: Path) -> Iterator[Path]:
    """``path`` made an empty directory to mount on, unmounted (lazily) whatever the test did."""
    from tierfeed.fuse.process import is_mounted, unmount

    path.mkdir()
    try:
        yield path
    finally:
        if is_mounted(path):
            unmount(path, lazy=True)
