"""A read of the index that hangs, hedged (issue 45): no process's start-up waits on it.

The origin is a real FUSE mount (`tests.storage.faultyfs`) that never answers one request of
the store's index: its open (``stall``) or a read of it (``hang``), as an NFS server or a
Lustre OST now and then does not. The thread that made the request is held in the kernel
until the mount goes away; a second request of the file is answered. The training process
opens the index to plan, and each worker opens it again: each open that hangs is made again
past the page cache after `_AGAIN_S` (`tierfeed.hedging.first_to_end`), and the first to end
is the index. Before, the job waited on the mount for as long as it held the request.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from tests.format.conftest import write_tree
from tierfeed.format import indexfile
from tierfeed.format.pack import PackOptions, pack
from tierfeed.fuse.process import FuseProcess
from tierfeed.loader.latency import DeadlineOptions
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

N = 120
MARGIN_S = 3.0  # a second open and read through FUSE, fork and start-up on 2 busy cores


def _number(sample: Sample) -> torch.Tensor:
    return torch.tensor(int(sample.fields["bin"].split(b":")[0]))


@pytest.mark.parametrize("fault", ["stall:index.tfi:1", "hang:index.tfi:2"])
def test_an_index_request_that_is_never_answered_holds_no_start_up(
    tmp_path: Path, fault: str
) -> None:
    files = {f"c{i % 3}/{i:03d}.bin".encode(): f"{i}:".encode().ljust(2000, b"x") for i in range(N)}
    write_tree(tmp_path / "tree", files)
    pack(tmp_path / "tree", tmp_path / "store", PackOptions(chunk_size=80_000, progress=False))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = [sys.executable, "-m", "tests.storage.faultyfs", str(tmp_path / "store"), str(mnt)]
    with FuseProcess([*argv, f"--fault={fault}"], mnt):
        started = time.monotonic()
        ds = Dataset(
            mnt, batch_size=16, decode=_number, deadline=DeadlineOptions(hard_timeout_s=60)
        )
        opened = time.monotonic() - started
        # The workers open the index again: with ``hang:...:2`` one of them meets the second
        # request never answered.
        loader = Loader(ds, num_workers=2)
        started = time.monotonic()
        keys = [k for batch in loader for k in batch.tolist()]
        epoch = time.monotonic() - started
        loader.close()
    assert sorted(keys) == list(range(N))  # every sample once
    assert opened < indexfile._AGAIN_S + MARGIN_S, opened
    assert epoch < indexfile._AGAIN_S + 2 * MARGIN_S, epoch
