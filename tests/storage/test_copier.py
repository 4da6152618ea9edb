"""The background copier: queued once while in flight, bounded, survives failures, closes."""

from __future__ import annotations

import threading

import pytest

from tierfeed.errors import StorageError
from tierfeed.storage.copier import Copier


@pytest.mark.timeout(30)
def test_a_chunk_is_queued_once_while_in_flight_and_copied() -> None:
    release = threading.Event()
    copied: list[int] = []

    def copy(chunk: int) -> None:
        release.wait(10)
        copied.append(chunk)

    with Copier(copy, threads=1, queue_size=4) as copier:
        assert copier.schedule(7)
        assert not copier.schedule(7)  # in flight
        assert copier.inflight == 1
        release.set()
        copier.drain(10)
        assert copied == [7] and copier.inflight == 0
        assert copier.schedule(7)  # done: may be queued again
        copier.drain(10)
    assert copied == [7, 7]


@pytest.mark.timeout(30)
def test_a_full_queue_refuses_and_drain_waits_at_most_its_timeout() -> None:
    release = threading.Event()

    def copy(chunk: int) -> None:
        release.wait(10)

    copier = Copier(copy, threads=1, queue_size=1)
    try:
        assert copier.schedule(0)  # taken by the thread, or waiting
        results = [copier.schedule(c) for c in range(1, 4)]
        assert results.count(True) <= 1 and results[-1] is False
        with pytest.raises(StorageError, match="still running"):
            copier.drain(0.05)
    finally:
        release.set()
        copier.close()


@pytest.mark.timeout(30)
def test_threads_survive_failures_and_each_is_reported() -> None:
    failures: list[tuple[int, str]] = []

    def copy(chunk: int) -> None:
        raise ValueError(f"injected {chunk}")

    def failed(chunk: int, exc: Exception) -> None:
        failures.append((chunk, str(exc)))
        if chunk == 1:
            raise RuntimeError("a bad reporter does not kill the thread either")

    with Copier(copy, threads=2, queue_size=8, name="t-copy", failed=failed) as copier:
        for c in range(4):
            assert copier.schedule(c)
        copier.drain(10)
        assert sorted(failures) == [(c, f"injected {c}") for c in range(4)]
        assert [t.name for t in copier.threads] == ["t-copy-0", "t-copy-1"]
        assert all(t.is_alive() for t in copier.threads)


@pytest.mark.timeout(30)
def test_close_is_idempotent() -> None:
    copier = Copier(lambda _: None, threads=2, queue_size=4)
    copier.close()
    copier.close()
    assert copier.closed and not copier.schedule(1)
    assert not any(t.is_alive() for t in copier.threads)
    copier.drain(0.01)  # closed: returns at once


@pytest.mark.timeout(30)
def test_an_urgent_copy_goes_ahead_and_moves_a_queued_one_ahead_once() -> None:
    release, started = threading.Event(), threading.Event()
    copied: list[int] = []

    def copy(chunk: int) -> None:
        started.set()
        release.wait(10)
        copied.append(chunk)

    with Copier(copy, threads=1, queue_size=16) as copier:
        assert copier.schedule(0)
        assert started.wait(10)  # taken by the one thread: it waits for the release
        for chunk in (1, 2, 3):
            assert copier.schedule(chunk)
        assert copier.schedule(9, urgent=True)  # a read waits for chunk 9
        assert copier.schedule(3, urgent=True)  # queued already: moved ahead
        assert not copier.schedule(3, urgent=True)  # moved ahead already
        assert not copier.schedule(0, urgent=True)  # running: nothing to move
        release.set()
        copier.drain(10)
    assert copied == [0, 9, 3, 1, 2]  # each once: the twin left behind by the move is skipped


class Blocking:
    """A copy that holds its thread until released, recording which chunks began and ended."""

    def __init__(self, fail: frozenset[int] = frozenset()) -> None:
        self.release = threading.Event()
        self.began: list[int] = []
        self.copied: list[int] = []
        self.fail = fail
        self._cond = threading.Condition()

    def __call__(self, chunk: int) -> None:
        with self._cond:
            self.began.append(chunk)
            self._cond.notify_all()
        self.release.wait(10)
        if chunk in self.fail:
            raise ValueError(f"injected {chunk}")
        self.copied.append(chunk)

    def wait_began(self, *chunks: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: set(chunks) <= set(self.began), timeout=10)


@pytest.mark.timeout(30)
def test_an_urgent_copy_starts_beside_busy_threads_up_to_its_limit() -> None:
    copy = Blocking()
    with Copier(copy, threads=1, queue_size=16, urgent_threads=2) as copier:
        assert copier.schedule(0)
        assert copy.wait_began(0)  # the one thread is busy
        assert copier.schedule(5)  # queued behind it
        assert copier.schedule(9, urgent=True)  # a read waits: begins at once, beside
        assert copier.schedule(5, urgent=True)  # queued: begins at once too
        assert copy.wait_began(9, 5)
        assert copier.schedule(7, urgent=True)  # both extra places taken: at the queue's head
        assert copier.inflight == 4
        assert 7 not in copy.began
        copy.release.set()
        copier.drain(10)
    assert sorted(copy.copied) == [0, 5, 7, 9]  # each once: 5's queued twin skipped
    assert copy.copied.count(5) == 1
    assert all(not t.is_alive() for t in threading.enumerate() if t.name.endswith("-urgent"))


@pytest.mark.timeout(30)
def test_without_urgent_threads_an_urgent_copy_waits_for_a_free_thread() -> None:
    copy = Blocking()
    with Copier(copy, threads=1, queue_size=16) as copier:
        assert copier.schedule(0)
        assert copy.wait_began(0)
        assert copier.schedule(9, urgent=True)
        with copy._cond:
            assert not copy._cond.wait_for(lambda: 9 in copy.began, timeout=0.2)
        copy.release.set()
        copier.drain(10)
    assert copy.copied == [0, 9]


@pytest.mark.timeout(30)
def test_an_urgent_copy_beside_reports_its_failure_and_close_waits_for_it() -> None:
    copy = Blocking(fail=frozenset({9}))
    failures: list[int] = []
    copier = Copier(copy, threads=1, queue_size=16, urgent_threads=1,
                    failed=lambda chunk, exc: failures.append(chunk))  # fmt: skip
    assert copier.schedule(0)
    assert copy.wait_began(0)
    assert copier.schedule(8, urgent=True)
    assert copy.wait_began(8)
    threading.Timer(0.2, copy.release.set).start()
    copier.close()  # the running copies finish first, the one beside included
    assert sorted(copy.copied) == [0, 8] and copier.inflight == 0
    assert not copier.schedule(9, urgent=True)  # closed: nothing starts beside either
    copy2 = Blocking(fail=frozenset({9}))
    with Copier(copy2, threads=1, queue_size=4, urgent_threads=1,
                failed=lambda chunk, exc: failures.append(chunk)) as again:  # fmt: skip
        assert again.schedule(0) and copy2.wait_began(0)
        assert again.schedule(9, urgent=True) and copy2.wait_began(9)
        copy2.release.set()
        again.drain(10)
        assert failures == [9] and again.inflight == 0
        assert again.schedule(9, urgent=True)  # failed and done: may be asked for again
        again.drain(10)


@pytest.mark.timeout(30)
def test_an_urgent_copy_whose_queued_twin_a_thread_took_meanwhile_runs_once() -> None:
    copy = Blocking()
    with Copier(copy, threads=1, queue_size=16, urgent_threads=2) as copier:
        assert copier.schedule(0)
        assert copy.wait_began(0)
        assert copier.schedule(5)
        # The race: between the urgent call's look and its start beside, the one thread takes
        # the queued twin (here: marked running as the thread would).
        with copier._lock:
            copier._running.add(5)
        assert copier._start_beside(5)  # begun already: not started a second time
        assert not [t for t in threading.enumerate() if t.name.endswith("-urgent")]
        with copier._lock:
            copier._running.discard(5)
        copy.release.set()
        copier.drain(10)
    assert sorted(copy.copied) == [0, 5]
