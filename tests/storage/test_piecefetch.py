"""Hedged pieces of a chunk copy: a stalled request does not hold the copy, nor a place among
the requests in flight; hedges keep to their budget; nothing lands after the copy is over."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.daemonpool import DaemonPool
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.format.index import Index
from tierfeed.storage import MemoryDriver, PosixDriver, Tier, TierStack
from tierfeed.storage.disktier import TierCounters, cache_key
from tierfeed.storage.driver import Driver
from tierfeed.storage.files import FdCache
from tierfeed.storage.landing import Arrival, FetchCounters, MemoryLanding
from tierfeed.storage.originfetch import PieceRequests
from tierfeed.storage.piecefetch import Piece, PieceFetch, piece_order, piece_ranks
from tierfeed.storage.tiers import TierOptions, disk_tier
from tierfeed.storage.tuning import FetchTuner

pytestmark = pytest.mark.timeout(60)
PIECE = 8 * 1024


class Stalling(PosixDriver):
    """A read-only origin whose reads at ``stall_at`` block until ``release`` is set; its way
    for hedges (`for_hedges`) is a plain one, which never stalls."""

    def __init__(self, root: Path, stall_at: int) -> None:
        super().__init__(root, read_only=True)
        self.stall_at = stall_at
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.hedge_way = PosixDriver(root, read_only=True)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if offset <= self.stall_at < offset + length:
            self.stalled.set()
            assert self.release.wait(30), "never released"
        return super().read_range(path, offset, length)

    read_block = read_range  # a copy's pieces too

    def for_hedges(self) -> Driver:
        return self.hedge_way


def test_a_stalled_piece_is_hedged_and_the_copy_does_not_wait_for_it(
    store_dir: Path, tmp_path: Path
) -> None:
    info = Index(store_dir).chunk(0)
    origin = Stalling(store_dir, stall_at=PIECE + 5)  # the second piece
    disk = disk_tier(tmp_path / "cache", 10**9)
    options = TierOptions(piece_bytes=PIECE, fetch_threads=2)
    stack = TierStack(Index(store_dir).chunks(), origin, [disk], options=options)
    try:
        for _ in range(8):  # the tuner learns what a piece takes: a stall is then late
            stack.fetch.tuner.observe(PIECE, 0.001, time.monotonic(), piece=True)
        stack.fetch.requests.begun(10**9)  # a budget for the hedge (earlier copies)
        assert stack.schedule(0)
        assert origin.stalled.wait(10)
        deadline = time.monotonic() + 10
        while 0 not in disk.held:  # placed while the first request still stalls
            assert time.monotonic() < deadline, "the copy waited for the stalled request"
            time.sleep(0.005)
        fetch = stack.fetch.counters.snapshot()
        assert fetch["hedges"] == 1 and fetch["hedge_wins"] == 1
        assert fetch["pieces"] == -(-info.size // PIECE)  # each landed once
        cached = tmp_path / "cache" / cache_key(info)
        want = (store_dir / info.name).read_bytes()
        assert cached.read_bytes() == want
        origin.release.set()  # the stalled request ends now: it lands nothing
        stack.drain()
        time.sleep(0.05)
        assert cached.read_bytes() == want
        assert stack.fetch.requests._aside == 0  # the late request, set aside, has left
    finally:
        origin.release.set()
        stack.close()


def test_a_stalled_request_does_not_hold_a_place_among_those_in_flight(
    store_dir: Path, tmp_path: Path
) -> None:
    # One request in flight at a time: without setting the stalled one aside, every other
    # piece would queue behind it until it ends.
    info = Index(store_dir).chunk(0)
    origin = Stalling(store_dir, stall_at=5)  # the first piece
    stack = TierStack(
        Index(store_dir).chunks(),
        origin,
        [Tier(MemoryDriver(), 10**9, name="ram")],
        options=TierOptions(piece_bytes=PIECE, fetch_threads=4),
    )
    try:
        stack.fetch.tuner._inflight = 1
        stack.fetch.tuner.limits = type(stack.fetch.tuner.limits)(min_inflight=1, max_inflight=1)
        for _ in range(8):
            stack.fetch.tuner.observe(PIECE, 0.001, time.monotonic(), piece=True)
        stack.fetch.requests.begun(10**9)
        stack.schedule(0)
        deadline = time.monotonic() + 10
        while 0 not in stack.tiers[0].held:
            assert time.monotonic() < deadline, "the other pieces queued behind the stall"
            time.sleep(0.005)
        assert stack.fetch.counters.snapshot()["pieces"] == -(-info.size // PIECE)
    finally:
        origin.release.set()
        stack.close()


class Reads:
    """A `PieceReader` over ``read(index, hedge)``: no limit on the requests in flight."""

    def __init__(
        self,
        read: Callable[[int, bool], bytes],
        may_hedge: Callable[[int], bool] = lambda n: False,
        late_after: float | None = None,
    ) -> None:
        self._read, self._may_hedge, self._late_after = read, may_hedge, late_after

    def slot(self, hedge: bool) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def read(self, info: ChunkInfo, offset: int, length: int, hedge: bool) -> list[bytes]:
        return [self._read(offset // PIECE, hedge)]

    def late_after(self) -> float | None:
        return self._late_after

    def may_hedge(self, nbytes: int) -> bool:
        return self._may_hedge(nbytes)

    def set_aside(self, n: int) -> None:
        pass


def _fetch_of(
    info: ChunkInfo,
    read: Callable[[int, bool], bytes],
    may_hedge: Callable[[int], bool],
    late_after: float = 0.02,
) -> tuple[PieceFetch, FetchCounters, DaemonPool, ThreadPoolExecutor]:
    counters = FetchCounters()
    pool, hedges = DaemonPool(4, "test-fetch"), ThreadPoolExecutor(2)
    arrival = MemoryLanding().begin(info, PIECE)
    fetch = PieceFetch(arrival, Reads(read, may_hedge, late_after), pool, hedges, counters)
    return fetch, counters, pool, hedges


def whole_pieces(arrival: Arrival, order: Iterable[int]) -> list[Piece]:
    """The pieces ``order`` of ``arrival``'s chunk, each read by one request."""
    return [Piece(i, (arrival.span(i),)) for i in order]


def _all(fetch: PieceFetch) -> list[Piece]:
    return whole_pieces(fetch.arrival, range(fetch.arrival.pieces))


def test_hedges_keep_to_their_budget(store_dir: Path) -> None:
    info = Index(store_dir).chunk(0)
    whole = (store_dir / info.name).read_bytes()

    def read(index: int, hedge: bool) -> bytes:
        if index in (1, 2) and not hedge:
            time.sleep(0.3)  # both stall; the budget allows one second request
        return whole[index * PIECE : (index + 1) * PIECE]

    asked: list[int] = []

    def may_hedge(nbytes: int) -> bool:
        asked.append(nbytes)
        return len(asked) == 1

    fetch, counters, pool, hedges = _fetch_of(info, read, may_hedge)
    try:
        fetch.run(_all(fetch), 4)
    finally:
        pool.shutdown()
        hedges.shutdown()
    assert counters.hedges == 1 and counters.hedge_wins == 1
    assert fetch.arrival.whole() == whole


def test_a_piece_fails_only_when_every_request_for_it_failed(store_dir: Path) -> None:
    info = Index(store_dir).chunk(0)
    whole = (store_dir / info.name).read_bytes()

    def read(index: int, hedge: bool) -> bytes:
        if index == 1 and not hedge:
            time.sleep(0.2)
            raise OSError("the stalled request failed in the end")
        return whole[index * PIECE : (index + 1) * PIECE]

    fetch, _, pool, hedges = _fetch_of(info, read, lambda n: True)
    fetch.run(_all(fetch), 4)  # the hedge landed piece 1: no error
    assert fetch.arrival.whole() == whole

    def never(index: int, hedge: bool) -> bytes:
        if index == 1:
            time.sleep(0.05 if hedge else 0.1)
            raise OSError(f"piece 1 {'hedge' if hedge else 'first'} failed")
        return whole[index * PIECE : (index + 1) * PIECE]

    fetch, _, pool2, hedges2 = _fetch_of(info, never, lambda n: True)
    with pytest.raises(OSError, match="piece 1 first failed"):
        fetch.run(_all(fetch), 4)
    for p in (pool, hedges, pool2, hedges2):
        p.shutdown()


def test_the_places_do_not_count_requests_set_aside(tmp_path: Path) -> None:
    origin = PosixDriver(tmp_path, read_only=True)
    tuner = FetchTuner.starting(0, 1, PIECE)  # one request in flight
    assert tuner.inflight == 1
    events = threading.Event()
    requests = PieceRequests(origin, origin, tuner, FetchCounters(), TierCounters(), events)
    entered = threading.Event()

    def second() -> None:
        with requests.slot(False):
            entered.set()

    with requests.slot(False):
        t = threading.Thread(target=second)
        t.start()
        assert not entered.wait(0.1)  # one place, taken
        requests.set_aside(1)  # the one inside stalls: its place is free
        assert entered.wait(5)
        t.join()
    requests.set_aside(-1)
    assert requests._inside == requests._aside == 0


def test_open_ahead_queues_behind_an_open_in_progress(tmp_path: Path) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x")
        paths.append(os.fspath(path))
    fds = FdCache()
    try:
        fds.open_ahead(paths[:1])
        fds.open_ahead(paths[1:])  # the first thread may still run: queued, not dropped
        deadline = time.monotonic() + 5
        while fds.opens < 3:
            assert time.monotonic() < deadline, f"only {fds.opens} of 3 opened"
            time.sleep(0.005)
    finally:
        fds.close()


def test_open_ahead_opens_what_copies_read_through_too(tmp_path: Path) -> None:
    # A copy's pieces go through descriptors of their own (O_DIRECT): opened ahead as well, a
    # stalled open is paid before the copy needs the file, and no piece waits on it.
    for name in ("a.tar", "b.tar"):
        (tmp_path / name).write_bytes(b"x" * 8192)
    driver = PosixDriver(tmp_path, read_only=True)
    try:
        driver.open_ahead(["a.tar", "b.tar"], blocks=True)
        deadline = time.monotonic() + 5
        while driver.opens < 4:  # each file for reads, and for copies
            assert time.monotonic() < deadline, f"only {driver.opens} of 4 opened"
            time.sleep(0.005)
        assert driver.read_block("a.tar", 0, 4096) == b"x" * 4096
        assert driver.read_range("b.tar", 10, 5) == b"x" * 5
        assert driver.opens == 4  # the reads found them open
    finally:
        driver.close()
    reader = PosixDriver(tmp_path, read_only=True)  # one that does not copy: no second open
    try:
        reader.open_ahead(["a.tar", "b.tar"])
        deadline = time.monotonic() + 5
        while reader.opens < 2:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(0.05)
        assert reader.opens == 2
    finally:
        reader.close()


@settings(max_examples=200, deadline=None)
@given(
    reads=st.lists(st.integers(0, 10_000), max_size=60),
    piece=st.integers(1, 3000),
    size=st.integers(1, 10_000),
    first=st.none() | st.integers(0, 20),
)
def test_piece_order_is_every_piece_once_first_then_by_first_need(
    reads: list[int], piece: int, size: int, first: int | None
) -> None:
    pieces = -(-size // piece)
    offsets = np.asarray([o % size for o in reads], dtype=np.int64)
    positions = np.arange(len(offsets), dtype=np.int64)[::-1].copy()  # any positions
    order = piece_order(piece_ranks(positions, offsets, piece, pieces, first))
    assert sorted(order) == list(range(pieces))  # a permutation: every piece once
    if first is not None:
        assert order[0] == min(first, pieces - 1)  # the one a read waits for
    rest = order[1:] if first is not None else order
    need: dict[int, int] = {}
    for pos, off in zip(positions.tolist(), offsets.tolist(), strict=True):
        need[off // piece] = min(need.get(off // piece, pos), pos)
    ranks = [need.get(i, 1 << 62) for i in rest]
    assert ranks == sorted(ranks)  # then by first need
    unread = [i for i in rest if i not in need]
    assert unread == sorted(unread)  # the rest in offset order


@settings(max_examples=200, deadline=None)
@given(
    reads=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 5_000)), max_size=60),
    piece=st.integers(1, 3000),
    size=st.integers(1, 10_000),
)
def test_piece_order_needs_every_piece_a_read_spans_when_the_read_comes(
    reads: list[tuple[int, int]], piece: int, size: int
) -> None:
    """A read that crosses into the next pieces needs those when it comes, not when a later
    read starts in them: a sample straddling a piece boundary held its batch for the second
    piece until late in the copy (issue 16)."""
    pieces = -(-size // piece)
    offsets = np.asarray([o % size for o, _ in reads], dtype=np.int64)
    ends = np.minimum(offsets + np.asarray([n for _, n in reads], dtype=np.int64), size)
    positions = np.arange(len(offsets), dtype=np.int64)
    order = piece_order(piece_ranks(positions, offsets, piece, pieces, None, ends))
    assert sorted(order) == list(range(pieces))
    need: dict[int, int] = {}
    for pos, lo, hi in zip(positions.tolist(), offsets.tolist(), ends.tolist(), strict=True):
        for i in range(lo // piece, (max(hi, lo + 1) - 1) // piece + 1):
            need[i] = min(need.get(i, pos), pos)
    ranks = [need.get(i, 1 << 62) for i in order]
    assert ranks == sorted(ranks)  # by first need, every spanned piece counted
    unread = [i for i in order if i not in need]
    assert unread == sorted(unread)
    # Without ends, as before: the piece each read starts in.
    assert piece_order(piece_ranks(positions, offsets, piece, pieces)) == piece_order(
        piece_ranks(positions, offsets, piece, pieces, None, offsets + 1)
    )


def copied_in_order(
    store_dir: Path, tmp_path: Path, reads: Callable[[int], tuple[list[int], ...]]
) -> tuple[list[int], int]:
    """The offsets chunk 0's copy asked the origin for, in order, when the tiers were told
    ``reads(pieces)`` (``set_reads``'s arguments), and how many pieces the chunk has."""
    index = Index(store_dir)
    asked: list[int] = []

    class Recording(PosixDriver):
        def read_range(self, path: str, offset: int, length: int) -> bytes:
            asked.append(offset)
            return super().read_range(path, offset, length)

        read_block = read_range  # a copy's pieces too

    origin = Recording(store_dir, read_only=True)
    options = TierOptions(piece_bytes=PIECE, fetch_threads=1)
    stack = TierStack(index.chunks(), origin, [disk_tier(tmp_path / "c", 10**9)], options=options)
    try:
        stack.fetch._splits = 10**6  # no pieces read as halves: one request per piece
        pieces = -(-index.chunk(0).size // PIECE)
        stack.set_reads(*reads(pieces))
        stack.schedule(0)
        stack.drain()
    finally:
        stack.close()
    return asked, pieces


def test_a_copy_fetches_the_pieces_the_plan_reads_first_first(
    store_dir: Path, tmp_path: Path
) -> None:
    def reads(pieces: int) -> tuple[list[int], ...]:
        # The plan reads chunk 0 from its end backwards, with a read of chunk 1 between.
        offsets = [(pieces - 1 - k) * PIECE for k in range(pieces)]
        return [0, 1, *[0] * (pieces - 1)], [offsets[0], 0, *offsets[1:]]

    asked, pieces = copied_in_order(store_dir, tmp_path, reads)
    assert asked == sorted(asked, reverse=True)  # last piece first, as the plan reads
    assert len(asked) == pieces


def test_a_copy_fetches_both_pieces_of_a_read_across_a_boundary_first(
    store_dir: Path, tmp_path: Path
) -> None:
    def reads(pieces: int) -> tuple[list[int], ...]:
        # The first read starts near the end of piece 1 and ends in piece 2; the next reads
        # start in pieces 0, then 3 and on: piece 2 is needed by the first read, not later.
        assert pieces >= 4
        spans = [(2 * PIECE - 10, 2 * PIECE + 10), (0, 10)]
        spans += [(k * PIECE, k * PIECE + 10) for k in range(3, pieces)]
        starts, ends = zip(*spans, strict=True)
        return [0] * len(spans), list(starts), list(ends)

    asked, pieces = copied_in_order(store_dir, tmp_path, reads)
    assert asked[:3] == [PIECE, 2 * PIECE, 0]
    assert len(asked) == pieces


def test_ranked_pieces_of_two_copies_are_fetched_by_need() -> None:
    """Two copies share one fetch thread: their pieces are fetched by when the reads need
    them (`piece_ranks`), interleaved across the copies, not one copy's pieces first."""
    size = 8 * PIECE
    data = {name: os.urandom(size) for name in ("a", "b")}
    infos = {name: ChunkInfo(i, f"{name}.tar", size, 0) for i, name in enumerate(data)}
    fetched: list[tuple[str, int]] = []
    gate = threading.Event()
    pool = DaemonPool(1, "test-ranked", ranked=True)
    pool.submit(gate.wait, 10)  # holds the one thread until both copies queued their pieces
    # Chunk a's reads come at even positions, b's at odd ones: the need order alternates.
    positions = {"a": np.arange(0, 16, 2), "b": np.arange(1, 17, 2)}
    offsets = np.arange(8) * PIECE
    fetches = []
    for name in data:
        arrival = MemoryLanding().begin(infos[name], PIECE)

        def read(index: int, hedge: bool, name: str = name) -> bytes:
            fetched.append((name, index))
            return data[name][index * PIECE : (index + 1) * PIECE]

        fetch = PieceFetch(arrival, Reads(read), pool, ThreadPoolExecutor(1), FetchCounters())
        ranks = piece_ranks(positions[name], offsets, PIECE, 8)
        order = whole_pieces(arrival, piece_order(ranks))
        fetches.append(threading.Thread(target=fetch.run, args=(order, 8, ranks.tolist())))
    for thread in fetches:
        thread.start()
    deadline = time.monotonic() + 10
    while pool._jobs.qsize() < 16 and time.monotonic() < deadline:  # both copies' 8 pieces
        time.sleep(0.01)  # (a fixed sleep was too short on a busy CI machine)
    gate.set()
    for thread in fetches:
        thread.join(10)
    pool.shutdown()
    assert fetched == [(name, i) for i in range(8) for name in ("a", "b")]


def test_piece_ranks_are_first_needs() -> None:
    ranks = piece_ranks(np.array([5, 2, 9]), np.array([0, 0, 3 * PIECE]), PIECE, 4, first=1)
    assert ranks[0] == 2 and ranks[1] == -1 and ranks[3] == 9
    assert ranks[2] == np.iinfo(np.int64).max  # no read needs it
