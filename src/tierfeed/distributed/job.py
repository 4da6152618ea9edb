"""`Namespace`: after stage-in, the job reads one dataset spread over its nodes' local storage.

    comm = tierfeed.distributed.Comm()
    report = tierfeed.distributed.stage(origin, "/local/ssd/ds", plan="partial:0.3", comm=comm)
    ns = tierfeed.distributed.Namespace(comm, report.local_dir, plan="partial:0.3")
    loader = tierfeed.torch.Loader(tierfeed.torch.job_dataset(ns, batch_size=64), num_workers=4)

The torch face composes the job (`tierfeed.torch.job_dataset`); this package never imports
it. Every process of the rank (the DataLoader workers too) reads through a `TierStack` whose origin
is a `NamespaceDriver`, so a job has RAM and disk tiers like any other; the rank's `Exchanger`
(in the training process) moves what a rank lacks, paced by the Loader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.comm import Comm
from tierfeed.distributed.exchanger import ExchangeOptions, Exchanger
from tierfeed.distributed.holders import SampleHolders
from tierfeed.distributed.namespace import NamespaceDriver, inbox_dir, parts_dir, punched_dir
from tierfeed.errors import ConfigError
from tierfeed.format.index import Index
from tierfeed.loader.compose import TierConfig, plan_for, tier_stack
from tierfeed.plan import Plan, PlanSpec
from tierfeed.storage.store import Store
from tierfeed.world import World

__all__ = ["Namespace"]


@dataclass(frozen=True)
class _Opener:
    """Opens the rank's namespace in any process (picklable for DataLoader workers)."""

    local_dir: Path
    local: npt.NDArray[np.bool_]
    inbox: Path
    parts: Path
    punched: Path
    timeout_s: float
    verify_local: bool = False
    tiers: TierConfig = field(default_factory=TierConfig)

    def __call__(self) -> Store:
        index = Index(self.local_dir)
        origin = NamespaceDriver(
            index,
            self.local,
            self.inbox,
            self.timeout_s,
            self.verify_local,
            self.parts,
            self.punched,
        )
        return Store(index, tier_stack(index, self.tiers, origin))


class Namespace:
    """One rank's view of a staged dataset: an opener for its processes and its exchanger.

    Args:
        comm: the job's byte group (for rank and world; the exchanger makes a group of its
            own, so the training thread may keep using ``comm``).
        local_dir: this rank's node-local store (`StageReport.local_dir`).
        plan: the plan the job reads with (the same on every rank, and the one staged with).
        world: ranks per node; by default from torchrun's environment.
        options: exchange window, look-ahead and timeout.
        tiers: cache tiers in front of the namespace, built in each process (none by
            default); only chunks this node holds whole are copied into them.
    """

    def __init__(
        self,
        comm: Comm,
        local_dir: str | os.PathLike[str],
        plan: PlanSpec | str = "global",
        world: World | None = None,
        options: ExchangeOptions | None = None,
        tiers: TierConfig | None = None,
    ) -> None:
        self.local_dir = Path(local_dir).absolute()
        self.world = world or comm.world()
        self.options = options or ExchangeOptions()
        with Index(self.local_dir) as index:
            self.plan: Plan = plan_for(index, plan)
            self.holdings = SampleHolders.of(
                self.plan.shape, np.asarray(index.chunk_size), self.plan.spec, self.world
            )
        # A group of its own: the exchanger's collectives run on a background thread and must
        # never interleave with collectives the training thread issues on ``comm``.
        self._group = Comm(self.options.timeout_s)
        self.exchanger = Exchanger(
            self._group, self.local_dir, self.plan, self.holdings, self.options
        )
        self.opener = _Opener(
            self.local_dir,
            self.holdings.local_to(self.world.rank),
            inbox_dir(self.local_dir, self.world.rank),
            parts_dir(self.local_dir, self.world.rank),
            punched_dir(self.local_dir, self.world.rank),
            self.options.timeout_s,
            verify_local=self.holdings.per_rank,
            tiers=tiers or TierConfig(),
        )

    def dataset(self, *args: object, **kwargs: object) -> NoReturn:
        """Moved: ``tierfeed.torch.job_dataset(ns, batch_size=..., ...)`` (same arguments).

        Raises:
            ConfigError: always, naming the call to use instead (the PyTorch face composes
                the job; this package does not import it).
        """
        raise ConfigError(
            "Namespace.dataset() moved to tierfeed.torch: call "
            "tierfeed.torch.job_dataset(ns, batch_size=..., decode=...) with the same arguments"
        )

    def close(self) -> None:
        """Finish exchanges and release files and the exchange group."""
        self.exchanger.close()
        self._group.close()

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
