"""The piece hedges' budget: a little until hedges win, more as they do, never past the cap;
the first hedge always, where the cap allows it."""

from __future__ import annotations

from pathlib import Path

from tierfeed.storage import originfetch
from tierfeed.storage.originfetch import OriginFetch
from tierfeed.storage.posix import PosixDriver

BEGUN = 10**9
HEDGE = 10**6


def _fetch(tmp_path: Path, begun: int = BEGUN) -> OriginFetch:
    fetch = OriginFetch(PosixDriver(tmp_path, read_only=True), True, 2, None)
    fetch.requests.begun(begun)  # copies begun so far
    return fetch


def _granted(fetch: OriginFetch, most: int = 10_000) -> int:
    n = 0
    while n < most and fetch.requests.may_hedge(HEDGE):
        n += 1
    return n


def test_hedges_that_never_win_read_only_the_floor(tmp_path: Path) -> None:
    fetch = _fetch(tmp_path)
    try:
        granted = _granted(fetch)
        assert granted == int(originfetch._HEDGE_FLOOR * BEGUN) // HEDGE
        assert granted * HEDGE < originfetch._HEDGE_SHARE * BEGUN
    finally:
        fetch.close()


def test_each_win_earns_more_hedges_up_to_the_share(tmp_path: Path) -> None:
    fetch = _fetch(tmp_path)
    try:
        floor = _granted(fetch)
        fetch.counters.add(hedge_wins=1)  # one of them landed its piece first
        assert _granted(fetch) == originfetch._HEDGE_EARNED
        fetch.counters.add(hedge_wins=1_000)  # they win: the share caps them
        total = floor + originfetch._HEDGE_EARNED + _granted(fetch)
        assert total * HEDGE <= originfetch._HEDGE_SHARE * BEGUN
        assert total == int(originfetch._HEDGE_SHARE * BEGUN) // HEDGE
    finally:
        fetch.close()


def test_a_process_that_copies_one_chunk_may_hedge_its_first_stall(tmp_path: Path) -> None:
    # One 64 MiB chunk begun: its floor (0.5%, 335 KB) is less than a 512 KiB piece, and its
    # first stall under the heavy tail was waited out in full (1 s) with every hedge refused.
    piece, chunk = 512 * 1024, 64 * 2**20
    fetch = _fetch(tmp_path, begun=chunk)
    try:
        assert originfetch._HEDGE_FLOOR * chunk < piece < originfetch._HEDGE_SHARE * chunk
        assert fetch.requests.may_hedge(piece)  # the first one
        assert not fetch.requests.may_hedge(piece)  # no more until it wins
        fetch.counters.add(hedge_wins=1)
        assert fetch.requests.may_hedge(piece)  # it won: one more, within the share
        fetch.counters.add(hedge_wins=1)
        assert not fetch.requests.may_hedge(piece)  # the share (2%, 1.3 MB) holds, wins or not
    finally:
        fetch.close()


def test_no_first_hedge_past_the_share(tmp_path: Path) -> None:
    fetch = _fetch(tmp_path, begun=HEDGE * 10)  # a hedge of HEDGE is 10% of what was begun
    try:
        assert not fetch.requests.may_hedge(HEDGE)
    finally:
        fetch.close()
