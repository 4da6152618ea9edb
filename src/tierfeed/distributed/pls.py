"""The API shape of the partial-local-shuffling (PLS) reference code, over tierfeed.

For users porting a training loop written against PLS's scheduler:

    sched = Scheduler(local_dir, batch_size=32, fraction=0.3)     # after `tierfeed stage`
    for epoch in range(epochs):
        order = sched.scheduling(epoch)          # this rank's samples, in reading order
        for step in range(sched.steps):
            batch = [sched.store.read_sample(i) for i in order[step * 32:(step + 1) * 32]]
            ...train...
            sched.communicate()                   # moves due by now go out in the background
        sched.synchronize()                       # the next epoch's partition is complete
    sched.clean_local_storage()

It is a thin layer: the plan is `partial(fraction)`, the moves are `Exchanger`'s, reads go
through a tier stack over the rank's `NamespaceDriver`.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.comm import Comm
from tierfeed.distributed.exchanger import ExchangeOptions
from tierfeed.distributed.inbox import parts_dir, punched_dir
from tierfeed.distributed.job import Namespace
from tierfeed.distributed.namespace import inbox_dir
from tierfeed.errors import ConfigError
from tierfeed.format.relpath import safe_chunk_path
from tierfeed.plan import PlanSpec
from tierfeed.storage.store import Store

__all__ = ["Scheduler"]


class Scheduler:
    """Partial local shuffling with PLS's calls: scheduling, communicate, synchronize.

    Args:
        dataset: the rank's node-local store directory (staged with plan ``partial:Q``).
        batch_size: samples per step on this rank.
        fraction: Q, the fraction of each partition exchanged per epoch.
        seed: the plan's seed (the same on every rank).
        comm: the byte group (a new one by default; torch.distributed must be initialized).
        options: exchange window and timeout.
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        batch_size: int,
        fraction: float,
        seed: int = 0,
        comm: Comm | None = None,
        options: ExchangeOptions | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.comm = comm or Comm()
        self._own_comm = comm is None
        spec = PlanSpec("partial", fraction, seed=seed)
        self.namespace = Namespace(self.comm, dataset, spec, options=options)
        self.namespace.exchanger.batch_size = batch_size
        self.store: Store = self.namespace.opener()
        self.epoch = -1
        self.step = 0
        self.order: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)

    @property
    def steps(self) -> int:
        """Steps of the current epoch (equal on every rank)."""
        return -(-len(self.order) // self.batch_size)

    def scheduling(self, epoch: int) -> npt.NDArray[np.int64]:
        """Start ``epoch``: its moves are scheduled; returns this rank's sample order."""
        self.epoch, self.step = epoch, 0
        plan, world = self.namespace.plan, self.namespace.world
        self.order = plan.order(epoch, world.rank, world.world_size)
        self.store.source.begin_epoch()
        self.namespace.exchanger.begin_epoch(epoch)
        return self.order

    def communicate(self) -> None:
        """One training step is done: moves of samples read by now may go out."""
        self.step += 1
        consumed = min(len(self.order), self.step * self.batch_size)
        self.namespace.exchanger.consumed(self.epoch, consumed)

    def synchronize(self) -> None:
        """End of the epoch: finish every move (on every rank)."""
        self.namespace.exchanger.end_epoch(self.epoch)
        self.namespace.exchanger.finish()

    def clean_local_storage(self) -> None:
        """Delete what this rank holds locally: its inbox, its parts of split chunks, its
        punch marks and the chunks it staged."""
        ns = self.namespace
        local = ns.local_dir
        staged = ns.holdings.staged_by(ns.world.rank)
        index = self.store.index
        # Checked to stay inside the local directory: a crafted chunk name never deletes
        # a file elsewhere.
        paths = [safe_chunk_path(local, index.chunk_name(int(c)), index.path) for c in staged]
        self.close()
        for mine in (inbox_dir, parts_dir, punched_dir):
            shutil.rmtree(mine(local, ns.world.rank), ignore_errors=True)
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def close(self) -> None:
        """Finish exchanges and release files (and the group, when this scheduler made it)."""
        self.store.close()
        self.namespace.close()
        if self._own_comm:
            self.comm.close()
