"""Counters count what reached the server, and the seeded latency model is applied to it."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tierfeed.latency import LatencyModel, LatencySampler
from tierfeed.slowfs import SlowFS, SlowFSOptions

from .conftest import TREE

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(60)]

FILES = sorted(TREE)
TOTAL = sum(TREE.values())
# Every lookup and stat reaches the server: op counts do not depend on timing.
UNCACHED = SlowFSOptions(attr_timeout=0.0, entry_timeout=0.0)


def read_all(root: Path, names: list[str] = FILES) -> int:
    return sum(len((root / name).read_bytes()) for name in names)


def test_counters_count_opens_reads_and_bytes(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs()
    assert read_all(fs.mountpoint) == TOTAL
    s = fs.stats()
    assert s.opens == len(FILES)
    assert s.bytes_read == TOTAL
    # 1 MiB needs several read requests; the kernel decides their size (128 KiB or more).
    assert len(FILES) < s.reads <= len(FILES) + TOTAL // (128 << 10) + 1
    assert s.stats >= len(FILES)
    assert (s.delay_s, s.stalls, s.errors) == (0.0, 0, 0)
    fs.reset()
    (fs.mountpoint / "top.txt").read_bytes()
    again = fs.stats()
    assert (again.opens, again.bytes_read) == (1, TREE["top.txt"])
    assert fs.total_stats().opens == len(FILES) + 1
    sorted(p.name for p in fs.mountpoint.iterdir())
    assert fs.stats().readdirs == 1


def test_every_epoch_reaches_the_origin_by_default(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs()
    for epoch in range(1, 3):
        read_all(fs.mountpoint)
        assert fs.stats().bytes_read == epoch * TOTAL
        assert fs.stats().opens == epoch * len(FILES)


def test_cache_keep_serves_epoch_two_from_the_page_cache(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs(options=SlowFSOptions(cache="keep"))
    read_all(fs.mountpoint)
    read_all(fs.mountpoint)
    s = fs.stats()
    assert s.opens == 2 * len(FILES)  # opens still reach the server
    assert s.bytes_read == TOTAL


def test_cache_direct_passes_the_callers_read_size(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs(options=SlowFSOptions(cache="direct"))
    with open(fs.mountpoint / "a/two.bin", "rb", buffering=0) as f:
        while f.read(10_000):
            pass
    s = fs.stats()
    assert s.bytes_read == TREE["a/two.bin"]
    assert s.reads == math.ceil(TREE["a/two.bin"] / 10_000) + 1  # +1: the read that sees EOF


def test_injected_delay_is_the_models_sequence(slowfs: Callable[..., SlowFS]) -> None:
    # Without a bandwidth cap the total is the sum of the first `ops` draws, whatever
    # order the operations arrived in.
    model = LatencyModel(median_ms=2.0, sigma=1.0, seed=7)
    fs = slowfs(model, UNCACHED)
    read_all(fs.mountpoint)
    s = fs.stats()
    sampler = LatencySampler(model)
    assert s.delay_s == pytest.approx(sum(sampler.delay() for _ in range(s.ops)), rel=1e-9)
    other = LatencySampler(LatencyModel(median_ms=2.0, sigma=1.0, seed=8))
    assert s.delay_s != pytest.approx(sum(other.delay() for _ in range(s.ops)), rel=1e-6)


def test_latency_is_slept_and_overlaps_across_threads(slowfs: Callable[..., SlowFS]) -> None:
    model = LatencyModel(median_ms=20.0)  # sigma 0: every operation takes exactly 20 ms
    fs = slowfs(model, UNCACHED)
    names = ["top.txt", "a/one.bin", "b/empty.bin", "b/name with space é.txt"] * 2
    t0 = time.monotonic()
    read_all(fs.mountpoint, names)
    serial_s = time.monotonic() - t0
    s = fs.reset()
    assert s.opens == len(names)
    assert s.delay_s == pytest.approx(0.020 * s.ops)
    assert serial_s >= 0.9 * s.delay_s  # one reader: every delay is waited for in turn
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(lambda n: len((fs.mountpoint / n).read_bytes()), names))
    parallel_s = time.monotonic() - t0
    assert sum(sizes) == sum(TREE[n] for n in names)
    assert fs.stats().delay_s == pytest.approx(s.delay_s, rel=0.3)
    assert parallel_s < 0.6 * fs.stats().delay_s  # 8 readers: the sleeps overlap


def test_bandwidth_cap_charges_bytes(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs(LatencyModel(bandwidth_mbps=20.0))
    t0 = time.monotonic()
    assert read_all(fs.mountpoint, ["a/deep/three.bin"]) == 1 << 20
    elapsed = time.monotonic() - t0
    s = fs.stats()
    # Every byte read is charged; under load the kernel may read a page twice (seen in a full
    # run: 8 KiB more than the file), so the charge follows the bytes read, not the file.
    assert s.bytes_read >= 1 << 20
    assert s.delay_s == pytest.approx(s.bytes_read / 20e6)
    assert elapsed >= 0.9 * (1 << 20) / 20e6


def test_stalls_are_counted(slowfs: Callable[..., SlowFS]) -> None:
    fs = slowfs(LatencyModel(tail_prob=1.0, stall_ms=5.0, bandwidth_mbps=1000.0))
    read_all(fs.mountpoint, ["a/two.bin", "top.txt"])
    s = fs.stats()
    assert s.stalls == s.ops > 0
    assert s.max_delay_s >= 0.005


def test_opens_stall_apart_from_reads(slowfs: Callable[..., SlowFS]) -> None:
    """``open_tail_prob`` stalls opens only (a metadata server's slow answer); the ``stalls``
    preset is the shared file system of the start-up benchmarks."""
    fs = slowfs(LatencyModel(open_tail_prob=1.0, open_stall_ms=50.0))
    t0 = time.monotonic()
    read_all(fs.mountpoint, ["a/two.bin", "top.txt"])
    s = fs.stats()
    assert time.monotonic() - t0 >= 2 * 0.05
    assert s.stalls == s.opens == 2 and s.reads > 0
    stalls = LatencyModel.parse("stalls")
    assert (stalls.tail_prob, stalls.stall_ms) == (1e-4, 2000.0)
    assert (stalls.open_tail_prob, stalls.open_stall_ms) == (0.01, 150.0)


def test_the_status_names_each_stall_and_when(slowfs: Callable[..., SlowFS]) -> None:
    """``stats.json`` lists the latest stalls (what, where, when): a benchmark places its
    waits against them."""
    fs = slowfs(LatencyModel(open_tail_prob=1.0, open_stall_ms=20.0))
    read_all(fs.mountpoint, ["a/two.bin", "top.txt"])
    status = json.loads((fs.mountpoint / ".slowfs" / "stats.json").read_bytes())
    assert [(s["op"], s["path"]) for s in status["stalls"]] == [
        ("open", "/a/two.bin"),
        ("open", "/top.txt"),
    ]
    first, second = status["stalls"]
    assert 0 <= first["at_s"] <= second["at_s"] <= status["uptime_s"]
    assert first["seconds"] >= 0.02
