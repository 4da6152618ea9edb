"""The piece size of a copy follows how the plan reads its chunk (issue 45): the tuner's piece
where neighbouring reads come together, a few samples' bytes where a shuffle spreads them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.format.index import Index
from tierfeed.storage import PosixDriver, TierStack
from tierfeed.storage.piecefetch import spread_piece
from tierfeed.storage.tiers import TierOptions, disk_tier

pytestmark = pytest.mark.timeout(60)
KIB, MIB = 1024, 2**20


def reads(order: np.ndarray, sample: int = 100_000) -> tuple[np.ndarray, ...]:
    """A chunk's reads: sample ``k`` (at offset ``k * sample``) comes at ``order[k]``."""
    starts = np.arange(len(order), dtype=np.int64) * sample
    return np.asarray(order, dtype=np.int64), starts, starts + sample - 1000


def test_a_sequence_keeps_the_tuners_piece() -> None:
    n = 600
    assert spread_piece(8 * MIB, 512 * KIB, *reads(np.arange(n))) == 8 * MIB
    # Two workers' batches interleaved, a chunk-wise window of a few chunks: still near.
    window = np.arange(n) * 4 + np.tile([0, 1, 2, 3], n // 4)
    assert spread_piece(8 * MIB, 512 * KIB, *reads(window)) == 8 * MIB


def test_a_shuffle_gets_pieces_of_a_few_samples() -> None:
    rng = np.random.default_rng(1)
    shuffled = rng.permutation(20_000)[:600]  # a chunk's reads spread over a 20,000-read epoch
    piece = spread_piece(8 * MIB, 512 * KIB, *reads(shuffled, sample=300_000))
    assert piece % (64 * KIB) == 0 and 4 * 299_000 <= piece < 4 * 299_000 + 64 * KIB
    # Small samples: never under the floor; never over the tuner's piece.
    assert spread_piece(8 * MIB, 512 * KIB, *reads(shuffled, sample=10_000)) == 512 * KIB
    assert spread_piece(MIB, 512 * KIB, *reads(shuffled, sample=3 * MIB)) == MIB


@settings(max_examples=200, deadline=None)
@given(
    order=st.lists(st.integers(0, 100_000), min_size=0, max_size=50),
    piece=st.integers(1, 64 * MIB),
    floor=st.integers(1, 8 * MIB),
    sample=st.integers(1, 4 * MIB),
)
def test_a_spread_piece_lies_between_the_floor_and_the_tuners(
    order: list[int], piece: int, floor: int, sample: int
) -> None:
    got = spread_piece(piece, floor, *reads(np.asarray(order, dtype=np.int64), sample))
    assert got == piece or floor <= got < piece


def test_a_stack_told_a_shuffle_copies_in_small_pieces(store_dir: Path, tmp_path: Path) -> None:
    """The copy of a chunk the plan reads shuffled begins with the spread piece; told the
    same reads in sequence, with the tuner's."""
    index = Index(store_dir)
    origin = PosixDriver(store_dir, read_only=True)
    options = TierOptions(piece_bytes=16 * MIB)
    stack = TierStack(index.chunks(), origin, [disk_tier(tmp_path / "c", 10**9)], options=options)
    try:
        n = 2000
        chunk = np.zeros(n, dtype=np.int64)
        starts = np.arange(n, dtype=np.int64) * 1000
        floor = stack.fetch.tuner.limits.min_piece
        info = index.chunk(0)
        stack.set_reads(chunk, starts, starts + 900)  # the reads in the order they come
        assert stack.filler.copies.piece(info) == 16 * MIB  # in sequence
        order = np.random.default_rng(2).permutation(n)
        stack.set_reads(chunk[order], starts[order], starts[order] + 900)
        assert floor <= stack.filler.copies.piece(info) < 16 * MIB  # spread: a few samples' bytes
    finally:
        stack.close()


def test_reads_served_apart_rank_after_the_rest(store_dir: Path, tmp_path: Path) -> None:
    """Every worker's head is read apart (`served_first`): a copy fetches the pieces the reads
    after the heads need first, and the heads' own after all others, still in their order."""
    index = Index(store_dir)
    origin = PosixDriver(store_dir, read_only=True)
    stack = TierStack(index.chunks(), origin, [disk_tier(tmp_path / "c", 10**9)])
    try:
        chunk = np.zeros(6, dtype=np.int64)
        starts = np.arange(6, dtype=np.int64) * 100
        stack.set_reads(chunk, starts, starts + 50)
        positions, _, _ = stack.filler.foresight.reads_of(0)
        assert positions.tolist() == [0, 1, 2, 3, 4, 5]
        stack.served_first(2)  # the first two reads are the heads'
        positions, got_starts, _ = stack.filler.foresight.reads_of(0)
        assert positions.tolist() == [6, 7, 2, 3, 4, 5] and got_starts.tolist() == starts.tolist()
    finally:
        stack.close()
