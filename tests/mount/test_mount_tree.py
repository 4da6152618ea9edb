"""The mount is the tree: `find`, `ls -lR`, `du`, `stat` and `tar -c` over the mount of a messy
tree (empty directories, odd modes, distinct mtimes) give what they give over the tree itself.

What cannot match is left out of the comparison, and said where: inode numbers, and the size
of a directory (and so `du`'s totals and `ls`'s block counts), which the source's file
system decides and the store does not record. A directory's link count is 2 + its
subdirectories, as on the usual file systems.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.conftest import QUIET, write_messy_tree
from tierfeed.format.pack import pack
from tierfeed.fuse.process import FuseProcess, is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the source tree, its mount), packed and mounted once for the module."""
    base = tmp_path_factory.mktemp("tree")
    write_messy_tree(base / "src")
    pack(base / "src", base / "store", QUIET)
    mnt = base / "mnt"
    mnt.mkdir()
    argv = [
        sys.executable,
        "-m",
        "tierfeed",
        "mount",
        str(base / "store"),
        str(mnt),
        "--foreground",
    ]
    with FuseProcess(argv, mnt):
        yield base / "src", mnt
    assert not is_mounted(mnt)


def run(argv: list[str], cwd: Path) -> bytes:
    return subprocess.run(argv, cwd=cwd, capture_output=True, check=True, timeout=30).stdout


def both(trees: tuple[Path, Path], argv: list[str]) -> tuple[bytes, bytes]:
    src, mnt = trees
    return run(argv, src), run(argv, mnt)


def test_find(trees: tuple[Path, Path]) -> None:
    def lines(out: bytes) -> list[list[bytes]]:
        rows = [line.split(b" ") for line in out.splitlines()]
        for row in rows:  # a directory's size is its file system's, not the tree's
            if row[1] == b"d":
                row[2] = b"-"
        return sorted(rows)

    src, mnt = both(trees, ["find", ".", "-printf", "%P %y %s %m %T@\n"])
    assert lines(src) == lines(mnt)
    assert len(lines(mnt)) == 15  # the root, every file and directory, empty ones included


def test_ls_lr(trees: tuple[Path, Path]) -> None:
    def lines(out: bytes) -> list[list[bytes]]:
        rows = []
        for line in out.splitlines():
            row = line.split()
            if line.startswith(b"total "):
                continue  # blocks allocated: the file system's
            if line.startswith(b"d"):
                row[4] = b"-"  # the size of a directory
            rows.append(row)
        return rows

    src, mnt = both(trees, ["ls", "-lR", "--time-style=+%s", "."])
    assert lines(src) == lines(mnt)
    valid = [b"drwxr-xr-x", b"3", b"-", b"1600950400", b"valid"]  # 2 + one subdirectory
    assert valid in [row[:2] + row[4:] for row in lines(mnt)]
    assert b"empty_class" in mnt and b"./valid/deeper/deepest:" in mnt


def test_du(trees: tuple[Path, Path]) -> None:
    src_dir, _ = trees

    def lines(out: bytes) -> list[tuple[bytes, bytes]]:
        rows = []
        for line in out.splitlines():
            size, path = line.split(b"\t", 1)
            is_dir = (src_dir / path.decode()).is_dir()
            rows.append((b"-" if is_dir else size, path))
        return sorted(rows)

    src, mnt = both(trees, ["du", "-ab", "."])
    assert lines(src) == lines(mnt)


def test_stat(trees: tuple[Path, Path]) -> None:
    src_dir, _ = trees
    names = [".", *sorted(str(p.relative_to(src_dir)) for p in src_dir.rglob("*"))]

    def lines(out: bytes) -> list[list[bytes]]:
        rows = [line.split(b" ", 4) for line in out.splitlines()]
        for row in rows:
            if row[4] == b"directory":
                row[1] = b"-"
        return rows

    src, mnt = both(trees, ["stat", "-c", "%n %s %a %Y %F", *names])
    assert lines(src) == lines(mnt)
    assert [b"empty_class", b"-", b"700", b"1600777600", b"directory"] in lines(mnt)


def test_tar_is_byte_identical(trees: tuple[Path, Path]) -> None:
    argv = ["tar", "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "-cf", "-", "."]
    src, mnt = both(trees, argv)
    assert src == mnt  # the root "./" included: its mode and mtime are recorded too


def test_writes_still_fail(trees: tuple[Path, Path]) -> None:
    _, mnt = trees
    with pytest.raises(OSError, match="Read-only"):
        (mnt / "cat" / "sub" / "c.jpg").write_bytes(b"x")  # 0755: writable bits, read-only mount
    with pytest.raises(OSError, match="Read-only"):
        (mnt / "empty_class" / "new").write_bytes(b"x")
