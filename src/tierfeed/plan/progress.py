"""Resume and elasticity: where an epoch stands, as a few integers, and the orders that remain.

An epoch's progress is a list of segments ``(world_size, consumed)``: ranks ran in lockstep
under one world size and each consumed ``consumed`` entries of its order, then the job
restarted (perhaps with another world size). The samples not yet delivered are what each
rank had left, padding excluded; the next segment splits them across its ranks, so the epoch
still delivers every sample exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError
from tierfeed.plan.plan import Plan, PlanSpec, _fit

__all__ = ["EpochProgress", "PlanState", "remaining_order", "remaining_shares"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class EpochProgress:
    """What an epoch has delivered: one (world_size, consumed per rank) per segment."""

    segments: tuple[tuple[int, int], ...] = ()

    def then(self, world_size: int, consumed: int) -> EpochProgress:
        """This progress followed by a segment of ``consumed`` samples per rank."""
        return EpochProgress((*self.segments, (world_size, consumed)))


@dataclass
class PlanState:
    """`state_dict()` of a plan in a job: a few integers and the spec's text."""

    spec: PlanSpec
    epoch: int = 0
    progress: EpochProgress = field(default_factory=EpochProgress)

    def state_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "spec": str(self.spec),
            "seed": self.spec.seed,
            "drop_last": self.spec.drop_last,
            "epoch": self.epoch,
            "segments": [list(s) for s in self.progress.segments],
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> PlanState:
        """Inverse of `state_dict`."""
        spec = PlanSpec.parse(d["spec"], seed=int(d["seed"]), drop_last=bool(d["drop_last"]))
        segments = tuple((int(w), int(c)) for w, c in d["segments"])
        return cls(spec, int(d["epoch"]), EpochProgress(segments))


def _left_over(plan: Plan, epoch: int, progress: EpochProgress) -> IntArray | None:
    """Undelivered samples of the epoch in a deterministic sequence, or None if untouched."""
    left: IntArray | None = None
    for world_size, consumed in progress.segments:
        if left is None:
            unpadded = [plan._unpadded(epoch, r, world_size) for r in range(world_size)]
        else:
            unpadded = [left[r::world_size] for r in range(world_size)]
        if consumed < 0 or consumed > max(len(u) for u in unpadded):
            raise ConfigError(f"progress consumed {consumed} samples per rank: out of range")
        left = np.concatenate([u[consumed:] for u in unpadded])
    return left


def remaining_shares(
    plan: Plan, epoch: int, world_size: int, progress: EpochProgress
) -> list[IntArray]:
    """Every rank's unpadded share of what ``epoch`` has left after ``progress``."""
    left = _left_over(plan, epoch, progress)
    if left is None:
        return [plan._unpadded(epoch, r, world_size) for r in range(world_size)]
    return [left[r::world_size] for r in range(world_size)]


def remaining_order(
    plan: Plan, epoch: int, rank: int, world_size: int, progress: EpochProgress
) -> IntArray:
    """Rank ``rank``'s order for the rest of ``epoch`` after ``progress``, counts equalized.

    With no progress this is `Plan.order`. After a restart it splits what was left across the
    new world, one sample to each rank in turn, and pads (or cuts, with drop_last) to equal
    counts.
    """
    left = _left_over(plan, epoch, progress)
    if left is None:
        return plan.order(epoch, rank, world_size)
    shares = [left[r::world_size] for r in range(world_size)]
    sizes = [len(s) for s in shares]
    target = min(sizes) if plan.spec.drop_last else max(sizes)
    if target == 0:
        return np.zeros(0, dtype=np.int64)
    # A rank left with nothing pads from what the others have left (DistributedSampler pads).
    return _fit(shares[rank] if len(shares[rank]) else left, target)
