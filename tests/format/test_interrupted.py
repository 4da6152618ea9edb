"""An interrupted pack leaves no store that opens; running it again resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.format.conftest import read_tree, write_tree
from tierfeed import open_store, verify_store
from tierfeed.errors import IndexFormatError
from tierfeed.format.pack import JOURNAL, PackOptions, pack
from tierfeed.publish import is_temporary

# A child that packs slowly (each file read is delayed) so the test can kill it mid-pack.
CHILD = """
import sys, time
from tierfeed.format import pack as p
real = p.read_source_into
def slow(f, view):
    time.sleep(0.01)
    real(f, view)
p.read_source_into = slow
p.pack(sys.argv[1], sys.argv[2], p.PackOptions(chunk_size=16384, workers=1, progress=False))
"""


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_kill_9_mid_pack_then_resume(tmp_path: Path) -> None:
    files = {f"c{i % 4}/f{i:04d}.bin".encode(): os.urandom(3000 + i) for i in range(400)}
    write_tree(tmp_path / "src", files)
    src, dst = tmp_path / "src", tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(dst)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            journal = dst / JOURNAL
            if journal.exists() and journal.read_text().count("\n") >= 3:
                break
            assert child.poll() is None, "the child pack finished before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("the child pack never finished a chunk")
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=10)
    with pytest.raises(IndexFormatError, match="no index here"):
        open_store(dst)
    options = PackOptions(chunk_size=16384, workers=2, progress=False)
    report = pack(src, dst, options)
    assert report.resumed_chunks >= 3
    assert verify_store(dst, progress=False) == []
    assert not (dst / JOURNAL).exists()
    assert not [p for p in (dst / "chunks").iterdir() if is_temporary(p.name)]
    # Identical to an uninterrupted pack of the same tree.
    pack(src, tmp_path / "fresh", options)
    assert read_tree(dst) == read_tree(tmp_path / "fresh")


def test_resume_keeps_unchanged_chunks_and_rewrites_changed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"c/f{i:03d}.bin".encode(): bytes([i]) * 3000 for i in range(40)}
    write_tree(tmp_path / "src", files)
    options = PackOptions(chunk_size=16384, progress=False)
    dst = tmp_path / "store"

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # the pack dies after its chunks, before the index appears

    with monkeypatch.context() as m:
        m.setattr("tierfeed.format.pack.write_index", crash)
        with pytest.raises(KeyboardInterrupt):
            pack(tmp_path / "src", dst, options)
    assert (dst / JOURNAL).exists()
    with pytest.raises(IndexFormatError):
        open_store(dst)
    target = tmp_path / "src" / "c" / "f000.bin"
    target.write_bytes(b"changed" * 100)
    report = pack(tmp_path / "src", dst, options)
    assert report.resumed_chunks == report.chunks - 1  # only the chunk of f000 is rewritten
    with open_store(dst) as store:
        assert store.read_sample(0).fields["bin"] == b"changed" * 100
        assert store.read_sample(39).fields["bin"] == bytes([39]) * 3000
    assert verify_store(dst, progress=False) == []
