"""Head reads keep the promises of the slow path: bytes that fail their check are never served
again from the head read that gave them."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.format.conftest import write_tree
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.clairvoyance import tell_head
from tierfeed.loader.compose import open_store
from tierfeed.storage import MemoryDriver, PosixDriver, Tier, TierStack
from tierfeed.storage.tiers import TierOptions


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
