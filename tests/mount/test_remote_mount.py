"""`tierfeed mount` of a store at an S3 URL (moto's server on loopback): the tree, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.format.conftest import QUIET, read_tree, write_tree
from tests.objectstore import env, upload
from tierfeed.format.pack import pack
from tierfeed.fuse.process import FuseProcess, is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

FILES = {f"d{i % 4}/f{i:03d}.dat".encode(): os.urandom(500 + 3001 * i % 40_000) for i in range(50)}


@pytest.mark.parametrize("tiered", [False, True])
def test_mount_an_s3_store_and_cmp_every_file(
    tmp_path: Path, s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch, tiered: bool
) -> None:
    write_tree(tmp_path / "src", FILES)
    pack(tmp_path / "src", tmp_path / "store", QUIET)
    url = upload(s3_endpoint, tmp_path / "store", bucket, "tree")
    for name, value in {**env(s3_endpoint), "TIERFEED_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)  # the mount process takes the SDK's own settings
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = [sys.executable, "-m", "tierfeed", "mount", url, str(mnt), "--foreground"]
    if tiered:
        argv += ["--disk", str(tmp_path / "disk"), "--disk-size", "1GiB"]
    with FuseProcess(argv, mnt):
        assert read_tree(mnt) == FILES
        for rel in (b"d0/f000.dat", b"d3/f047.dat"):
            done = subprocess.run(["cmp", tmp_path / "src" / rel.decode(), mnt / rel.decode()])
            assert done.returncode == 0
    assert not is_mounted(mnt)
