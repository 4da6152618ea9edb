"""A Loader's state: what `state_dict` saves of a feed's epoch, and the `Resume` that
`load_state_dict` makes of it, checked against the feed it resumes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.loader.feed import Feed
from tierfeed.loader.resume import (
    Resume,
    check_plan,
    check_store,
    done_after,
    rank_state,
    resume_from,
)
from tierfeed.loader.statecheck import StateBounds, check_states, state_list, state_name
from tierfeed.loader.streamstate import StreamState
from tierfeed.plan import EpochProgress, Plan

__all__ = ["STATE_VERSION", "resume_of", "state_of"]

STATE_VERSION = 2  # 1: per-worker cursors only (same number of workers to resume)


def state_of(
    feed: Feed,
    resume: Resume | None,
    num_workers: int,
    workers: Mapping[int, Mapping[str, Any]],
) -> dict[str, Any]:
    """The state of ``feed``'s current epoch, resumed at ``resume`` (None: from its start),
    after ``num_workers`` workers delivered up to their ``workers`` stream states."""
    epoch = feed.epoch
    done = done_after(
        feed.rank_size(epoch, resume),
        feed.batch_size,
        feed.drop_last,
        None if resume is None else resume.done,
        max(1, num_workers),
        {w: StreamState.from_dict(dict(s)) for w, s in workers.items()},
    )
    progress = resume.progress if resume else EpochProgress()
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "num_workers": num_workers,
        "batch_size": feed.batch_size,
        "drop_last": feed.drop_last,
        **rank_state(feed.plan, epoch, progress, done, feed.world, feed.selection, feed.store_id()),
    }


def resume_of(feed: Feed, state: dict[str, Any] | Sequence[dict[str, Any]]) -> Resume:
    """Where ``feed`` resumes a state (or every rank's, from another world size).

    Every field is checked (`tierfeed.loader.statecheck`) before anything is computed from
    it: a state is input, perhaps edited by hand.

    Raises:
        ConfigError: no state, a damaged one (naming the field at fault), or one saved on
            another store, plan, selection, batch size or drop_last.
    """
    bounds = StateBounds(_plan_samples(feed), feed.world.world_size, feed.batch_size, STATE_VERSION)
    states = state_list(state, bounds)
    for i, one in enumerate(states):
        _check_layout(one)
        check_store(one, feed.store_id(), state_name(i, len(states)))  # before any bound
    check_states(states, bounds)
    try:
        states = [_upgraded(feed, s) for s in states]
        resume = resume_from(states, feed.world, feed.exchange)
    except ConfigError:
        raise  # already one line that says what is wrong (it is a ValueError too)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"the loader state is damaged or not a tierfeed Loader.state_dict() "
            f"({type(exc).__name__}: {exc}); resume from another checkpoint or call "
            "set_epoch() to start an epoch afresh"
        ) from None
    n = feed.rank_size(resume.epoch, resume)  # this rank's order once resumed
    done = resume.done
    if done.prefix > n or any(p >= n for p in done.extra):
        raise ConfigError(
            f"the loader state marks positions up to {max(done.prefix, *done.extra, 0)} "
            f"delivered, but this rank's order of epoch {resume.epoch} has {n}: it was saved "
            "for another dataset or plan; resume from its own checkpoint"
        )
    return resume


def _plan_samples(feed: Feed) -> int:
    """No rank's order is longer: the samples ``feed``'s plan orders (a selection's, where it
    reads one)."""
    if isinstance(feed.plan, Plan):
        return feed.plan.shape.num_samples
    # Another plan's orders may be longer than the store has samples (drawn with replacement).
    return max(feed.store_id().samples, feed.rank_size())


def _check_layout(state: Mapping[str, Any]) -> None:
    """Refuse a state of a layout that cannot resume exactly."""
    # A worker's slice is whole batches of the rank's order: its positions depend on the
    # batch size and drop_last. A state without them (an older tierfeed's workers read
    # every num_workers-th sample) would skip the wrong samples.
    if "batch_size" not in state:
        raise ConfigError(
            "the state was saved by an older tierfeed whose workers read other slices of "
            "the plan, so it cannot resume exactly; call set_epoch() to read that epoch "
            "from its start"
        )


def _upgraded(feed: Feed, state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` (checked: `check_states`) checked against ``feed``, in the current layout (a
    state of the previous layout lists each worker's cursor in its slice of the whole
    epoch)."""
    for key, ours in (("batch_size", feed.batch_size), ("drop_last", feed.drop_last)):
        if key in state and state[key] != ours:
            raise ConfigError(
                f"the state was saved with {key}={state[key]}, this loader's dataset has "
                f"{ours}; resume with the same {key}"
            )
    check_plan(state, feed.plan, feed.selection)
    if "done" in state:
        return state
    workers = {int(w): StreamState.from_dict(c) for w, c in state["workers"].items()}
    epoch = int(state["epoch"])
    n = len(feed.plan.order(epoch, feed.world.rank, feed.world.world_size))
    done = done_after(
        n, feed.batch_size, feed.drop_last, None, max(1, int(state["num_workers"])), workers
    )
    return {**state, "done": done.to_list()}
