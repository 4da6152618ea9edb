"""Resume and elasticity: where an epoch stands, as a few integers, and the orders that remain.

An epoch's progress is a list of segments ``(world_size, consumed)``: ranks ran under one
world size, then the job restarted with another. ``consumed`` is either a count (each rank
consumed that prefix of its order, in lockstep) or one `Done` per rank (the positions of its
order it delivered, whatever its workers' deferrals left out of order). The samples not yet
delivered are what each rank had left, padding excluded; the next segment splits them across
its ranks, so the epoch still delivers every sample exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError
from tierfeed.plan.plan import Plan, _fit
from tierfeed.plan.spec import PLANS, PlanSpec

__all__ = ["Done", "EpochProgress", "PlanState", "remaining_order", "remaining_shares"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Done:
    """Positions of one rank's order that need no more delivery: every position below
    ``prefix`` and those in ``extra`` (each above it). A few integers whatever the order's size:
    only reads a deferral moved ahead of a gap are listed one by one."""

    prefix: int = 0
    extra: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.prefix < 0 or any(p <= self.prefix for p in self.extra):
            raise ConfigError(f"done positions out of range: prefix {self.prefix}, {self.extra}")

    @classmethod
    def of(cls, mask: BoolArray) -> Done:
        """The positions set in ``mask``."""
        undone = np.flatnonzero(~mask)
        prefix = int(undone[0]) if len(undone) else len(mask)
        extra = np.flatnonzero(mask[prefix:]) + prefix
        return cls(prefix, tuple(int(p) for p in extra))

    def mask(self, n: int) -> BoolArray:
        """Which of positions ``0 .. n-1`` are done (positions past ``n``: padding, ignored)."""
        out = np.zeros(n, dtype=bool)
        out[: min(self.prefix, n)] = True
        extra = np.asarray(self.extra, dtype=np.int64)
        out[extra[extra < n]] = True
        return out

    def to_list(self) -> list[Any]:
        """Plain values for a state_dict."""
        return [self.prefix, list(self.extra)]

    @classmethod
    def from_list(cls, value: Any) -> Done:
        """Inverse of `to_list`."""
        prefix, extra = value
        return cls(int(prefix), tuple(int(p) for p in extra))


Consumed = int | tuple[Done, ...]  # a lockstep count per rank, or each rank's done positions


@dataclass(frozen=True)
class EpochProgress:
    """What an epoch has delivered: one (world_size, consumed) per segment."""

    segments: tuple[tuple[int, Consumed], ...] = ()

    def then(self, world_size: int, consumed: int | Sequence[Done]) -> EpochProgress:
        """This progress followed by a segment: ``consumed`` samples per rank, or each rank's
        `Done` (one per rank of ``world_size``)."""
        if not isinstance(consumed, int):
            consumed = tuple(consumed)
            if len(consumed) != world_size:
                raise ConfigError(
                    f"a segment of {world_size} ranks needs every rank's progress, "
                    f"got {len(consumed)}"
                )
        return EpochProgress((*self.segments, (world_size, consumed)))

    def to_list(self) -> list[Any]:
        """Plain values for a state_dict."""
        return [
            [w, c if isinstance(c, int) else [d.to_list() for d in c]] for w, c in self.segments
        ]

    @classmethod
    def from_list(cls, value: Any) -> EpochProgress:
        """Inverse of `to_list`."""
        progress = cls()
        for w, c in value:
            consumed = int(c) if isinstance(c, int) else [Done.from_list(d) for d in c]
            progress = progress.then(int(w), consumed)
        return progress


@dataclass
class PlanState:
    """`state_dict()` of a plan in a job: a few integers and the spec's text."""

    spec: PlanSpec
    epoch: int = 0
    progress: EpochProgress = field(default_factory=EpochProgress)
    plans: int = PLANS  # the generation of local and partial plans the state was saved under

    def state_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "plans": self.plans,
            "spec": str(self.spec),
            "seed": self.spec.seed,
            "drop_last": self.spec.drop_last,
            "epoch": self.epoch,
            "segments": self.progress.to_list(),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> PlanState:
        """Inverse of `state_dict`."""
        spec = PlanSpec.parse(d["spec"], seed=int(d["seed"]), drop_last=bool(d["drop_last"]))
        plans = int(d.get("plans", 1))  # states of generation 1 did not say
        return cls(spec, int(d["epoch"]), EpochProgress.from_list(d["segments"]), plans)


def _unpadded_shares(plan: Plan, epoch: int, world_size: int) -> list[IntArray]:
    """Every rank's unpadded order of ``epoch`` (`Plan._unpadded` of each rank). A global plan's
    are cut from one pass over its permutation: a world of many ranks costs O(samples), not a
    permutation call per rank."""
    if plan.spec.policy != "global":
        return [plan._unpadded(epoch, r, world_size) for r in range(world_size)]
    per = plan._per_rank(world_size)
    positions = np.arange(min(plan.shape.num_samples, per * world_size), dtype=np.int64)
    permutation = plan._global_at(epoch, positions) if len(positions) else positions
    if plan.spec.window:  # chunk-wise: rank r reads positions [r*per, (r+1)*per)
        return [permutation[r * per : (r + 1) * per] for r in range(world_size)]
    return [permutation[r::world_size] for r in range(world_size)]  # r, r+M, ...


def _left_over(plan: Plan, epoch: int, progress: EpochProgress) -> IntArray | None:
    """Undelivered samples of the epoch in a deterministic sequence, or None if untouched."""
    left: IntArray | None = None
    for world_size, consumed in progress.segments:
        if left is None:
            unpadded = _unpadded_shares(plan, epoch, world_size)
        else:
            unpadded = [left[r::world_size] for r in range(world_size)]
        if isinstance(consumed, int):
            if consumed < 0 or consumed > max(len(u) for u in unpadded):
                raise ConfigError(f"progress consumed {consumed} samples per rank: out of range")
            left = np.concatenate([u[consumed:] for u in unpadded])
        else:
            left = np.concatenate(
                [u[~d.mask(len(u))] for u, d in zip(unpadded, consumed, strict=True)]
            )
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
