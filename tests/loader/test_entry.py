"""A window entry's two looks at its reads: `done` exact, `ready` from flags its reads set."""

from __future__ import annotations

import itertools
from concurrent.futures import Future

import pytest

from tierfeed.loader.streamstate import Entry, overtaken

# What a read's future can be: running, succeeded, failed, or cancelled.
STATES = ("running", "ok", "failed", "cancelled")


def _future(state: str) -> Future[int]:
    f: Future[int] = Future()
    if state == "ok":
        f.set_result(1)
    elif state == "failed":
        f.set_exception(OSError("read failed"))
    elif state == "cancelled":
        f.cancel()
    return f


def _watched(primary: str, hedge: str | None) -> Entry[int]:
    entry: Entry[int] = Entry(1)
    entry.primary = entry.watch(_future(primary))
    if hedge is not None:
        entry.hedge = entry.watch(_future(hedge))
    return entry


def _takeable(futures: list[Future[int]]) -> bool:
    """The rule `done` keeps: one read succeeded, or every read has ended."""
    ok = any(f.done() and not f.cancelled() and f.exception() is None for f in futures)
    return ok or all(f.done() for f in futures)


@pytest.mark.parametrize(
    ("primary", "hedge"), [*itertools.product(STATES, [None, *STATES])]
)  # fmt: skip
def test_done_is_exact_for_every_pair_of_reads(primary: str, hedge: str | None) -> None:
    entry = _watched(primary, hedge)
    assert entry.done() == _takeable(entry.futures())
    # `ready` never says yes where `done` says no, and says yes for every success.
    succeeded = "ok" in (primary, hedge)
    assert entry.ready() == succeeded
    assert not entry.ready() or entry.done()


def test_ready_follows_a_read_that_lands_later() -> None:
    entry: Entry[int] = Entry(1)
    read: Future[int] = Future()
    entry.primary = entry.watch(read)
    assert not entry.ready() and not entry.done()
    read.set_result(7)
    assert entry.ready() and entry.done()


def test_a_hedge_that_lands_makes_it_ready_while_the_primary_hangs() -> None:
    entry: Entry[int] = Entry(1)
    entry.primary = entry.watch(Future())
    hedge: Future[int] = Future()
    entry.hedge = entry.watch(hedge)
    assert not entry.ready()
    hedge.set_result(3)
    assert entry.ready() and entry.done()


def test_overtaken_counts_the_ready_reads_besides_the_one_due() -> None:
    due = _watched("running", None)
    ahead = [_watched("ok", None), _watched("ok", None), _watched("running", None)]
    window = [due, *ahead]
    assert overtaken(window, 2 / 3)  # 2 of the 3 besides the one due are ready
    assert not overtaken(window, 1.0)
    assert not overtaken(window, None)
    inline: Entry[int] = Entry(1)
    inline.inline = True  # read on the consumer's thread: ready without a future
    assert overtaken([due, ahead[0], ahead[1], inline], 1.0)
