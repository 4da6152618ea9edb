"""`first_to_end`: a call that hangs is made again beside itself, and the first to end answers."""

from __future__ import annotations

import threading
import time

import pytest

from tierfeed.hedging import first_to_end

pytestmark = pytest.mark.timeout(30)


def test_a_hung_first_try_is_answered_by_the_second() -> None:
    held = threading.Event()
    discarded: list[str] = []

    def job(attempt: int) -> str:
        if attempt == 0:
            held.wait()  # the first request is never answered (until the test ends)
            return "late"
        return f"try {attempt}"

    started = time.monotonic()
    got = first_to_end(
        job, again_after_s=0.1, tries=3, bound_s=10, what="x", discard=discarded.append
    )
    took = time.monotonic() - started
    assert got == "try 1"
    assert 0.1 <= took < 1.0
    held.set()  # the first try answers after all: handed to discard, not returned
    deadline = time.monotonic() + 5
    while not discarded and time.monotonic() < deadline:
        time.sleep(0.01)
    assert discarded == ["late"]


def test_a_quick_answer_starts_no_second_try() -> None:
    tries: list[int] = []
    assert (
        first_to_end(lambda a: tries.append(a) or a, again_after_s=5, tries=3, bound_s=10, what="x")
        == 0
    )
    assert tries == [0]


def test_an_error_is_an_answer_when_no_other_try_runs() -> None:
    tries: list[int] = []

    def job(attempt: int) -> int:
        tries.append(attempt)
        raise FileNotFoundError("no such file")

    with pytest.raises(FileNotFoundError):
        first_to_end(job, again_after_s=0.05, tries=3, bound_s=10, what="x")
    assert tries == [0]  # an error is not a hang: not made again


def test_an_error_waits_for_a_try_still_running() -> None:
    def job(attempt: int) -> str:
        if attempt == 0:
            time.sleep(0.3)
            return "slow but whole"
        raise OSError("the second way failed")

    assert first_to_end(job, again_after_s=0.05, tries=2, bound_s=10, what="x") == "slow but whole"


def test_no_answer_at_all_is_an_error_at_the_bound() -> None:
    held = threading.Event()
    tries: list[int] = []

    def job(attempt: int) -> None:
        tries.append(attempt)
        held.wait()

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"the index read: no answer in 0\.5 s"):
        first_to_end(job, again_after_s=0.1, tries=3, bound_s=0.5, what="the index read")
    assert 0.5 <= time.monotonic() - started < 2.0
    assert tries == [0, 1, 2]  # three at most
    held.set()
