"""Sampling plans: global, local, partial-local (PLS) and chunk-wise; resumable and elastic."""

from tierfeed.plan.plan import Exchange, Plan
from tierfeed.plan.progress import (
    Done,
    EpochProgress,
    PlanState,
    remaining_order,
    remaining_shares,
)
from tierfeed.plan.shape import DatasetShape
from tierfeed.plan.spec import PlanSpec

__all__ = [
    "DatasetShape",
    "Done",
    "EpochProgress",
    "Exchange",
    "Plan",
    "PlanSpec",
    "PlanState",
    "remaining_order",
    "remaining_shares",
]
