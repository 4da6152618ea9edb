"""A keyed pseudo-random permutation of [0, n) evaluated at any positions, without building it.

A balanced Feistel network on 2k bits (2^2k >= n) with a splitmix64-style round function is a
bijection of [0, 2^2k); cycle-walking (re-applying it to values >= n) restricts it to [0, n).
A rank can then read its share of a global shuffle in O(N/M) time and memory instead of
permuting all N samples as DistributedSampler does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["feistel_invert", "feistel_permute", "mix"]

ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix(x: npt.NDArray[np.uint64], key: np.uint64) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser of x ^ key: every output bit depends on every input bit (a
    keyed hash of each value, also the round function of the networks below)."""
    with np.errstate(over="ignore"):
        z = x ^ key  # the only new array: the steps below work in place
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
        return z


def _feistel(
    x: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64], half: int
) -> npt.NDArray[np.uint64]:
    mask = np.uint64((1 << half) - 1)
    left, right = x >> np.uint64(half), x & mask
    for key in keys:
        left, right = right, left ^ (mix(right, key) & mask)
    return (left << np.uint64(half)) | right


def _feistel_back(
    y: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64], half: int
) -> npt.NDArray[np.uint64]:
    """The inverse of `_feistel`: its rounds undone, last key first."""
    mask = np.uint64((1 << half) - 1)
    left, right = y >> np.uint64(half), y & mask
    for key in keys[::-1]:
        left, right = right ^ (mix(left, key) & mask), left
    return (left << np.uint64(half)) | right


def _cycle_walk(
    start: npt.ArrayLike,
    n: int,
    seed_words: npt.NDArray[np.uint64],
    step: Callable[[npt.NDArray[np.uint64], npt.NDArray[np.uint64], int], npt.NDArray[np.uint64]],
) -> npt.NDArray[np.int64]:
    """``step`` (the network or its inverse) applied until every value lies in [0, n)."""
    out = np.asarray(start, dtype=np.uint64)
    if n <= 1:
        return out.astype(np.int64)
    half = max(1, (int(n - 1).bit_length() + 1) // 2)
    keys = np.asarray(seed_words[:ROUNDS], dtype=np.uint64)
    out = step(out, keys, half)
    # The domain is < 4n, so each step leaves fewer than 3/4 outside [0, n).
    outside = out >= np.uint64(n)
    while outside.any():
        out[outside] = step(out[outside], keys if keys.ndim == 1 else keys[:, outside], half)
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


def feistel_permute(
    positions: npt.ArrayLike, n: int, seed_words: npt.NDArray[np.uint64]
) -> npt.NDArray[np.int64]:
    """perm[positions] of a keyed permutation of [0, n).

    Args:
        positions: indices in [0, n).
        n: the size of the permuted range.
        seed_words: at least ROUNDS uint64 keys (e.g. SeedSequence.generate_state), or
            an array of shape (ROUNDS, len(positions)): a permutation of its own for each
            position.
    """
    return _cycle_walk(positions, n, seed_words, _feistel)


def feistel_invert(
    values: npt.ArrayLike, n: int, seed_words: npt.NDArray[np.uint64]
) -> npt.NDArray[np.int64]:
    """The positions at which `feistel_permute` with the same ``n`` and ``seed_words`` puts
    ``values``: ``feistel_permute(feistel_invert(v, n, w), n, w) == v``. Lets a rank find
    where the samples it holds fall in a global shuffle in O(its samples). The walk goes
    backwards through the values outside [0, n) that the permutation walked forwards.

    Args:
        values: values in [0, n).
        n: the size of the permuted range.
        seed_words: the keys given to `feistel_permute`.
    """
    return _cycle_walk(values, n, seed_words, _feistel_back)
