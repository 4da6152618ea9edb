"""Whole batches to workers: a rank's epoch order cut into batches, dealt out in turn.

The rank's order is cut into batches first (batch b holds positions ``[b*B, (b+1)*B)``) and
worker w reads batches w, w+W, w+2W, ... -- what DataLoader does with a batch sampler. So
only the rank's last batch can be short, ``drop_last`` drops at most that one (its samples
are not read), and the number of batches an epoch yields is ``ceil(n/B)`` (``floor`` with
drop_last) whatever the number of workers.

A worker's guard may defer a late sample past the end of its batch into that worker's next
batch; it never moves one to another worker, so every worker still sends exactly as many
batches as it was dealt, and the counts above hold exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError

__all__ = ["batch_count", "read_positions", "worker_positions", "worker_slice"]


def _check(batch_size: int, worker: int = 0, num_workers: int = 1) -> None:
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ConfigError(f"worker {worker} of {num_workers}: need 0 <= worker < num_workers")


def batch_count(n: int, batch_size: int, drop_last: bool) -> int:
    """Batches an epoch of ``n`` samples yields: ``ceil(n/B)``, or ``floor(n/B)`` with
    drop_last (DataLoader's ``len``)."""
    _check(batch_size)
    return n // batch_size if drop_last else -(-n // batch_size)


def read_positions(n: int, batch_size: int, drop_last: bool) -> int:
    """How many positions of a rank's order of ``n`` an epoch reads: all of them, or with
    drop_last all but the short last batch."""
    return batch_count(n, batch_size, True) * batch_size if drop_last else n


def worker_positions(
    n: int, batch_size: int, worker: int, num_workers: int, drop_last: bool
) -> npt.NDArray[np.int64]:
    """Positions of the rank's order that ``worker`` reads, in order: its whole batches.

    With drop_last the positions of the short last batch belong to no worker.
    """
    _check(batch_size, worker, num_workers)
    positions = np.arange(read_positions(n, batch_size, drop_last), dtype=np.int64)
    mine: npt.NDArray[np.int64] = positions[(positions // batch_size) % num_workers == worker]
    return mine


def worker_slice(
    order: npt.NDArray[Any], batch_size: int, worker: int, num_workers: int, drop_last: bool
) -> npt.NDArray[np.int64]:
    """The samples of ``order`` that ``worker`` reads (see `worker_positions`)."""
    order = np.asarray(order, dtype=np.int64)
    return order[worker_positions(len(order), batch_size, worker, num_workers, drop_last)]
