"""Fixtures of the slowfs tests: a small source tree and mounts that are always unmounted."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tierfeed.fuse.process import is_mounted, unmount
from tierfeed.slowfs import SlowFS, cleanup_stale_mount

# name -> size; sizes straddle the kernel's read request size and include an empty file.
TREE = {
    "a/one.bin": 1000,
    "a/two.bin": 200_000,
    "a/deep/three.bin": 1 << 20,
    "b/empty.bin": 0,
    "b/name with space é.txt": 17,
    "top.txt": 5,
}
LINK = "b/link-to-top"


def md5_tree(root: Path) -> dict[str, str]:
    """md5 of every regular file under ``root``, by relative path (symlinks followed)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = hashlib.md5(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A source tree of TREE's files with seeded content, plus a relative symlink."""
    root = tmp_path / "src"
    for i, (name, size) in enumerate(sorted(TREE.items())):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pattern = bytes(range(i, 251)) + bytes(range(i))
        path.write_bytes((pattern * (size // 251 + 1))[:size])
    (root / LINK).symlink_to("../top.txt")
    return root


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    """An empty mountpoint that is unmounted (lazily if need be) whatever the test did."""
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        pytest.skip("FUSE is not available here (/dev/fuse and fuse3's fusermount3)")
    path = tmp_path / "mnt"
    path.mkdir()
    try:
        yield path
    finally:
        cleanup_stale_mount(path)
        if is_mounted(path):
            unmount(path, lazy=True)


@pytest.fixture
def slowfs(src: Path, mnt: Path) -> Iterator[Callable[..., SlowFS]]:
    """Start SlowFS(src, mnt, ...) mounts; every one is closed at the end of the test."""
    started: list[SlowFS] = []

    def start(*args: Any, **kwargs: Any) -> SlowFS:
        fs = SlowFS(src, mnt, *args, **kwargs)
        started.append(fs)
        return fs.start()

    try:
        yield start
    finally:
        for fs in started:
            fs.close()
