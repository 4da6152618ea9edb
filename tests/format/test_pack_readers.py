"""pack's reader count follows what the reads cost: the cores for reads that compute, more
for reads that wait on storage; the store's bytes never depend on it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.format.conftest import read_tree, write_tree
from tierfeed import verify_store
from tierfeed.format import pack as pack_module
from tierfeed.format.pack import PackOptions, pack
from tierfeed.format.packreads import ReaderCount


def test_reader_count_starts_at_the_cores_and_never_passes_the_most() -> None:
    assert ReaderCount(start=2, most=16).active == 2
    assert ReaderCount(start=32, most=16).active == 16
    assert ReaderCount(start=0, most=0).active == 1
    count = ReaderCount(start=1, most=3)
    for _ in range(100):
        count.observe(wait=0.010, cpu=0.0001)
    assert count.active == 3


def test_reader_count_grows_only_when_most_reads_wait() -> None:
    computing = ReaderCount(start=2, most=16)
    for i in range(400):  # a read preempted now and then: a few long waits among many
        computing.observe(wait=0.005 if i % 5 == 0 else 0.0, cpu=0.00003)
    assert computing.active == 2
    waiting = ReaderCount(start=2, most=16)
    for _ in range(40):
        waiting.observe(wait=0.002, cpu=0.00003)
    assert waiting.active > 4


class _Concurrency:
    """Wraps pack's read to record how many reads ran at once."""

    def __init__(self, read: Any, cost: Any) -> None:
        self.read, self.cost = read, cost
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, f: Any, view: memoryview) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            self.cost()
            self.read(f, view)
        finally:
            with self.lock:
                self.now -= 1


def _local() -> None:
    """A read from the page cache: a copy, on a CPU, with no wait."""


@pytest.mark.parametrize(
    ("cost", "low", "high"), [(_local, 1, 1), (lambda: time.sleep(0.003), 3, 4)]
)
def test_pack_reads_with_the_cores_then_more_while_reads_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cost: Any, low: int, high: int
) -> None:
    files = {f"c{i % 3}/f{i:04d}.jpg".encode(): bytes([i % 251]) * (100 + i) for i in range(600)}
    write_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "one", PackOptions(workers=1, progress=False))
    reads = _Concurrency(pack_module.read_source_into, cost)
    monkeypatch.setattr(pack_module, "read_source_into", reads)
    monkeypatch.setattr("tierfeed.format.packreads.os.cpu_count", lambda: 1)
    monkeypatch.setattr("tierfeed.format.packreads._RUN_FILES", 5)
    out = tmp_path / "out"
    pack(tmp_path / "src", out, PackOptions(workers=4, progress=False))
    assert low <= reads.most <= high
    assert read_tree(out) == read_tree(tmp_path / "one")
    assert verify_store(out, progress=False) == []
