"""The piece hedges' budget: a little until hedges win, more as they do, never past the cap."""

from __future__ import annotations

from pathlib import Path

from tierfeed.storage import originfetch
from tierfeed.storage.originfetch import OriginFetch
from tierfeed.storage.posix import PosixDriver

BEGUN = 10**9
HEDGE = 10**6


def _fetch(tmp_path: Path) -> OriginFetch:
    fetch = OriginFetch(PosixDriver(tmp_path, read_only=True), True, 2, None)
    fetch._begun_bytes = BEGUN  # copies begun so far
    return fetch


def _granted(fetch: OriginFetch, most: int = 10_000) -> int:
    n = 0
    while n < most and fetch._may_hedge(HEDGE):
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
