"""`tierfeed mount` under attack: damaged bytes never leave the mount, bad targets are refused.

Every read through the mount is checked against the member's checksum (EIO on a mismatch,
correct bytes when a good copy exists); `tierfeed mount` refuses a target that is missing,
not a directory, not empty or already mounted; `tierfeed umount` unmounts tierfeed mounts only.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.conftest import QUIET, write_tree
from tests.hostile.conftest import empty_mountpoint
from tests.hostile.edits import flip
from tierfeed.format.index import Index
from tierfeed.format.pack import pack
from tierfeed.fuse.process import FuseProcess, fuse_mount_type, is_mounted, unmount
from tierfeed.slowfs import SlowFS
from tierfeed.storage.tiers import cache_key

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

# Sizes straddle the kernel's 128 KiB read request; with QUIET's 64 KiB chunks most files
# sit in chunks of their own.
FILES = {
    b"a/small.txt": b"hello tierfeed\n",
    b"a/victim.bin": bytes(range(256)) * 1200,  # 300 KiB: several read requests
    b"a/other.bin": os.urandom(90_000),
    b"b/big.bin": os.urandom(1_100_000),
    b"b/tail.bin": os.urandom(5_000),
    b"c/empty.bin": b"",
}
VICTIM = b"a/victim.bin"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m tierfeed ARGS` and capture its output."""
    argv = [sys.executable, "-m", "tierfeed", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def assert_one_line_error(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The command failed with exit 1 and exactly one `tierfeed CMD: error: ...` line."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"tierfeed {command}: error: "), result.stderr
    return lines[0]


def member_place(store: Path, rel: bytes) -> tuple[str, int, int]:
    """(chunk file name relative to the store, offset in it, length) of the member at ``rel``."""
    index = Index(store)
    try:
        member = index.find_member(rel)
        assert member is not None
        chunk = index.chunks()[int(index.member_chunk[member])]
        return chunk.name, int(index.member_offset[member]), int(index.member_length[member])
    finally:
        index.close()


def read(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    return tmp_path / "store"


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Path]:
    """An empty mountpoint, unmounted (lazily) whatever the test did."""
    with empty_mountpoint(tmp_path / "mnt") as path:
        yield path


def serve_argv(store: Path, mnt: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tierfeed", "mount", str(store), str(mnt), "--foreground", *extra]


# --- every byte read through the mount is checked --------------------------------------------


@pytest.mark.parametrize("tiers", ["none", "disk"])
def test_corrupt_member_reads_fail_with_eio(
    store: Path, mnt: Path, tmp_path: Path, tiers: str
) -> None:
    chunk, offset, length = member_place(store, VICTIM)
    flip(store / chunk, offset + length - 10)  # past the first read request
    extra = ["--disk", str(tmp_path / "cache"), "--disk-size", "1GiB"] if tiers == "disk" else []
    with FuseProcess(serve_argv(store, mnt, *extra), mnt) as server:
        for _ in range(2):  # a retry gets no bytes either
            with pytest.raises(OSError) as info:
                read(mnt / os.fsdecode(VICTIM))
            assert info.value.errno == errno.EIO
        # Not even the first bytes of the file: the member is checked whole.
        with open(mnt / os.fsdecode(VICTIM), "rb", buffering=0) as fh, pytest.raises(OSError):
            fh.read(4096)
        cat = subprocess.run(["cat", str(mnt / os.fsdecode(VICTIM))], capture_output=True)
        assert cat.returncode != 0 and cat.stdout == b""
        for rel, data in FILES.items():
            if rel != VICTIM and member_place(store, rel)[0] != chunk:
                assert read(mnt / os.fsdecode(rel)) == data
        view = json.loads((mnt / ".tierfeed" / "stats.json").read_text())["view"]
        assert view["errors"] >= 1 and view["corrupt"] >= 1
        log = server.output()
    assert chunk.rsplit("/", 1)[-1] in log and os.fsdecode(VICTIM) in log, log


def test_corrupt_first_byte_of_big_member(store: Path, mnt: Path) -> None:
    # A member far larger than one read request, damaged at its very first byte.
    chunk, offset, _ = member_place(store, b"b/big.bin")
    flip(store / chunk, offset)
    with FuseProcess(serve_argv(store, mnt), mnt):
        with open(mnt / "b" / "big.bin", "rb", buffering=0) as fh:
            fh.seek(900_000)
            with pytest.raises(OSError) as info:
                fh.read(4096)
        assert info.value.errno == errno.EIO
        assert read(mnt / "a" / "victim.bin") == FILES[VICTIM]


def test_checked_reads_serve_every_offset(store: Path, mnt: Path) -> None:
    # Verified members are served as slices at any offset and size, from many threads.
    from concurrent.futures import ThreadPoolExecutor

    big = FILES[b"b/big.bin"]
    with FuseProcess(serve_argv(store, mnt), mnt):
        path = mnt / "b" / "big.bin"

        def piece(at: int) -> bool:
            fd = os.open(path, os.O_RDONLY)
            try:
                return os.pread(fd, 70_001, at) == big[at : at + 70_001]
            finally:
                os.close(fd)

        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(piece, range(0, len(big) + 100_000, 33_333)))
        assert read(mnt / "c" / "empty.bin") == b""


def test_rotted_disk_copy_is_fetched_again_from_the_origin(
    store: Path, mnt: Path, tmp_path: Path
) -> None:
    """A cached chunk whose bytes rot while inode, size and mtime stay: correct bytes, always.

    Relies on `Store.read_member` dropping a bad tier copy and reading the origin again.
    """
    cache = tmp_path / "cache"
    extra = ["--disk", str(cache), "--disk-size", "1GiB"]
    chunk, offset, length = member_place(store, VICTIM)
    index = Index(store)
    try:
        info = next(c for c in index.chunks() if c.name == chunk)
    finally:
        index.close()
    cached = cache / cache_key(info)
    with FuseProcess(serve_argv(store, mnt, *extra), mnt):
        assert read(mnt / os.fsdecode(VICTIM)) == FILES[VICTIM]
        deadline = time.monotonic() + 30  # the background copy lands
        while not cached.exists():
            assert time.monotonic() < deadline, "the disk tier never got the chunk"
            time.sleep(0.05)
    flip(cached, offset + length // 2, keep_mtime=True)
    with FuseProcess(serve_argv(store, mnt, *extra), mnt):
        assert read(mnt / os.fsdecode(VICTIM)) == FILES[VICTIM]
        assert read(mnt / os.fsdecode(VICTIM)) == FILES[VICTIM]
        stats = json.loads((mnt / ".tierfeed" / "stats.json").read_text())
        assert stats["view"]["errors"] == 0
        dropped = sum(v.get("corrupt_dropped", 0) for v in stats.values() if isinstance(v, dict))
        assert dropped >= 1, stats  # the rotted copy was seen and dropped, not served


# --- `tierfeed mount` refuses bad targets -------------------------------------------------


@pytest.mark.parametrize("foreground", [False, True])
@pytest.mark.parametrize("kind", ["non-empty", "regular file", "missing"])
def test_mount_refuses_bad_target(store: Path, tmp_path: Path, kind: str, foreground: bool) -> None:
    target = tmp_path / "target"
    if kind == "non-empty":
        target.mkdir()
        (target / "keep.txt").write_text("mine")
    elif kind == "regular file":
        target.write_text("mine")
    try:
        args = ["mount", str(store), str(target)] + (["--foreground"] if foreground else [])
        line = assert_one_line_error(cli(*args, timeout=30), "mount")
        assert str(target) in line
        assert not is_mounted(target)
    finally:
        if is_mounted(target):
            unmount(target, lazy=True)
    if kind == "non-empty":
        assert (target / "keep.txt").read_text() == "mine"
    elif kind == "regular file":
        assert target.read_text() == "mine"
    else:
        assert not target.exists()


def test_mount_refuses_a_mounted_target(store: Path, mnt: Path) -> None:
    with FuseProcess(serve_argv(store, mnt), mnt):
        assert fuse_mount_type(mnt) == "fuse.tierfeed"
        line = assert_one_line_error(cli("mount", str(store), str(mnt)), "mount")
        assert str(mnt) in line
        assert read(mnt / "a" / "small.txt") == FILES[b"a/small.txt"]  # the first one serves on
    assert not is_mounted(mnt)


def test_mount_nonempty_flag_allows_it(store: Path, mnt: Path) -> None:
    (mnt / "hidden.txt").write_text("under the mount")
    with FuseProcess(serve_argv(store, mnt, "--nonempty"), mnt):
        assert read(mnt / "a" / "small.txt") == FILES[b"a/small.txt"]
    assert (mnt / "hidden.txt").read_text() == "under the mount"


def test_mount_child_failure_is_one_line(store: Path, mnt: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the disk tier's parent directory should be")
    disk = blocker / "cache"
    line = assert_one_line_error(cli("mount", str(store), str(mnt), "--disk", str(disk)), "mount")
    assert str(disk) in line or str(blocker) in line
    assert not is_mounted(mnt)


def test_mount_bad_store_is_one_line(tmp_path: Path, mnt: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "index.tfi").write_bytes(b"not an index" * 10)
    for extra in ([], ["--foreground"]):
        line = assert_one_line_error(cli("mount", str(bad), str(mnt), *extra), "mount")
        assert str(bad) in line
        assert not is_mounted(mnt)


# --- `tierfeed umount` unmounts tierfeed mounts only ------------------------------------------


def test_umount_refuses_a_tmpfs(tmp_path: Path) -> None:
    target = tmp_path / "tmpfs"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], check=True)
    try:
        (target / "precious").write_text("data")
        line = assert_one_line_error(cli("umount", str(target)), "umount")
        assert str(target) in line and "tmpfs" in line
        assert is_mounted(target) and (target / "precious").read_text() == "data"
        assert_one_line_error(cli("umount", "--lazy", str(target)), "umount")
        assert is_mounted(target)
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)
    assert not is_mounted(target)


def test_umount_refuses_another_fuse_mount(tmp_path: Path, mnt: Path) -> None:
    # A FUSE file system not tierfeed's (the tests' faulty pass-through, never told to fail).
    src = tmp_path / "plain"
    write_tree(src, {b"x.txt": b"other bytes"})
    argv = [sys.executable, "-m", "tests.storage.faultyfs", str(src), str(mnt)]
    with FuseProcess(argv, mnt):
        kind = fuse_mount_type(mnt)
        assert kind is not None and kind not in ("fuse.tierfeed", "fuse.slowfs")
        line = assert_one_line_error(cli("umount", str(mnt)), "umount")
        assert str(mnt) in line and "not a tierfeed mount" in line
        assert is_mounted(mnt) and (mnt / "x.txt").read_bytes() == b"other bytes"
    assert not is_mounted(mnt)


def test_umount_stops_a_slowfs(tmp_path: Path, mnt: Path) -> None:
    # `tierfeed slowfs` is tierfeed's too: umount stops it (issue 33, friction 9).
    src = tmp_path / "plain"
    write_tree(src, {b"x.txt": b"slow bytes"})
    with SlowFS(src, mnt):
        assert fuse_mount_type(mnt) == "fuse.slowfs"
        assert cli("umount", str(mnt)).returncode == 0
        assert not is_mounted(mnt)


def test_umount_refuses_a_plain_directory(tmp_path: Path) -> None:
    line = assert_one_line_error(cli("umount", str(tmp_path)), "umount")
    assert str(tmp_path) in line


# --- the view's cache of verified members (no FUSE needed) ----------------------------------


def test_verified_members_single_flight_and_byte_budget() -> None:
    import threading

    from tierfeed.mount.members import VerifiedMembers

    calls: list[int] = []
    gate = threading.Event()

    def load(member: int) -> bytes:
        calls.append(member)
        gate.wait(5)
        return bytes([member]) * (100 * (member + 1))

    cache = VerifiedMembers(load, budget=450)
    threads = [threading.Thread(target=cache.get, args=(1,)) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(5)
    assert calls == [1]  # eight concurrent requests, one read
    assert cache.get(2) == b"\x02" * 300 and cache.held_bytes == 500 - 200  # 1 evicted
    assert cache.get(9) == b"\x09" * 1000  # over the budget: kept alone
    assert cache.held_bytes == 1000 and calls == [1, 2, 9]
    cache.get(9)  # the next request of the same large file: no second read
    assert calls == [1, 2, 9]
    assert cache.get(2) == b"\x02" * 300 and calls == [1, 2, 9, 2]
    assert cache.held_bytes == 300  # the large one made room again


def test_verified_members_never_keep_a_failed_read() -> None:
    from tierfeed.errors import ChunkCorruptError
    from tierfeed.mount.members import VerifiedMembers

    outcomes = [ChunkCorruptError("chunk c: member m fails its checksum"), b"good"]

    def load(member: int) -> bytes:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    cache = VerifiedMembers(load, budget=1 << 20)
    with pytest.raises(ChunkCorruptError):
        cache.get(0)
    assert cache.held_bytes == 0
    assert cache.get(0) == b"good"  # a later request reads (and checks) it again
