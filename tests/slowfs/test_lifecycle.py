"""Mount lifecycle: start errors are clear, busy and killed mounts never leave a hung mountpoint."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tierfeed.errors import StorageError
from tierfeed.fuse.process import fuse_mount_type, is_mounted
from tierfeed.slowfs import SlowFS, cleanup_stale_mount, is_stale_mount

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(60)]


def test_mount_and_close(slowfs: Callable[..., SlowFS], mnt: Path) -> None:
    fs = slowfs()
    assert fuse_mount_type(mnt) == "fuse.slowfs"
    assert fs.close() == 0
    assert not is_mounted(mnt)
    assert os.listdir(mnt) == []
    assert fs.close() is None  # a second close does nothing


def test_killed_server_leaves_a_stale_mount_that_cleanup_removes(
    slowfs: Callable[..., SlowFS], src: Path, mnt: Path
) -> None:
    fs = slowfs()
    assert fs.pid is not None
    os.kill(fs.pid, signal.SIGKILL)
    os.waitpid(fs.pid, 0)
    with pytest.raises(OSError) as info:
        os.listdir(mnt)
    assert info.value.errno == errno.ENOTCONN
    assert is_stale_mount(mnt)
    assert cleanup_stale_mount(mnt)
    assert not is_mounted(mnt)
    assert os.listdir(mnt) == []
    assert not cleanup_stale_mount(mnt)  # nothing left to clean
    # The next mount on the same directory works.
    fs2 = slowfs()
    assert (fs2.mountpoint / "top.txt").read_bytes() == (src / "top.txt").read_bytes()


def test_start_cleans_a_stale_mount_first(slowfs: Callable[..., SlowFS], mnt: Path) -> None:
    fs = slowfs()
    assert fs.pid is not None
    os.kill(fs.pid, signal.SIGKILL)
    os.waitpid(fs.pid, 0)
    fs2 = slowfs()
    assert (fs2.mountpoint / "top.txt").stat().st_size == 5
    fs.close()  # closing the dead one does not disturb the live one
    assert (fs2.mountpoint / "top.txt").stat().st_size == 5


def test_close_with_open_files_unmounts_lazily(slowfs: Callable[..., SlowFS], mnt: Path) -> None:
    fs = slowfs()
    with open(fs.mountpoint / "a/two.bin", "rb") as held:
        held.read(10)
        cwd = os.getcwd()
        os.chdir(fs.mountpoint / "a")
        try:
            fs.close()
        finally:
            os.chdir(cwd)
        assert not is_mounted(mnt)


def test_start_errors_quote_the_server(tmp_path: Path, mnt: Path) -> None:
    with pytest.raises(StorageError, match="not a directory"):
        SlowFS(tmp_path / "missing", mnt, ready_timeout=20).start()
    assert not is_mounted(mnt)


def test_final_counters_are_written_at_unmount(
    slowfs: Callable[..., SlowFS], tmp_path: Path
) -> None:
    out = tmp_path / "final.json"
    fs = slowfs(stats_file=out)
    (fs.mountpoint / "top.txt").read_bytes()
    fs.close()
    doc = json.loads(out.read_text())
    assert doc["counters"]["opens"] == 1
    assert doc["model"]["seed"] == 0
