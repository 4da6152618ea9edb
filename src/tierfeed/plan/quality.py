"""Shuffle quality: how mixed a rank's batches are and how far samples move from store order."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["batch_class_entropy", "displacement"]


def batch_class_entropy(
    order: npt.NDArray[np.int64], labels: npt.NDArray[np.int64], batch_size: int
) -> float:
    """Mean entropy (bits) of the class histogram of each full batch of ``order``.

    A class-sorted read order scores ~0; a uniform shuffle scores close to
    log2(min(batch_size, classes)).
    """
    full = len(order) // batch_size * batch_size
    if full == 0:
        return 0.0
    batches = labels[order[:full]].reshape(-1, batch_size)
    # Step 1: per-batch histograms via sort + run lengths, vectorised over batches.
    batches = np.sort(batches, axis=1)
    change = np.ones_like(batches, dtype=bool)
    change[:, 1:] = batches[:, 1:] != batches[:, :-1]
    run_id = np.cumsum(change.ravel()) - 1
    counts = np.bincount(run_id).astype(np.float64)
    owner = np.repeat(np.arange(len(batches)), change.sum(axis=1))
    # Step 2: entropy per batch from its class counts.
    p = counts / batch_size
    per_batch = np.bincount(owner, weights=-p * np.log2(p), minlength=len(batches))
    return float(per_batch.mean())


def displacement(order: npt.NDArray[np.int64], num_samples: int) -> float:
    """Mean |position in the read order - position in the store|, as fractions of the whole.

    Relative to store order; a uniform permutation of everything scores 1/3.
    """
    if len(order) == 0:
        return 0.0
    where = np.arange(len(order)) / len(order)
    return float(np.abs(where - order / num_samples).mean())
