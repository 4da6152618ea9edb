"""Pure shuffles of sample-id arrays: a full permutation, or DIESEL's chunk-wise window shuffle."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tierfeed.plan.shape import DatasetShape

__all__ = ["local_bounds", "rng_for", "shuffle_samples"]

# Purposes keep the random streams of one (seed, epoch) independent of each other.
PURPOSE_ORDER, PURPOSE_SLOTS, PURPOSE_RING = 1, 2, 3


def rng_for(seed: int, epoch: int, purpose: int, rank: int = 0) -> np.random.Generator:
    """A Generator that depends only on its arguments (PCG64, explicit bit generator)."""
    seq = np.random.SeedSequence([seed, epoch, purpose, rank])
    return np.random.Generator(np.random.PCG64(seq))


def shuffle_samples(
    samples: npt.NDArray[np.int64], shape: DatasetShape, rng: np.random.Generator, window: int
) -> npt.NDArray[np.int64]:
    """Shuffle ``samples``: fully (window 0), or chunk-wise in windows of ``window`` chunks.

    Chunk-wise (DIESEL): shuffle the order of the chunks the samples come from, cut it into
    windows of ``window`` chunks, and shuffle the samples inside each window, so a reader
    keeps only ``window`` chunks open at a time.
    """
    if window <= 0:
        return rng.permutation(samples)
    # Step 1: the chunks present, in a random order (runs of a sorted chunk column are
    # found without a sort).
    chunks = shape.sample_chunk[samples]
    if len(chunks) > 1 and bool(np.all(chunks[1:] >= chunks[:-1])):
        starts = np.ones(len(chunks), dtype=bool)
        starts[1:] = chunks[1:] != chunks[:-1]
        inverse = np.cumsum(starts) - 1
        present = int(inverse[-1]) + 1
    else:
        inverse = np.unique(chunks, return_inverse=True)[1].reshape(-1)
        present = int(inverse.max()) + 1 if len(inverse) else 0
    chunk_pos = np.empty(present, dtype=np.int64)
    chunk_pos[rng.permutation(present)] = np.arange(present)
    # Step 2: each sample's window is its chunk's position // window.
    window_of = chunk_pos[inverse] // window
    # Step 3: a random key in [0, 1) orders samples inside each window: one argsort.
    key = window_of + rng.random(len(samples))
    return samples[np.argsort(key)]  # keys are distinct with probability 1


def local_bounds(shape: DatasetShape, world_size: int) -> npt.NDArray[np.int64]:
    """Sample ranges of a partition into whole chunks balanced by sample count.

    Returns:
        ``bounds`` of length world_size + 1: rank r owns samples [bounds[r], bounds[r+1]).
    """
    starts = shape.chunk_starts()
    num_chunks = len(starts) - 1
    ideal = np.arange(world_size + 1) * shape.num_samples / world_size
    # Step 1: cut at the chunk start nearest each ideal boundary (whole chunks per rank).
    idx = np.clip(np.searchsorted(starts, ideal), 1, num_chunks)
    nearer_left = (ideal - starts[idx - 1]) <= (starts[idx] - ideal)
    cut = np.where(nearer_left, idx - 1, idx).astype(np.int64)
    cut[0], cut[-1] = 0, num_chunks
    # Step 2: at least one chunk per rank when there are enough chunks (forward, then back).
    if num_chunks >= world_size:
        r = np.arange(world_size + 1)
        cut = np.maximum.accumulate(cut - r) + r  # cut[r] >= cut[r-1] + 1
        cut[-1] = num_chunks
        cut = np.minimum.accumulate((cut - r)[::-1])[::-1] + r  # cut[r] <= cut[r+1] - 1
        cut[0] = 0
    return starts[np.maximum.accumulate(cut)].astype(np.int64)
