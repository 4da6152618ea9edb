"""The World value: rank, world size and node layout as plain ints, testable without torch."""

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
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world of size {self.world_size}")
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(
                f"local rank {self.local_rank} is outside node of size {self.local_world_size}"
            )

    @property
    def node(self) -> int:
        """Index of this rank's node, assuming ranks are laid out node by node."""
        return self.rank // self.local_world_size
