"""An open that hangs once, hedged (issue 45): the batch waits for the deadline and one more
read, not for the open.

The origin is a real FUSE mount (`tests.storage.faultyfs`) whose server never answers the
first open of one chunk, as an NFS server or a Lustre OST does now and then: the thread that
opened it is held in the kernel until the mount goes away. Every later open of the file is
answered. The reads of that chunk that wait for the held open are late; the guard hands the
batch the reads ahead while any is ready, and when the batch would wait on such a read alone
it reads the sample a second way (a second open of the chunk, straight from the origin).
Before, the epoch waited for the hard timeout and ended with `StuckReadError`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.format.conftest import write_tree
from tierfeed.format.pack import PackOptions, pack
from tierfeed.fuse.process import FuseProcess
from tierfeed.loader.latency import DeadlineOptions
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader, TierConfig
from tierfeed.torch.workers import STOP_S

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(150)]

DEADLINE_MS = 200.0
MARGIN_S = 3.0  # a hedge's open and read through FUSE, fork and start-up on 2 busy cores
N = 240


def _mounted(tmp_path: Path) -> FuseProcess:
    files = {f"c{i % 4}/{i:03d}.bin".encode(): f"{i}:".encode().ljust(3000, b"x") for i in range(N)}
    write_tree(tmp_path / "tree", files)
    store = tmp_path / "store"
    pack(tmp_path / "tree", store, PackOptions(chunk_size=100_000, progress=False))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = [sys.executable, "-m", "tests.storage.faultyfs", str(store), str(mnt)]
    return FuseProcess([*argv, "--fault=stall:000002.tar:1"], mnt)


def _number(sample: Sample) -> torch.Tensor:
    return torch.tensor(int(sample.fields["bin"].split(b":")[0]))


@pytest.mark.parametrize(
    ("tiers", "workers"),
    [(None, 0), (TierConfig(ram_bytes=64 << 20), 2), ("disk", 2)],
    ids=["no-tier", "ram-2-workers", "disk-2-workers"],
)
def test_an_open_that_hangs_once_holds_no_batch_past_its_deadline(
    tmp_path: Path, workers: int, tiers: Any
) -> None:
    if tiers == "disk":
        tiers = TierConfig(disk_dir=str(tmp_path / "tier"))
    with _mounted(tmp_path):
        deadline = DeadlineOptions(fixed_ms=DEADLINE_MS, hard_timeout_s=60)
        ds = Dataset(
            tmp_path / "mnt", batch_size=16, deadline=deadline, tiers=tiers, decode=_number
        )
        loader = Loader(ds, num_workers=workers)
        keys: list[int] = []
        waits: list[float] = []
        asked = time.monotonic()
        for batch in loader:
            waits.append(time.monotonic() - asked)
            keys += batch.tolist()
            asked = time.monotonic()
        started = time.monotonic()
        loader.close()
        closed = time.monotonic() - started
    assert sorted(keys) == list(range(N))  # every sample once
    assert max(waits[1:]) < DEADLINE_MS / 1000 + MARGIN_S, waits
    assert waits[0] < DEADLINE_MS / 1000 + 2 * MARGIN_S, waits  # start-up: fork, opens
    # A worker with a thread held in the kernel cannot exit until the mount answers: close
    # gives up on it after its bound (PyTorch kills it in the background).
    assert closed < STOP_S + 2, "close waited for the held open past its bound"
