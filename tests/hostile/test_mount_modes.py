"""`tierfeed mount --allow-other` enforces the modes it shows (issue 44).

Root mounts, with --allow-other, a store packed from a tree holding private files; another
user (nobody) gets exactly what the shown modes give it: no file under a 0700 directory, no
0600 file, but a 0644 file in a 0755 directory; root still reads everything.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.format.conftest import QUIET, write_tree
from tests.hostile.conftest import NOBODY, empty_mountpoint
from tierfeed.format.pack import pack
from tierfeed.fuse.process import FuseProcess, is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

FILES = {
    b"d/s.txt": b"secret in a private directory\n",  # d is 0700, s.txt 0600
    b"d/t.txt": b"readable file in a private directory\n",  # 0644, but d is 0700
    b"p/own.txt": b"private file in an open directory\n",  # 0600 in a 0755 directory
    b"p/pub.txt": b"public\n",  # 0644 in a 0755 directory
}
MODES = {"d": 0o700, "d/s.txt": 0o600, "d/t.txt": 0o644, "p": 0o755}
MODES |= {"p/own.txt": 0o600, "p/pub.txt": 0o644, ".": 0o755}

# A child that becomes nobody and reads one file, printing the errno name or the bytes.
READ_AS = """
import errno, os, sys
os.setgid(int(sys.argv[1])); os.setgroups([]); os.setuid(int(sys.argv[1]))
try:
    with open(sys.argv[2], "rb") as fh:
        sys.stdout.buffer.write(b"OK:" + fh.read())
except OSError as exc:
    sys.stdout.write(errno.errorcode[exc.errno])
"""


def read_as(uid: int, path: Path) -> str:
    """What ``uid`` gets reading ``path``: ``OK:<text>`` or an errno name (EACCES)."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", READ_AS, str(uid), str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def private_store(tmp_path: Path) -> Path:
    """A store in a 0700 directory, packed from a tree with private files and directories."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount with --allow-other and to read as user nobody")
    src = tmp_path / "src"
    write_tree(src, FILES)
    for rel, mode in sorted(MODES.items(), key=lambda kv: -kv[0].count("/")):
        (src / rel).chmod(mode)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    pack(src, home / "store", QUIET)
    return home / "store"


@pytest.fixture
def shared_mnt(nobody_dir: Path) -> Iterator[Path]:
    """An empty mountpoint nobody can reach, unmounted (lazily) whatever the test did."""
    with empty_mountpoint(nobody_dir / "mnt") as path:
        yield path


def test_allow_other_mount_enforces_shown_modes(private_store: Path, shared_mnt: Path) -> None:
    argv = [sys.executable, "-m", "tierfeed", "mount", str(private_store), str(shared_mnt)]
    with FuseProcess([*argv, "--foreground", "--allow-other"], shared_mnt):
        # The modes shown are the tree's.
        for rel, mode in MODES.items():
            assert (shared_mnt / rel).stat().st_mode & 0o7777 == mode, rel
        # Another user gets what those modes give it, and nothing more.
        assert read_as(NOBODY, shared_mnt / "p" / "pub.txt") == "OK:public\n"
        for rel in ("d/s.txt", "d/t.txt", "p/own.txt"):
            assert read_as(NOBODY, shared_mnt / rel) == errno.errorcode[errno.EACCES], rel
        listing = subprocess.run(
            ["runuser", "-u", "nobody", "--", "ls", str(shared_mnt / "d")],
            capture_output=True,
            timeout=30,
        )
        assert listing.returncode != 0 and b"s.txt" not in listing.stdout
        # The mounting user (root) still reads everything.
        for name, data in FILES.items():
            assert (shared_mnt / os.fsdecode(name)).read_bytes() == data
        # The chunks were never readable by nobody either: the mount was the only way in.
        chunk = next((private_store / "chunks").iterdir())
        assert read_as(NOBODY, chunk) == errno.errorcode[errno.EACCES]
    assert not is_mounted(shared_mnt)
