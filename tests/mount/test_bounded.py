"""The mount's bounded member loads: a stuck load is an error within the timeout, its late
bytes are handed on, other loads are not held behind it, and errors pass through."""

from __future__ import annotations

import threading
import time

import pytest

from tierfeed.errors import ChunkCorruptError
from tierfeed.mount.bounded import BoundedLoads, LoadTimeoutError

pytestmark = pytest.mark.timeout(30)


def test_a_stuck_load_times_out_and_its_late_bytes_are_handed_on() -> None:
    release = threading.Event()
    late: list[tuple[int, bytes]] = []

    def load(member: int) -> bytes:
        if member == 0:
            release.wait(10)
        if member == 2:
            raise ChunkCorruptError("member 2 fails its checksum")
        return b"m%d" % member

    loads = BoundedLoads(load, 0.3, late=lambda m, d: late.append((m, d)), threads=2)
    started = time.monotonic()
    with pytest.raises(LoadTimeoutError, match=r"within 0.3 s .*--timeout"):
        loads(0)
    assert 0.25 < time.monotonic() - started < 2
    assert loads(1) == b"m1"  # not held behind the stuck one
    with pytest.raises(ChunkCorruptError):
        loads(2)
    release.set()
    deadline = time.monotonic() + 5
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late == [(0, b"m0")]
    loads.close()


def test_every_thread_stuck_then_later_loads_time_out_too() -> None:
    release = threading.Event()
    loads = BoundedLoads(lambda m: b"x" * release.wait(10), 0.2, late=lambda m, d: None, threads=1)
    for member in range(2):
        with pytest.raises(LoadTimeoutError):
            loads(member)
    release.set()
    loads.close()
