"""Reads through slowfs are the source's bytes; writes fail with EROFS; the source is untouched."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tierfeed.slowfs import SlowFS

from .conftest import LINK, TREE, md5_tree

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(60)]


def test_tree_is_byte_identical_and_listings_match(
    src: Path, slowfs: Callable[..., SlowFS]
) -> None:
    fs = slowfs()
    assert md5_tree(fs.mountpoint) == md5_tree(src)
    assert len(md5_tree(fs.mountpoint)) == len(TREE) + 1  # the symlink is followed
    walked = sorted(str(Path(d).relative_to(fs.mountpoint)) for d, _, _ in os.walk(fs.mountpoint))
    assert walked == sorted(str(Path(d).relative_to(src)) for d, _, _ in os.walk(src))
    assert os.readlink(fs.mountpoint / LINK) == "../top.txt"
    st_src, st_mnt = os.stat(src / "a/two.bin"), os.stat(fs.mountpoint / "a/two.bin")
    assert (st_mnt.st_size, st_mnt.st_mtime_ns, st_mnt.st_mode) == (
        st_src.st_size,
        st_src.st_mtime_ns,
        st_src.st_mode,
    )


def test_stats_file_is_hidden_but_readable(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs()
    assert ".slowfs" not in os.listdir(fs.mountpoint)
    assert os.listdir(fs.mountpoint / ".slowfs") == ["stats.json"]
    assert fs.stats_path.read_text().startswith("{")
    assert fs.total_stats().opens == 0  # reading the stats costs nothing and counts nothing


def test_ranges_and_mmap_read_the_right_bytes(src: Path, slowfs: Callable[..., SlowFS]) -> None:
    import mmap

    fs = slowfs()
    expected = (src / "a/deep/three.bin").read_bytes()
    with open(fs.mountpoint / "a/deep/three.bin", "rb") as f:
        f.seek(300_001)
        assert f.read(70_000) == expected[300_001:370_001]
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[-5000:] == expected[-5000:]


def test_writes_fail_with_erofs_and_leave_the_source_alone(
    src: Path, slowfs: Callable[..., SlowFS]
) -> None:
    before = md5_tree(src), sorted(p.stat().st_mtime_ns for p in src.rglob("*"))
    fs = slowfs()
    m = fs.mountpoint
    attempts: list[Callable[[], object]] = [
        lambda: os.open(m / "top.txt", os.O_RDWR),
        lambda: os.open(m / "top.txt", os.O_WRONLY | os.O_APPEND),
        lambda: os.open(m / "new.txt", os.O_WRONLY | os.O_CREAT, 0o644),
        lambda: os.open(m / "top.txt", os.O_RDONLY | os.O_TRUNC),
        lambda: os.unlink(m / "top.txt"),
        lambda: os.mkdir(m / "newdir"),
        lambda: os.rmdir(m / "b"),
        lambda: os.rename(m / "top.txt", m / "moved.txt"),
        lambda: os.symlink("top.txt", m / "newlink"),
        lambda: os.chmod(m / "top.txt", 0o600),
        lambda: os.utime(m / "top.txt", (0, 0)),
        lambda: os.truncate(m / "top.txt", 0),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS
    fs.close()
    assert (md5_tree(src), sorted(p.stat().st_mtime_ns for p in src.rglob("*"))) == before


def test_missing_paths_are_enoent(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs()
    for path in ("nope", "a/nope.bin", "nope/deeper", ".slowfs/nope"):
        with pytest.raises(FileNotFoundError):
            (fs.mountpoint / path).read_bytes()
    with pytest.raises(NotADirectoryError):
        os.listdir(fs.mountpoint / "top.txt")
    assert fs.stats().errors >= 3
