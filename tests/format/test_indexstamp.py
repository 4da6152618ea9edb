"""Stamps of checked indexes: a large index passes its O(N) checks once per host and change."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tierfeed.format import index as index_module
from tierfeed.format import indexstamp
from tierfeed.format.index import Index
from tierfeed.format.synthindex import synthetic_index


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Stamp every index (threshold 0) into a fresh cache; count the full checks."""
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(indexstamp, "STAMP_ABOVE_BYTES", 0)
    monkeypatch.setattr(index_module, "STAMP_ABOVE_BYTES", 0)
    calls: list[int] = []
    real = index_module.check_invariants

    def spy(*args: object, **kw: object) -> None:
        calls.append(1)
        real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(index_module, "check_invariants", spy)
    return calls


def test_an_unchanged_index_is_checked_once(tmp_path: Path, counted: list[int]) -> None:
    path = tmp_path / "index.tfi"
    synthetic_index(path, 2000)
    Index(path).close()
    Index(path).close()
    assert len(counted) == 1
    assert len(list((tmp_path / "cache" / "checked").iterdir())) == 1
    Index(path, recheck=True).close()  # what `tierfeed verify` does
    assert len(counted) == 2


def test_a_change_to_the_file_checks_it_again(tmp_path: Path, counted: list[int]) -> None:
    path = tmp_path / "index.tfi"
    synthetic_index(path, 2000)
    Index(path).close()
    time.sleep(0.05)  # past the tick of the coarse clock that file times come from
    with path.open("r+b") as f:  # the same bytes written back: the ctime moves on
        data = f.read(64)
        f.seek(0)
        f.write(data)
    Index(path).close()
    assert len(counted) == 2


def test_a_damaged_copy_under_a_stamped_name_is_caught(tmp_path: Path, counted: list[int]) -> None:
    from tests.hostile import indexedit as ie
    from tierfeed.errors import IndexFormatError

    path = tmp_path / "index.tfi"
    synthetic_index(path, 2000)
    Index(path).close()
    raw = ie.edit_array(path.read_bytes(), "sample_label", lambda a: a + 5000)
    time.sleep(0.05)  # past the tick of the coarse clock that file times come from
    path.write_bytes(raw)  # another file under the same name (and inode, rewritten)
    with pytest.raises(IndexFormatError, match="labels"):
        Index(path)


def test_a_stamp_others_may_write_is_not_trusted(tmp_path: Path, counted: list[int]) -> None:
    path = tmp_path / "index.tfi"
    synthetic_index(path, 2000)
    Index(path).close()
    (stamp,) = (tmp_path / "cache" / "checked").iterdir()
    stamp.chmod(0o620)
    Index(path).close()
    assert len(counted) == 2


def test_an_unwritable_cache_only_costs_the_checks(tmp_path: Path, counted: list[int]) -> None:
    path = tmp_path / "index.tfi"
    synthetic_index(path, 2000)
    (tmp_path / "cache").write_text("a file where the cache directory would be")
    Index(path).close()
    Index(path).close()
    assert len(counted) == 2


def test_small_indexes_are_not_stamped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFEED_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "index.tfi"
    synthetic_index(path, 100)
    Index(path).close()
    assert not (tmp_path / "cache").exists()
    assert os.path.getsize(path) < indexstamp.STAMP_ABOVE_BYTES


_OPEN_AT = """
import json, sys, time
from tierfeed.format.index import Index
start = float(sys.argv[2])
while time.time() < start:  # every process opens at the same moment, as ranks do
    time.sleep(0.0005)
with Index(sys.argv[1]) as ix:
    print(json.dumps(ix.checked_here))
"""


@pytest.mark.timeout(120)
def test_processes_opening_at_once_check_once(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    path = tmp_path / "index.tfi"
    synthetic_index(path, 1_000_000)  # ~57 MB: above the stamping threshold
    with Index(path, recheck=True) as ix:
        total = sum(n for _, n in ix.header["sections"].values())
    assert total > indexstamp.STAMP_ABOVE_BYTES
    env = dict(os.environ, TIERFEED_CACHE=str(tmp_path / "cache"))
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AT, str(path), str(start)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for _ in range(4)
    ]
    checked = [json.loads(p.communicate(timeout=90)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(checked) == [False, False, False, True]  # one checked, three took its stamp


def test_a_checker_holding_on_past_the_bound_is_not_waited_for(
    tmp_path: Path, counted: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    path = tmp_path / "index.tfi"
    synthetic_index(path, 2000)
    name = indexstamp._stamp_name(path.absolute(), path.stat())
    lock = tmp_path / "cache" / "checking" / f"{name}.lock"
    lock.parent.mkdir(parents=True)
    monkeypatch.setattr(indexstamp, "CHECKER_WAIT_S", 0.3)
    with lock.open("w") as held:  # another process's check, stuck
        fcntl.flock(held, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with Index(path) as ix:
            assert ix.checked_here and len(counted) == 1
        assert 0.3 <= time.monotonic() - t0 < 5
    with Index(path) as ix:  # its stamp serves the next open
        assert not ix.checked_here
