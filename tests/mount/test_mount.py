"""`tierfeed mount`: a read-only view that unmodified programs read identical bytes through."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.conftest import QUIET, read_tree, write_tree
from tierfeed.cli import main
from tierfeed.format.pack import pack
from tierfeed.format.synthindex import synthetic_index
from tierfeed.fuse.process import FuseProcess, is_mounted, unmount

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(90)]


def python_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tierfeed", *args]


FILES = {
    f"class_{c}/img_{i:03d}.jpg".encode(): os.urandom(200 + 997 * i % 30_000)
    for c in range(3)
    for i in range(40)
}
FILES[b"class_0/nested/deep/x.txt"] = b"deep"
FILES["class_1/ünï.jpg".encode()] = b"unicode"


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Path]:
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    argv = python_argv("mount", str(tmp_path / "store"), str(mnt), "--foreground")
    with FuseProcess(argv, mnt):
        yield mnt
    assert not is_mounted(mnt)


def test_tree_is_byte_identical(mounted: Path) -> None:
    assert read_tree(mounted) == FILES
    find = subprocess.run(["find", ".", "-type", "f"], cwd=mounted, capture_output=True, check=True)
    assert len(find.stdout.splitlines()) == len(FILES)  # .tierfeed is not listed
    md5 = subprocess.run(
        ["md5sum", "class_0/img_005.jpg"], cwd=mounted, capture_output=True, check=True
    )
    assert md5.stdout.split()[0].decode() == hashlib.md5(FILES[b"class_0/img_005.jpg"]).hexdigest()


def test_read_only_and_missing(mounted: Path) -> None:
    for attempt in (
        lambda: (mounted / "class_0" / "new.jpg").write_bytes(b"x"),
        lambda: open(mounted / "class_0" / "img_001.jpg", "r+b").close(),
        lambda: (mounted / "class_0" / "img_001.jpg").unlink(),
        lambda: (mounted / "newdir").mkdir(),
        lambda: (mounted / "class_0" / "img_001.jpg").rename(mounted / "class_0" / "r.jpg"),
    ):
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        (mounted / "class_9").stat()
    with pytest.raises(FileNotFoundError):
        (mounted / "class_0" / "nope.jpg").read_bytes()
    # The packed tree's modes, shown as stored (a 0644 file is still read-only here).
    source = mounted.parent / "src" / "class_0" / "img_001.jpg"
    assert (mounted / "class_0" / "img_001.jpg").stat().st_mode == source.stat().st_mode


def test_stats_are_live_and_hidden(mounted: Path) -> None:
    assert ".tierfeed" not in os.listdir(mounted)
    before = json.loads((mounted / ".tierfeed" / "stats.json").read_text())
    (mounted / "class_2" / "img_010.jpg").read_bytes()
    after = json.loads((mounted / ".tierfeed" / "stats.json").read_text())
    assert after["view"]["opens"] == before["view"]["opens"] + 1
    assert after["view"]["bytes"] >= before["view"]["bytes"] + len(FILES[b"class_2/img_010.jpg"])


def test_many_open_stats_handles_each_read_whole_json(mounted: Path) -> None:
    # Each handle reads the snapshot taken at its open; past the kept snapshots, a fresh one.
    # Small unbuffered reads split each document into many requests.
    handles = [open(mounted / ".tierfeed" / "stats.json", "rb", buffering=0) for _ in range(80)]  # noqa: SIM115
    try:
        for fh in handles:
            pieces = iter(lambda fh=fh: fh.read(16), b"")
            assert "view" in json.loads(b"".join(pieces))
    finally:
        for fh in handles:
            fh.close()


def test_unmount_with_open_files(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    proc = FuseProcess(python_argv("mount", str(tmp_path / "store"), str(mnt), "--foreground"), mnt)
    proc.start()
    try:
        with open(mnt / "class_0" / "img_002.jpg", "rb") as held:
            assert main(["umount", str(mnt), "--lazy"]) == 0
            assert not is_mounted(mnt)
            assert held.read(10) == FILES[b"class_0/img_002.jpg"][:10]  # still readable
    finally:
        proc.close()


def test_killed_server_leaves_no_hung_mountpoint(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    argv = python_argv("mount", str(tmp_path / "store"), str(mnt), "--foreground")
    proc = FuseProcess(argv, mnt).start()
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with pytest.raises(OSError) as info:
        os.listdir(mnt)
    assert info.value.errno == errno.ENOTCONN
    proc.close()  # detects the stale mount and detaches it
    assert not is_mounted(mnt) and os.listdir(mnt) == []
    with FuseProcess(argv, mnt):  # the next mount on the same point works
        assert read_tree(mnt) == FILES


@pytest.mark.slow
def test_directory_of_100k_entries_lists(tmp_path: Path) -> None:
    store = tmp_path / "big"
    store.mkdir()
    synthetic_index(store / "index.tfi", 100_000, classes=1)  # metadata only, no chunk data
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    with FuseProcess(python_argv("mount", str(store), str(mnt), "--foreground"), mnt):
        names = os.listdir(mnt / "c0000")
        assert len(names) == 100_000 and names[0].endswith(".jpg")
        assert (mnt / "c0000" / names[-1]).stat().st_size > 0


def test_cli_mount_detaches_and_umount(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    try:
        assert main(["mount", str(tmp_path / "store"), str(mnt)]) == 0
        assert is_mounted(mnt) and read_tree(mnt) == FILES
        assert main(["umount", str(mnt)]) == 0
        assert not is_mounted(mnt)
    finally:
        unmount(mnt)


@pytest.mark.slow
def test_tiered_mount_over_a_slowed_origin(tmp_path: Path) -> None:
    """Metadata never reaches the origin; the second pass reads only local tiers."""
    from tierfeed.slowfs import SlowFS

    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "origin" / "store", QUIET)
    slow, mnt = tmp_path / "slow", tmp_path / "mnt"
    slow.mkdir()
    mnt.mkdir()
    with SlowFS(tmp_path / "origin", slow) as origin:
        argv = python_argv(
            "mount", str(slow / "store"), str(mnt), "--foreground",
            "--disk", str(tmp_path / "cache"), "--disk-size", "1GiB",
        )  # fmt: skip
        with FuseProcess(argv, mnt):
            origin.reset()
            assert read_tree(mnt) == FILES  # find + read of every file
            first = origin.stats()
            chunks = len(list((tmp_path / "origin" / "store" / "chunks").iterdir()))
            # Chunk files and the index, never one per file: two threads may race to open a
            # chunk (the loser closes its own), hence the factor 2.
            assert first.opens <= 2 * chunks + 1 < len(FILES)
            assert first.readdirs == 0
            deadline = time.monotonic() + 30  # let the background copies land
            while len(list((tmp_path / "cache").glob("*.tar"))) < chunks:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            stats = json.loads((mnt / ".tierfeed" / "stats.json").read_text())
            assert stats["origin"]["bytes"] > 0  # the mount's own counters saw the origin
            origin.reset()
            assert read_tree(mnt) == FILES
            second = origin.stats()
            assert (second.opens, second.reads, second.bytes_read) == (0, 0, 0)
