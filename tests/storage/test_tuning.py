"""The fetch tuner against model origins: the piece it picks, the requests in flight it settles
on, and how far ahead prefetching looks."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.storage.tuning import _PIECE_S, FetchLimits, FetchTuner, LookAhead, lead_reads

MiB = 2**20


class ModelOrigin:
    """Requests cost ``latency + bytes / per_stream`` while the link has room; ``inflight``
    requests share ``link`` bytes/s once ``inflight * per_stream`` exceeds it."""

    def __init__(self, latency: float, per_stream: float, link: float) -> None:
        self.latency, self.per_stream, self.link = latency, per_stream, link

    def seconds(self, nbytes: int, inflight: int) -> float:
        share = min(self.per_stream, self.link / inflight)
        return self.latency + nbytes / share


def run(tuner: FetchTuner, origin: ModelOrigin, requests: int, sizes: list[int]) -> None:
    """``requests`` requests, ``inflight`` at a time, as a fetch pipeline issues them."""
    now = 0.0
    for i in range(requests):
        k = tuner.inflight
        nbytes = sizes[i % len(sizes)] if sizes else tuner.piece
        took = origin.seconds(nbytes, k)
        now += took / k  # k requests overlap: one ends every took/k seconds
        tuner.observe(nbytes, took, now)


@pytest.mark.parametrize(
    ("latency", "per_stream"),
    [(0.001, 100e6), (0.02, 50e6), (0.0001, 400e6), (0.1, 20e6)],
)
def test_the_piece_makes_latency_a_small_share(latency: float, per_stream: float) -> None:
    limits = FetchLimits(min_piece=64 * 1024, max_piece=256 * MiB, min_inflight=1, max_inflight=1)
    tuner = FetchTuner(limits, piece=1 * MiB, inflight=1)
    origin = ModelOrigin(latency, per_stream, link=per_stream)
    # Sample-sized reads and pieces both reach the fit; afterwards, pieces of its choosing.
    run(tuner, origin, 64, [20_000, 1 * MiB, 300_000, 4 * MiB])
    fitted = tuner.fit()
    assert fitted is not None
    assert fitted[0] == pytest.approx(latency, rel=0.05, abs=1e-5)
    assert fitted[1] == pytest.approx(per_stream, rel=0.05)
    share = latency / origin.seconds(tuner.piece, 1)
    # Latency a tenth of a piece's time, unless that piece's bytes would take longer than
    # _PIECE_S at a request's share of the throughput: then that is the piece.
    capped = tuner.piece <= per_stream * _PIECE_S + 64 * 1024 and share > 0.1
    assert (
        0.05 <= share <= 0.1 + 1e-3 or capped or tuner.piece in (limits.min_piece, limits.max_piece)
    )


def test_a_shared_link_does_not_make_pieces_of_seconds() -> None:
    """Sixteen requests share a 400 MB/s link, and each waits behind the others' transfers:
    the fit takes the queueing for latency, which alone would ask for the largest piece.
    The piece stays one a request's share of the link moves in about `_PIECE_S`."""
    limits = FetchLimits(min_inflight=16, max_inflight=16)
    tuner = FetchTuner(limits, piece=1 * MiB, inflight=16)
    queueing = ModelOrigin(0.2, 400e6 / 16, 400e6)  # 0.2 s: the transfers queued ahead
    run(tuner, queueing, 512, [20_000, 1 * MiB, 300_000, 4 * MiB])
    assert tuner.fitted is not None and tuner.fitted[0] > 0.1
    assert tuner.piece <= 400e6 / 16 * _PIECE_S * 1.5


def test_stalled_requests_do_not_move_the_fit() -> None:
    # A heavy tail: one request in 250 stalls 1 s on top of its time. The fit leaves them out:
    # latency and piece stay near the calm origin's at every round, never the largest piece.
    limits = FetchLimits(min_inflight=1, max_inflight=1)
    calm = FetchTuner(limits, piece=1 * MiB, inflight=1)
    origin = ModelOrigin(0.002, 50e6, 50e6)
    run(calm, origin, 256, [20_000, 1 * MiB, 300_000, 4 * MiB])
    tuner = FetchTuner(limits, piece=1 * MiB, inflight=1)
    rng = random.Random(3)
    now, pieces = 0.0, []
    for i in range(3000):
        nbytes = [20_000, 1 * MiB, 300_000, 4 * MiB][i % 4]
        took = origin.seconds(nbytes, 1) + (1.0 if rng.random() < 1 / 250 else 0.0)
        now += took
        tuner.observe(nbytes, took, now)
        if i >= 256 and i % 16 == 0:
            fitted = tuner.fit()
            assert fitted is not None and fitted[0] == pytest.approx(0.002, rel=0.3)
            pieces.append(tuner.piece)
    assert all(0.5 * calm.piece <= p <= 2 * calm.piece for p in pieces), (calm.piece, pieces)


def test_a_piece_lands_in_the_time_the_fit_predicts() -> None:
    tuner = FetchTuner(FetchLimits(min_inflight=1, max_inflight=1), piece=1 * MiB, inflight=1)
    assert tuner.piece_seconds() == 0.0  # nothing fitted yet: no prediction
    origin = ModelOrigin(0.02, 25e6, link=25e6)  # an object store's GET: 20 ms, 25 MB/s
    run(tuner, origin, 64, [20_000, 1 * MiB, 300_000, 4 * MiB])
    assert tuner.piece_seconds() == pytest.approx(origin.seconds(tuner.piece, 1), rel=0.05)


def test_one_size_alone_does_not_move_the_piece() -> None:
    tuner = FetchTuner(piece=4 * MiB)
    run(tuner, ModelOrigin(0.01, 50e6, 50e6), 200, [4 * MiB])
    assert tuner.fit() is None and tuner.piece == 4 * MiB


def test_requests_in_flight_climb_to_the_link_and_no_further() -> None:
    # Each request gets 40 MB/s; the link carries 320 MB/s: about 8 in flight fill it.
    tuner = FetchTuner(FetchLimits(max_inflight=32), inflight=2)
    origin = ModelOrigin(0.001, 40e6, 320e6)
    run(tuner, origin, 3000, [4 * MiB])
    assert 6 <= tuner.inflight <= 12
    assert tuner.rate >= 0.85 * 320e6


def test_a_shared_link_keeps_the_floor_and_climbs_when_it_is_free() -> None:
    # Another process fills the link: this tuner's rate stays flat whatever it adds, so it
    # steps back, but not below the floor.
    tuner = FetchTuner(FetchLimits(max_inflight=16), inflight=8)
    shared = ModelOrigin(0.001, 40e6, 40e6)  # its share: as if one stream, however many
    run(tuner, shared, 2000, [4 * MiB])
    assert tuner.inflight == 4  # stepped back to the floor, not to 2 or 1
    # The other process is done: the whole link (320 MB/s) is this one's, and it climbs.
    run(tuner, ModelOrigin(0.001, 40e6, 320e6), 3000, [4 * MiB])
    assert 6 <= tuner.inflight <= 12


def test_a_fast_local_origin_keeps_few_in_flight() -> None:
    # One request already fills the link: more in flight buys nothing.
    tuner = FetchTuner(FetchLimits(max_inflight=32), inflight=4)
    run(tuner, ModelOrigin(0.0001, 2e9, 2e9), 3000, [4 * MiB])
    assert tuner.inflight <= 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 64 * MiB), st.floats(0, 30, allow_nan=False)), max_size=300)
)
def test_any_observations_keep_the_choices_in_bounds(seen: list[tuple[int, float]]) -> None:
    limits = FetchLimits()
    tuner = FetchTuner(limits)
    now = 0.0
    for nbytes, seconds in seen:
        now += seconds
        tuner.observe(nbytes, seconds, now)
    assert limits.min_piece <= tuner.piece <= limits.max_piece
    assert tuner.piece % (64 * 1024) == 0 or tuner.piece in (limits.min_piece, limits.max_piece)
    assert limits.min_inflight <= tuner.inflight <= limits.max_inflight


def test_lead_reads_follows_the_read_rate_and_the_origin() -> None:
    # 2,000 reads/s; a 64 MiB chunk at 320 MB/s takes 0.21 s: 2 x 419 reads ahead.
    assert lead_reads(2000, 64 * MiB, 320e6) == 839
    assert lead_reads(2000, 64 * MiB, 320e6, queued_bytes=64 * MiB) == 1678
    assert lead_reads(4000, 64 * MiB, 320e6) == 2 * lead_reads(2000, 64 * MiB, 320e6)
    assert lead_reads(10, 16 * MiB, 1e9) == 64  # the floor
    assert lead_reads(2000, 64 * MiB, 0) == 64  # not measured yet


def test_look_ahead_comes_every_50_ms_with_the_lead_of_the_read_rate() -> None:
    ahead = LookAhead(chunk_bytes=64 * MiB)
    horizons = [ahead.due(i / 2000, origin_rate=320e6, queued=0) for i in range(401)]  # 0.2 s
    due = [h for h in horizons if h]
    assert 3 <= len(due) <= 4  # every 50 ms of reads
    assert all(h == pytest.approx(lead_reads(2000, 64 * MiB, 320e6), rel=0.02) for h in due)
    assert ahead.due(0.3, origin_rate=1.0, queued=0) == 8192  # a slow origin: capped


def test_a_tuner_starts_where_its_origin_does_well() -> None:
    files = FetchTuner.starting(0, threads=8, piece=MiB)  # no preference: a few, within 8
    assert (files.inflight, files.limits.max_inflight) == (4, 8)
    two = FetchTuner.starting(0, threads=2, piece=MiB).limits  # as set, the floor within it
    assert (two.min_inflight, two.max_inflight) == (2, 2)
    store = FetchTuner.starting(16, threads=8, piece=MiB)  # an object store: many at once
    assert (store.inflight, store.limits.max_inflight) == (16, 32)  # and room to climb
    assert store.limits.min_piece == FetchLimits.min_piece


def test_a_store_that_bills_requests_never_gets_pieces_below_the_first() -> None:
    """A fit that says requests are cheap (small latency) would make pieces small and GETs
    many; where each is billed the first piece is the floor, so a chunk's GETs are bounded."""
    tuner = FetchTuner.starting(32, threads=8, piece=4 * MiB, costly=True)
    for i in range(64):  # latency 1 ms, 100 MB/s a request: the fit wants ~0.9 MB pieces
        size = (i % 4 + 1) * MiB
        tuner.observe(size, 0.001 + size / 100e6, now=i * 0.01, piece=True)
    assert tuner.fitted is not None and tuner.piece == 4 * MiB
