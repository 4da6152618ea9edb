"""A read the origin never answers: the error comes within its bound, and closing returns.

The origin is a real FUSE mount (`tests.storage.faultyfs`) whose server never answers the open
of one chunk: the kernel holds the opening thread until the mount goes away, as a hung NFS
server or Lustre OST would. The hard timeout (`DeadlineOptions.hard_timeout_s`) must end the
epoch with `StuckReadError` naming the sample within that bound (before: PyTorch waited 5 s
for each worker that could not exit before the error reached the loop, so twice the bound and
more), and `Loader.close()` must return although threads are still in the kernel (before: it
joined them, for as long as the server stayed silent).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.format.conftest import write_tree
from tierfeed.errors import StuckReadError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.fuse.process import FuseProcess
from tierfeed.loader.latency import DeadlineOptions
from tierfeed.torch import Dataset, Loader, TierConfig

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

BOUND_S = 6.0  # the hard timeout under test
SLACK_S = 3.0  # start-up (fork, the store opened); the old code took 10 s more with 2 workers


def _store(tmp_path: Path) -> Path:
    files = {f"c{i % 4}/{i:03d}.bin".encode(): bytes([i]) * 3000 for i in range(240)}
    write_tree(tmp_path / "tree", files)
    pack(tmp_path / "tree", tmp_path / "store", PackOptions(chunk_size=100_000, progress=False))
    return tmp_path / "store"


def _stalled(tmp_path: Path, chunk: str) -> FuseProcess:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = [sys.executable, "-m", "tests.storage.faultyfs", str(_store(tmp_path)), str(mnt)]
    return FuseProcess([*argv, f"--fault=stall:{chunk}:1000"], mnt)


def _epoch(loader: Loader) -> float:
    """Seconds until the epoch raised StuckReadError (which names a sample of the chunk)."""
    started = time.monotonic()
    with pytest.raises(StuckReadError, match=r"000002\.tar.*hard timeout"):
        for _ in loader:
            pass
    return time.monotonic() - started


# The read path alone in this process, and a tier stack's copy threads in workers: between
# them, each thread that can be held in the kernel (a reader's, a copy's, a worker's).
@pytest.mark.parametrize(
    ("tiers", "workers"),
    [(None, 0), (TierConfig(ram_bytes=64 << 20), 2)],
    ids=["no-tier-0", "ram-2"],
)
def test_a_stuck_chunk_open_is_an_error_within_its_bound_and_close_returns(
    tmp_path: Path, workers: int, tiers: Any
) -> None:
    with _stalled(tmp_path, "000002.tar"):
        deadline = DeadlineOptions(hard_timeout_s=BOUND_S)
        ds = Dataset(tmp_path / "mnt", batch_size=16, deadline=deadline, tiers=tiers)
        loader = Loader(ds, num_workers=workers)
        took = _epoch(loader)
        assert BOUND_S <= took < BOUND_S + SLACK_S, took
        started = time.monotonic()
        loader.close()
        assert time.monotonic() - started < BOUND_S, "close waited for the stuck open"
