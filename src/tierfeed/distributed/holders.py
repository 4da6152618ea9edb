"""Who holds which chunk after stage-in: pure functions of the dataset shape, plan and world.

Every rank computes the same answer without talking to the others, which is what lets every
rank schedule every exchange ahead of time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tierfeed.plan import DatasetShape, PlanSpec
from tierfeed.plan.shuffle import local_bounds
from tierfeed.world import World

__all__ = ["Holdings", "chunk_holders"]

IntArray = npt.NDArray[np.int64]


def chunk_holders(
    shape: DatasetShape, chunk_bytes: npt.ArrayLike, spec: PlanSpec, world_size: int
) -> IntArray:
    """The rank that stages (copies from the origin, then serves) each chunk.

    Partition plans (``local``, ``partial``): the rank whose initial partition holds the
    chunk, so that each rank starts with its own partition on local storage. ``global``:
    contiguous runs of chunks balanced by bytes (a chunk goes to the rank its middle byte
    falls to).
    """
    sizes = np.asarray(chunk_bytes, dtype=np.int64)
    if spec.policy in ("local", "partial"):
        bounds = local_bounds(shape, world_size)
        first = shape.chunk_starts()[:-1]
        return np.clip(np.searchsorted(bounds, first, side="right") - 1, 0, world_size - 1)
    total = max(1, int(sizes.sum()))
    middle = np.cumsum(sizes) - sizes / 2.0
    return np.minimum((middle * world_size // total).astype(np.int64), world_size - 1)


@dataclass(frozen=True)
class Holdings:
    """Where each chunk lives after stage-in, and what each rank can read without a peer.

    Attributes:
        holder: rank that staged each chunk.
        local_world_size: ranks per node (they share the node's staged copy).
        per_rank: partition plans: a rank reads only its own staged chunks, since it deletes
            what it sends to peers (ranks of a node do not share a partition).
    """

    holder: IntArray
    local_world_size: int = 1
    per_rank: bool = False

    @classmethod
    def of(
        cls, shape: DatasetShape, chunk_bytes: npt.ArrayLike, spec: PlanSpec, world: World
    ) -> Holdings:
        """The holdings of a job: ``world`` gives the ranks and the ranks per node."""
        holder = chunk_holders(shape, chunk_bytes, spec, world.world_size)
        return cls(holder, world.local_world_size, spec.policy == "partial")

    def node_of(self, rank: int | IntArray) -> IntArray:
        """Node index of ``rank`` (ranks are laid out node by node)."""
        return np.asarray(rank, dtype=np.int64) // self.local_world_size

    def local_to(self, rank: int) -> npt.NDArray[np.bool_]:
        """Per chunk: can ``rank`` read it from its node's local storage?"""
        if self.per_rank:
            return np.asarray(self.holder == rank, dtype=bool)
        return np.asarray(self.node_of(self.holder) == self.node_of(rank), dtype=bool)

    def staged_by(self, rank: int) -> IntArray:
        """Chunk ids ``rank`` copies from the origin during stage-in."""
        return np.flatnonzero(self.holder == rank).astype(np.int64)
