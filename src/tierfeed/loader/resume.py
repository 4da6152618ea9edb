"""Where a rank stands in an epoch, whatever its number of workers or the job's world size.

A worker's `StreamState` says which positions of *its* slice it delivered. `done_after` turns
every worker's state into the positions of the *rank's* order that need no more delivery (a
`Done`: a prefix and the few positions deferrals left beyond it), which no longer depends on
how many workers read it. A resumed run reads the rest (`run_positions`) dealt in whole batches
to however many workers it has; a job restarted with another world size adds the old ranks'
`Done`s as a segment of the epoch's `EpochProgress` and splits what is left across its ranks
(`tierfeed.plan.progress`). Either way every sample is delivered once per epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError
from tierfeed.format.index import Index
from tierfeed.loader.batching import read_positions, worker_slice
from tierfeed.loader.statecheck import store_entry
from tierfeed.loader.stream import StreamState
from tierfeed.plan import Plan
from tierfeed.plan.plan import PLANS, plans_match
from tierfeed.plan.progress import Done, EpochProgress, PlanState
from tierfeed.world import World

__all__ = [
    "Resume",
    "StoreId",
    "check_plan",
    "check_store",
    "done_after",
    "rank_state",
    "resume_from",
    "run_positions",
]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Resume:
    """Where an iteration of ``epoch`` starts: after the segments of ``progress`` (earlier world
    sizes), at the rank's ``done`` positions of the current segment's order."""

    epoch: int
    progress: EpochProgress = field(default_factory=EpochProgress)
    done: Done = field(default_factory=Done)


@dataclass(frozen=True)
class StoreId:
    """What a loader state records of the store it was taken on: its sample count and the
    index's sections checksum (any change to a sample, member, key or chunk row changes it),
    and where it was, for messages only: a copy of the store elsewhere is the same store."""

    samples: int
    index: str  # the header's sections checksum, 16 hex digits
    where: str

    @classmethod
    def of(cls, index: Index, where: str | None = None) -> StoreId:
        """The identity of the store ``index`` describes (``where``: its path or URL as the
        user gave it; the index's directory by default). O(1): read from the header."""
        checksum = int(index.header["sections_checksum"])
        return cls(index.num_samples, f"{checksum:016x}", where or str(index.path.parent))

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "index": self.index, "where": self.where}

    def said(self) -> str:
        # One line whatever the path holds (a saved state's may have been edited).
        where = "".join(c if c.isprintable() else repr(c)[1:-1] for c in self.where)
        return f"{where} ({self.samples} samples, index checksum {self.index})"


def check_store(state: Mapping[str, Any], store: StoreId, name: str = "") -> None:
    """Refuse a state saved on another store: its positions would name other samples. A state
    saved before states recorded their store (no ``store`` entry) is taken as it is.
    ``name``: how messages name the state (`state_name`)."""
    saved = store_entry(state, name)
    if saved is None:
        return
    was = StoreId(*saved)
    if (was.samples, was.index) != (store.samples, store.index):
        raise ConfigError(
            f"the state was saved on another store: {was.said()}; this loader reads "
            f"{store.said()}: resume on the store the state was saved on"
        )


def run_positions(n: int, batch_size: int, drop_last: bool, done: Done | None) -> IntArray:
    """Positions of a rank's order of ``n`` that a run reads: not done, and not in the short
    last batch that drop_last drops."""
    used = read_positions(n, batch_size, drop_last)
    positions = np.arange(used, dtype=np.int64)
    return positions if done is None else positions[~done.mask(used)]


def done_after(
    n: int,
    batch_size: int,
    drop_last: bool,
    before: Done | None,
    num_workers: int,
    states: Mapping[int, StreamState],
) -> Done:
    """The rank's done positions after a run that started at ``before`` and whose workers stand
    at ``states`` (a worker with no state delivered nothing). The dropped short batch counts
    as done: this epoch never delivers it."""
    mask = np.zeros(n, dtype=bool) if before is None else before.mask(n)
    mask[read_positions(n, batch_size, drop_last) :] = True  # never read this epoch
    run = np.flatnonzero(~mask)  # what the run read from: `run_positions`, mask in hand
    for worker, state in states.items():
        mine = worker_slice(run, batch_size, worker, num_workers, False)
        mask[mine[: state.cursor]] = True
        ahead = np.asarray(state.ahead, dtype=np.int64)
        mask[mine[ahead[ahead < len(mine)]]] = True
    return Done.of(mask)


def rank_state(
    plan: object,
    epoch: int,
    progress: EpochProgress,
    done: Done,
    world: World,
    selection: str | None = None,
    store: StoreId | None = None,
) -> dict[str, Any]:
    """The plain values a rank's loader state holds of the plan: the epoch's progress (a
    `PlanState`, with the plan's spec, seed and drop_last, when the plan is a tierfeed `Plan`),
    the selection of samples it plans, if any (`Feed.selection`), the store it reads
    (`StoreId`), and this rank's `Done`."""
    state: dict[str, Any] = {"rank": world.rank, "world_size": world.world_size}
    if isinstance(plan, Plan):
        state["plan"] = PlanState(plan.spec, epoch, progress).state_dict()
    else:
        state["segments"] = progress.to_list()
    if selection is not None:
        state["samples"] = selection
    if store is not None:
        state["store"] = store.to_dict()
    return {**state, "done": done.to_list()}


def check_plan(state: Mapping[str, Any], plan: object, selection: str | None = None) -> None:
    """Refuse a state saved reading another plan or another selection of samples
    (``selection``: `Feed.selection`): its positions would name other samples."""
    saved_selection = state.get("samples")
    if saved_selection != selection:

        def said(value: object) -> str:
            if value is None:
                return "every sample of the store"
            count, _, digest = str(value).partition(":")
            return f"a selection of {count} samples (hash {digest})"

        raise ConfigError(
            f"the state was saved reading {said(saved_selection)}; this loader reads "
            f"{said(selection)}: resume with the same samples="
        )
    if "plan" not in state or not isinstance(plan, Plan):
        return
    saved_state = PlanState.from_state_dict(state["plan"])
    saved, now = saved_state.spec, plan.spec
    if (str(saved), saved.seed, saved.drop_last) != (str(now), now.seed, now.drop_last):
        raise ConfigError(
            f"the state was saved reading plan {saved} (seed {saved.seed}, drop_last "
            f"{saved.drop_last}); this loader reads {now} (seed {now.seed}, drop_last "
            f"{now.drop_last}): resume with the same plan"
        )
    if not plans_match(saved_state.plans, now.policy):
        raise ConfigError(
            f"the state was saved by a tierfeed whose {now.policy} plans differ from this "
            f"one's (generation {saved_state.plans}, this is {PLANS}): its positions name "
            "other samples. Finish the epoch with the tierfeed that saved it, or start this "
            "epoch afresh (set_epoch without load_state_dict)"
        )


def _segments_of(state: Mapping[str, Any]) -> Any:
    return state["plan"]["segments"] if "plan" in state else state.get("segments", [])


def _progress_of(state: Mapping[str, Any]) -> EpochProgress:
    if "plan" in state:
        return PlanState.from_state_dict(state["plan"]).progress
    return EpochProgress.from_list(state.get("segments", []))


def resume_from(
    states: Sequence[Mapping[str, Any]], world: World, exchange: object | None = None
) -> Resume:
    """Where this rank resumes from saved loader states (``Loader.state_dict()`` values,
    checked: `tierfeed.loader.statecheck.check_states`).

    One state: this rank's own, saved in a world of the same size. Every old rank's state: the
    epoch goes on in ``world`` whatever its size (each new rank takes an equal share of what
    was left), except with a sample exchange, whose partitions assume the same world.
    """
    epochs = {int(s["epoch"]) for s in states}
    if len(epochs) != 1:
        raise ConfigError(
            f"the states are of different epochs {sorted(epochs)}; save them together"
        )
    epoch = epochs.pop()
    old_world = {int(s.get("world_size", world.world_size)) for s in states}
    # Every rank's progress is the same list: compared as saved, read once.
    segments = _segments_of(states[0])
    if len(old_world) != 1 or any(_segments_of(s) != segments for s in states[1:]):
        raise ConfigError("the states come from different jobs (world sizes or restarts differ)")
    size = old_world.pop()
    before = _progress_of(states[0])
    by_rank = {int(s.get("rank", world.rank)): s for s in states}
    if size == world.world_size and world.rank in by_rank:
        return Resume(epoch, before, Done.from_list(by_rank[world.rank]["done"]))
    if len(by_rank) != size or sorted(by_rank) != list(range(size)):
        have = ", ".join(str(r) for r in sorted(by_rank))
        raise ConfigError(
            f"the state was saved by rank(s) {have} of a job of {size} ranks; this is rank "
            f"{world.rank} of {world.world_size}: to resume in another world size give "
            "load_state_dict every old rank's state (Loader.gather_state_dict() on every rank)"
        )
    if size != world.world_size and exchange is not None:
        raise ConfigError(
            f"a job with a sample exchange resumes in the same world size ({size} ranks, this "
            f"job has {world.world_size}); call set_epoch() to start the next epoch instead"
        )
    dones = [Done.from_list(by_rank[r]["done"]) for r in range(size)]
    return Resume(epoch, before.then(size, dones), Done())
