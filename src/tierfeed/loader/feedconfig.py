"""What a feed is given: its options in one frozen `FeedConfig`, and what it needs of a plan
and of a sample exchange."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tierfeed.loader.latency import DeadlineOptions
from tierfeed.loader.stream import PrefetchOptions
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.store import Sample
from tierfeed.units import count
from tierfeed.world import World

__all__ = ["EpochExchange", "FeedConfig", "OrderPlan"]


class OrderPlan(Protocol):
    """What the feed needs of a sampling plan: a rank's sample order for an epoch."""

    def order(self, epoch: int, rank: int, world_size: int) -> npt.NDArray[np.int64]:
        """Sample ids rank ``rank`` reads in ``epoch``, in order (`tierfeed.plan.Plan` does)."""
        ...


class EpochExchange(Protocol):
    """What paces a sample exchange between ranks (`tierfeed.distributed.Exchanger` does):
    the Loader reports how far the epoch has been read."""

    def begin_epoch(self, epoch: int, start: int = 0, margin: int = 0) -> None:
        """The epoch starts; ``start`` positions were read before a resume; readers run up
        to ``margin`` positions ahead of what is reported consumed."""
        ...

    def consumed(self, epoch: int, positions: int) -> None:
        """``positions`` of the rank's order have been delivered."""
        ...

    def end_epoch(self, epoch: int) -> None:
        """The epoch has been read."""
        ...


@dataclass(frozen=True)
class FeedConfig:
    """How a feed reads its plan, every option but the store and the plan in one value (see
    `tierfeed.torch.Dataset` for what each means to a user).

    Attributes:
        batch_size: samples per batch.
        decode: Sample -> what the batch holds per sample.
        collate: list of decoded samples -> batch.
        world: rank and world size.
        drop_last: drop the rank's last batch of an epoch if it is short.
        prefetch: the read-ahead window per worker.
        deadline: the deadline guard.
        hedge_source: a second ChunkSource to hedge late reads against (None: the store's
            own second way, else its chunk files read with O_DIRECT).
        exchange: the rank's sample exchange, paced by the Loader.
        read_across_epochs: an iteration runs on into the following epochs (a Loader's, whose
            workers outlive an epoch: `Feed.for_loader`).

    Raises:
        ConfigError: ``batch_size`` not an int of 1 or more.
    """

    batch_size: int
    decode: Callable[[Sample], Any]
    collate: Callable[[list[Any]], Any]
    world: World
    drop_last: bool = False
    prefetch: PrefetchOptions = field(default_factory=PrefetchOptions)
    deadline: DeadlineOptions = field(default_factory=DeadlineOptions)
    hedge_source: Callable[[], ChunkSource] | None = None
    exchange: EpochExchange | None = None
    read_across_epochs: bool = False

    def __post_init__(self) -> None:  # a count: an int, or a numpy integer (made an int)
        object.__setattr__(self, "batch_size", count(self.batch_size, "batch_size=...", 1))
