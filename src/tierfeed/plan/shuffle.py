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


def local_bounds(num_samples: int, world_size: int) -> npt.NDArray[np.int64]:
    """Partitions balanced to the sample: contiguous runs of the store, cut where the counts
    say, so a rank may own part of a chunk at either end of its run.

    Returns:
        ``bounds`` of length world_size + 1: rank r owns samples [bounds[r], bounds[r+1]),
        floor(N/M) or ceil(N/M) of them.
    """
    return (np.arange(world_size + 1, dtype=np.int64) * num_samples) // max(1, world_size)
