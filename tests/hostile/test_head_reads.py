"""Head reads keep the promises of the slow path: bytes that fail their check are never served
again from the head read that gave them, and the Loader's own first batch (read while its
workers start) is hedged past a stalled read."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.format.conftest import write_tree
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.clairvoyance import tell_head
from tierfeed.loader.compose import open_store
from tierfeed.storage import MemoryDriver, PosixDriver, Tier, TierStack
from tierfeed.storage.store import Sample
from tierfeed.storage.tiers import TierOptions
from tierfeed.torch import Dataset, Loader, TierConfig
from tierfeed.torch.dataset import feed_of


class DamagesOneRangedRead(PosixDriver):
    """An origin whose first head read (on a tierfeed-head thread) comes back with a byte
    flipped, as a bad transfer would; every later read is whole."""

    damaged = 0

    def read_block(self, name: str, offset: int, length: int) -> bytes:
        data = super().read_block(name, offset, length)
        if self.damaged or not threading.current_thread().name.startswith("tierfeed-head"):
            return data
        self.damaged += 1
        return bytes([data[0] ^ 0xFF]) + data[1:]


@pytest.fixture
def two_member_store(tmp_path: Path) -> Path:
    """Samples of two members each (an image and its label), in many small chunks."""
    files: dict[bytes, bytes] = {}
    for i in range(60):
        files[f"s/x{i:03d}.bin".encode()] = os.urandom(3000)
        files[f"s/x{i:03d}.cls".encode()] = str(i % 7).encode()
    write_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "store", PackOptions(chunk_size=8 * 1024, progress=False))
    return tmp_path / "store"


@pytest.mark.timeout(60)
def test_a_damaged_head_read_is_dropped_and_its_sample_read_again(two_member_store: Path) -> None:
    origin = DamagesOneRangedRead(two_member_store, read_only=True)
    ram = Tier(MemoryDriver(), quota=10**9, name="ram")
    options = TierOptions(threads=1, landing_wait_s=5)
    chunks = Index(two_member_store).chunks()
    with TierStack(chunks, origin, [ram], options=options) as stack:
        assert len(chunks) > stack.filler.copies_at_once  # the whole head is read ahead
        with open_store(two_member_store, source=stack) as store:
            every = np.arange(store.index.num_samples, dtype=np.int64)
            assert all(len(list(store.index.members(int(i)))) == 2 for i in every)
            assert tell_head(store, every) == len(every)
            mine = open_store(two_member_store)
            for i in every:  # the damaged one among them: dropped, read again, whole
                assert store.read_sample(int(i)).fields == mine.read_sample(int(i)).fields
            assert origin.damaged == 1


class HoldsTheLoadersFirstHeadRead(PosixDriver):
    """In the test's own process, the first head read (the Loader's first batch, read while
    its workers start) stalls ``stall_s``, or comes back with a byte flipped (``damage``);
    every other read, and every read of a worker, is the origin's."""

    stall_s = 0.0
    damage = False
    held = 0

    def read_block(self, name: str, offset: int, length: int) -> bytes:
        data = super().read_block(name, offset, length)
        mine = os.getpid() == PID and threading.current_thread().name.startswith("tierfeed-head")
        if not mine or HoldsTheLoadersFirstHeadRead.held:
            return data
        HoldsTheLoadersFirstHeadRead.held += 1
        if self.damage:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        time.sleep(self.stall_s)
        return data


PID = os.getpid()


def _number(sample: Sample) -> int:
    return int(sample.key.rsplit("x", 1)[1])


def _first_batch(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **hold: Any) -> Any:
    """The Loader's first batch (2 workers, a disk tier) through `HoldsTheLoadersFirstHeadRead`,
    its time from the iteration's start, and the plan's first batch."""
    monkeypatch.setattr("tierfeed.loader.location.PosixDriver", HoldsTheLoadersFirstHeadRead)
    for name, value in hold.items():
        monkeypatch.setattr(HoldsTheLoadersFirstHeadRead, name, value)
    monkeypatch.setattr(HoldsTheLoadersFirstHeadRead, "held", 0)
    tiers = TierConfig(disk_dir=str(tmp_path / "cache"), disk_bytes=10**9)
    ds = Dataset(store, "global", batch_size=8, decode=_number, collate=list, tiers=tiers)
    index = feed_of(ds).plan_index()
    planned = [int(index.key(int(i)).rsplit("x", 1)[1]) for i in feed_of(ds).rank_order(0)]
    with Loader(ds, num_workers=2) as loader:
        started = time.monotonic()
        batches = iter(loader)
        first = next(batches)
        took = time.monotonic() - started
        rest = [n for batch in batches for n in batch]
    assert HoldsTheLoadersFirstHeadRead.held == 1  # the Loader's own head read was held
    assert sorted(first) == sorted(planned[:8])  # worker 0's first batch, each sample once
    assert sorted(first + rest) == sorted(planned)
    return took


@pytest.mark.timeout(60)
def test_a_stalled_read_of_the_loaders_first_batch_is_hedged(
    two_member_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    took = _first_batch(two_member_store, tmp_path, monkeypatch, stall_s=6.0)
    assert took < 3.0  # the guard's blocked hedge read it another way, not after the stall


@pytest.mark.timeout(60)
def test_a_damaged_read_of_the_loaders_first_batch_is_read_again(
    two_member_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_batch(two_member_store, tmp_path, monkeypatch, damage=True)
