"""The World value: rank, world size and DataLoader worker as plain ints, testable without torch."""

from __future__ import annotations

from dataclasses import dataclass

from tierfeed.errors import ConfigError

__all__ = ["World"]


@dataclass(frozen=True)
class World:
    """Where this process sits in the job.

    Attributes:
        rank: global rank of this process, ``0 <= rank < world_size``.
        world_size: number of ranks in the job.
        local_rank: rank within its node.
        local_world_size: ranks on this node.
        worker: DataLoader worker id inside the rank (0 when there are none).
        num_workers: DataLoader workers per rank (1 when there are none).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world of size {self.world_size}")
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(
                f"local rank {self.local_rank} is outside node of size {self.local_world_size}"
            )
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ConfigError(f"worker {self.worker} is outside {self.num_workers} workers")

    @property
    def node(self) -> int:
        """Index of this rank's node, assuming ranks are laid out node by node."""
        return self.rank // self.local_world_size

    @property
    def num_nodes(self) -> int:
        """Number of nodes, assuming every node runs ``local_world_size`` ranks."""
        return max(1, self.world_size // self.local_world_size)

    def with_worker(self, worker: int, num_workers: int) -> World:
        """Return this world seen from inside DataLoader worker ``worker`` of ``num_workers``."""
        return World(
            self.rank,
            self.world_size,
            self.local_rank,
            self.local_world_size,
            worker,
            num_workers,
        )
