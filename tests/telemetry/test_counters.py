"""The one counters type: thread-safe changes, snapshots, and sums and differences of them."""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass, field

from tierfeed.loader.stream import StreamCounters
from tierfeed.slowfs.stats import Counters as SlowFSCounters
from tierfeed.storage.driver import OpCounters
from tierfeed.storage.tiers import TierCounters
from tierfeed.telemetry import GAUGES, Counters, combine, since


@dataclass
class Sample(Counters[float]):
    reads: int = 0
    wait_s: float = 0.0
    longest_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def test_add_set_peak_and_snapshot() -> None:
    c = Sample()
    c.add(reads=2, wait_s=0.5)
    c.set(reads=7)
    c.peak(longest_s=0.3)
    c.peak(longest_s=0.1)
    c.notes.append("not a counter")
    assert c.snapshot() == {"reads": 7, "wait_s": 0.5, "longest_s": 0.3}
    c.update(add={"reads": 1}, peak={"longest_s": 0.9})
    assert (c.reads, c.longest_s) == (8, 0.9)


def test_built_from_initial_values() -> None:
    c = Counters(opens=0, delay_s=0.0)
    c.add(opens=1)
    assert c.snapshot() == {"opens": 1, "delay_s": 0.0}


def test_adds_from_many_threads_are_not_lost() -> None:
    c = Sample()

    def bump() -> None:
        for _ in range(2000):
            c.add(reads=1)

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.reads == 16000


def test_equality_repr_and_pickle_ignore_the_lock() -> None:
    a, b = Sample(reads=1), Sample(reads=1)
    assert a == b and "_mutex" not in repr(a)
    c = pickle.loads(pickle.dumps(a))
    assert c == a
    c.add(reads=1)  # a lock of its own
    assert c.reads == 2


def test_every_component_counter_is_one() -> None:
    for counters in (TierCounters(), OpCounters(), StreamCounters()):
        assert isinstance(counters, Counters)
    assert list(OpCounters().snapshot()) == [
        "opens", "reads", "bytes_read", "writes", "bytes_written", "links", "deletes", "stats",
        "lists", "retries",
    ]  # fmt: skip
    assert "waits" not in StreamCounters().snapshot()
    assert not hasattr(StreamCounters(), "stall_s")


def test_slowfs_counters_keep_their_interface() -> None:
    c = SlowFSCounters()
    c.count("reads")
    c.count("bytes_read", 100)
    c.delayed(0.2, stalled=True, queued=0.1)
    c.delayed(0.1, stalled=False)
    snap = c.snapshot()
    assert (snap.reads, snap.bytes_read, snap.stalls) == (1, 100, 1)
    assert snap.delay_s == 0.2 + 0.1 and snap.queued_s == 0.1 and snap.max_delay_s == 0.2
    assert isinstance(snap.reads, int) and isinstance(snap.delay_s, float)


def test_combine_adds_counters_and_counts_a_shared_directory_once() -> None:
    worker = {
        "ram": {"hits": 1, "held_bytes": 10, "shared": 0},
        "disk": {"hits": 2, "held_bytes": 100, "shared": 1},
        "origin": {"bytes": 5, "ops": {"reads": 1}},
    }
    later = {
        "ram": {"hits": 3, "held_bytes": 20, "shared": 0},
        "disk": {"hits": 4, "held_bytes": 120, "shared": 1},
        "origin": {"bytes": 7},
    }
    total = combine([worker, later])
    assert total["ram"] == {"hits": 4, "held_bytes": 30, "shared": 0}
    assert total["disk"] == {"hits": 6, "held_bytes": 120, "shared": 1}
    assert total["origin"] == {"bytes": 12}  # nested dicts are not numbers: left out


def test_since_differences_counters_but_not_gauges() -> None:
    base = {"disk": {"hits": 2.0, "held_bytes": 100.0, "shared": 1.0}}
    now = {"disk": {"hits": 5.0, "held_bytes": 80.0, "shared": 1.0}, "new": {"hits": 1.0}}
    assert since(now, base) == {
        "disk": {"hits": 3.0, "held_bytes": 80.0, "shared": 1.0},
        "new": {"hits": 1.0},
    }
    assert {"held_bytes", "shared", "inflight", "origin_mbps", "piece_kib"} == GAUGES


def test_a_setting_of_several_processes_is_their_largest_not_a_sum() -> None:
    workers = [
        {"fetch": {"pieces": 3, "piece_kib": 4096, "inflight": 4, "origin_mbps": 100.0}},
        {"fetch": {"pieces": 2, "piece_kib": 2048, "inflight": 6, "origin_mbps": 150.0}},
    ]
    # Requests in flight and throughput of the host are the workers' sums; a piece is a size.
    assert combine(workers) == {
        "fetch": {"pieces": 5, "piece_kib": 4096, "inflight": 10, "origin_mbps": 250.0}
    }
