"""`job_dataset`: a `tierfeed.torch.Dataset` over a staged job (a `distributed.Namespace`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tierfeed.loader.feed import EpochExchange
from tierfeed.plan import Plan
from tierfeed.storage.store import Store
from tierfeed.torch.dataset import Dataset
from tierfeed.world import World

__all__ = ["StagedJob", "job_dataset"]


class JobExchange(EpochExchange, Protocol):
    """An exchange the Dataset paces, moving samples in steps of a batch."""

    batch_size: int


class StagedJob(Protocol):
    """What a Dataset needs of a staged job; `tierfeed.distributed.Namespace` is one.

    Described here rather than imported: the torch face and ``distributed`` sit at one level,
    and neither imports the other.
    """

    @property
    def opener(self) -> Callable[[], Store]:
        """Opens the rank's store in any process (picklable for DataLoader workers)."""
        ...

    @property
    def plan(self) -> Plan:
        """The plan the job was staged with and reads with."""
        ...

    @property
    def world(self) -> World:
        """This rank and the job's shape."""
        ...

    @property
    def exchanger(self) -> JobExchange:
        """Moves to each rank the samples it lacks, paced by the Loader."""
        ...


def job_dataset(job: StagedJob, batch_size: int = 32, **kwargs: Any) -> Dataset:
    """A `tierfeed.torch.Dataset` over a staged job's namespace, paced with its exchanger.

        ns = tierfeed.distributed.Namespace(comm, report.local_dir, plan="partial:0.3")
        loader = tierfeed.torch.Loader(job_dataset(ns, batch_size=64, decode=...))

    Args:
        job: the rank's namespace (`tierfeed.distributed.Namespace`).
        batch_size: samples a batch; the exchanger moves samples in steps of it.
        **kwargs: Dataset's other options (decode, collate, prefetch, deadline, ...).

    Returns:
        The Dataset; read it with `tierfeed.torch.Loader`, which paces the exchange (or call
        the exchanger's begin_epoch / consumed / end_epoch around a loop of your own).
    """
    job.exchanger.batch_size = batch_size
    return Dataset(
        job.opener,
        job.plan,
        batch_size=batch_size,
        world=job.world,
        exchange=job.exchanger,
        **kwargs,
    )
