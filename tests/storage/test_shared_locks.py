"""The shared disk tier's locks against a fork and against a holder that does not let go.

A lock taken with flock belongs to the open file, and a process forked while it is held (a
DataLoader worker started as a copy thread places a chunk) shares that open file: let go by
closing the descriptor alone, the lock stays held by the worker for as long as it lives, and
every later placement on the host waits on it. And a placement waits for another process at
most its bound, then leaves the copy unplaced; the read is served all the same.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.storage.test_tiers import read_all, stack
from tierfeed import cachedir
from tierfeed.format.index import Index
from tierfeed.loader.compose import open_store
from tierfeed.storage.shared_dir import copy_claim, placement_lock
from tierfeed.storage.tiers import disk_tier

pytestmark = pytest.mark.timeout(60)

FORK = multiprocessing.get_context("fork")


def _hold(root: str, taken: object, release: object) -> None:
    with placement_lock(root):
        taken.set()  # type: ignore[attr-defined]
        release.wait(30)  # type: ignore[attr-defined]


def test_a_process_forked_while_the_lock_is_held_does_not_keep_it(tmp_path: Path) -> None:
    with placement_lock(tmp_path):
        worker = FORK.Process(target=time.sleep, args=(30,), daemon=True)
        worker.start()  # shares the locked open file, and outlives this placement
    try:
        started = time.monotonic()
        with placement_lock(tmp_path, wait_s=5):
            pass
        assert time.monotonic() - started < 1.0
    finally:
        worker.kill()
        worker.join(5)


def test_a_claim_forked_while_held_is_free_once_its_holder_lets_go(tmp_path: Path) -> None:
    with copy_claim(tmp_path, "k") as mine:
        assert mine
        worker = FORK.Process(target=time.sleep, args=(30,), daemon=True)
        worker.start()
    try:
        with copy_claim(tmp_path, "k") as again:
            assert again  # not "another process copies it" for as long as the worker lives
    finally:
        worker.kill()
        worker.join(5)


def test_the_placement_lock_is_waited_for_at_most_its_bound(tmp_path: Path) -> None:
    taken, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold, args=(str(tmp_path), taken, release), daemon=True)
    holder.start()
    try:
        assert taken.wait(20)
        started = time.monotonic()
        waiting = placement_lock(tmp_path, wait_s=0.3)
        with pytest.raises(TimeoutError, match=r"\.tier\.lock: another process held"):
            waiting.__enter__()
        assert 0.3 <= time.monotonic() - started < 2.0
    finally:
        release.set()
        holder.join(10)
    with placement_lock(tmp_path, wait_s=5):  # given back with its holder's placement
        pass


def test_a_held_lock_is_tried_again_at_most_a_few_ms_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter of a held lock sleeps between its tries, longer each time but never past
    `LOCK_POLL_MAX_S`: the lock is held for a placement decision, and a waiter asleep for
    50 ms took it long after it was let go, while the reads waited for its copy. Past the
    bound it gives up (False)."""
    clock = [0.0]
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        clock[0] += seconds

    def held(fd: int, how: int) -> None:
        raise BlockingIOError(errno.EWOULDBLOCK, "held")

    monkeypatch.setattr(cachedir.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cachedir.time, "sleep", sleep)
    monkeypatch.setattr(cachedir.fcntl, "flock", held)
    with open(tmp_path / "lock", "w") as f:
        assert not cachedir.lock_within(f.fileno(), 0.5)
    assert pauses[0] == 0.001 and max(pauses) == cachedir.LOCK_POLL_MAX_S
    assert pauses == sorted(pauses) and 0.5 <= clock[0] <= 0.5 + cachedir.LOCK_POLL_MAX_S


@contextlib.contextmanager
def _held_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache directory whose placement lock another process holds (waited for 0.2 s)."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr("tierfeed.storage.shared_dir.LOCK_WAIT_S", 0.2)
    taken, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold, args=(str(cache), taken, release), daemon=True)
    holder.start()
    try:
        assert taken.wait(20)
        yield cache
    finally:
        release.set()
        holder.join(10)


def _chunk_bytes(store: Path) -> int:
    with Index(store) as index:
        return int(sum(index.chunk_size))


def test_reads_go_on_while_another_process_holds_the_placement_lock(
    store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _held_elsewhere(tmp_path, monkeypatch) as cache:
        # Short of the whole store: its placements are decided under the host's lock.
        disk = disk_tier(cache, _chunk_bytes(store_dir) - 1)
        with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
            started = time.monotonic()
            first = read_all(store)
            tiers.drain(30)
            assert len(first) == len(store) and time.monotonic() - started < 20
            assert disk.counters.copy_failures > 0  # counted, and said once
            assert disk.counters.copies == 0 and tiers.origin_counters.bytes > 0  # served


def test_a_tier_with_room_for_the_store_places_while_another_holds_the_lock(
    store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for every chunk: no placement can take another's room or evict, so none takes the
    host's lock (`Holdings.host_lock`), and a process holding it (a job with a smaller quota
    on the same directory, deciding) holds none of this one's copies."""
    with _held_elsewhere(tmp_path, monkeypatch) as cache:
        disk = disk_tier(cache, _chunk_bytes(store_dir))  # exactly the store
        with stack(store_dir, [disk]) as tiers, open_store(store_dir, source=tiers) as store:
            first = read_all(store)
            tiers.drain(30)
            assert read_all(store) == first
            with Index(store_dir) as index:
                assert disk.counters.copies == index.num_chunks
            assert disk.counters.copy_failures == 0 and disk.counters.evictions == 0
            assert sum(disk.held.values()) == _chunk_bytes(store_dir) == disk.quota
