"""DaemonPool: an Executor whose threads never hold their owner's close or the process's exit."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError, wait

import pytest

from tierfeed.daemonpool import DaemonPool

pytestmark = pytest.mark.timeout(60)


def test_it_runs_jobs_on_at_most_its_threads_and_hands_back_results_and_errors() -> None:
    pool = DaemonPool(3, "t-pool")
    running, most, lock = [0], [0], threading.Lock()

    def job(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        if i == 7:
            raise ValueError("seven")
        return i * i

    futures = [pool.submit(job, i) for i in range(12)]
    wait(futures, timeout=30)
    assert [f.result() for i, f in enumerate(futures) if i != 7] == [
        i * i for i in range(12) if i != 7
    ]
    with pytest.raises(ValueError, match="seven"):
        futures[7].result()
    assert most[0] <= 3
    names = {t.name for t in threading.enumerate() if t.name.startswith("t-pool_")}
    assert names and all(t.daemon for t in threading.enumerate() if t.name in names)
    pool.shutdown()
    assert pool.stuck() == 0
    with pytest.raises(RuntimeError):
        pool.submit(job, 0)


def test_shutdown_cancels_queued_jobs_and_waits_only_its_bound_for_a_stuck_one() -> None:
    release = threading.Event()
    pool = DaemonPool(1, "t-stuck", join_s=0.2)
    stuck = pool.submit(release.wait)  # a read the kernel holds, as far as the pool knows
    queued = pool.submit(time.sleep, 0)
    time.sleep(0.05)
    started = time.monotonic()
    pool.shutdown(wait=True, cancel_futures=True)
    assert time.monotonic() - started < 2.0
    assert pool.stuck() == 1 and not stuck.done()
    with pytest.raises(CancelledError):
        queued.result()
    release.set()
    assert stuck.result(timeout=10) is True  # it finishes on its own thread
    for _ in range(100):
        if pool.stuck() == 0:
            break
        time.sleep(0.01)
    assert pool.stuck() == 0


def test_a_job_that_never_returns_does_not_hold_the_process_exit() -> None:
    code = (
        "import threading\n"
        "from tierfeed.daemonpool import DaemonPool\n"
        "pool = DaemonPool(2, 'exit')\n"
        "pool.submit(threading.Event().wait)\n"  # never set
        "print('submitted', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "submitted\n", done.stderr


def test_ranked_jobs_start_lowest_rank_first() -> None:
    """`submit_ranked`: the queued job of the lowest rank starts next, equal ranks in the
    order they came; plain `submit` jobs are rank 0, in order."""
    pool = DaemonPool(1, "test-ranked", ranked=True)
    gate = threading.Event()
    pool.submit(gate.wait, 10)  # the one thread is busy while the others queue
    started: list[str] = []
    for rank, name in [(5, "e"), (1, "b1"), (9, "z"), (1, "b2"), (0, "a")]:
        pool.submit_ranked(rank, started.append, name)
    last = pool.submit_ranked(10, started.append, "last")
    gate.set()
    last.result(timeout=10)
    pool.shutdown()
    assert started == ["a", "b1", "b2", "e", "z", "last"]
