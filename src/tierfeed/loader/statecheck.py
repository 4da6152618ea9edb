"""A saved loader state checked field by field before anything is computed from it.

A state file travels between machines and people: it is input. `check_states` bounds every
field's type, sign and size by the store and the world the state is loaded into, so a damaged
or hand-edited state is one ConfigError naming the field (``plan.segments[0][0]``; a state in a
list of every rank's is ``states[1]``). The cost grows with the store, never with the state: a
list's length is checked before its entries, nothing is walked deeper than the layout nests,
and the positions walked in all are bounded by what an epoch of the store can list.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from tierfeed.errors import ConfigError

__all__ = [
    "MAX_SEGMENTS",
    "MAX_SEGMENT_RANKS",
    "MAX_WORKERS",
    "MAX_WORLD_SIZE",
    "StateBounds",
    "check_states",
    "checked_epoch",
    "epoch_bound",
    "state_list",
    "state_name",
    "store_entry",
]

MAX_WORLD_SIZE = 2**16  # ranks of a saved world: resuming in another size plans every old rank
MAX_SEGMENTS = 64  # world sizes one epoch ran under: each restart in another size adds one
MAX_SEGMENT_RANKS = 2**18  # their ranks together: resuming splits what each rank had left
MAX_WORKERS = 1024  # DataLoader workers of a state of the first layout (per-worker cursors)
MAX_TEXT = 4096  # characters of a saved store path or selection
MAX_SPEC = 256  # characters of a saved plan spec ("partial:0.25,chunkwise:8")
SEED_LIMIT = 2**128  # seeds are below this (numpy's SeedSequence takes any size; messages not)
_SLACK = 1024  # positions any state may list, whatever the store
_WORLD = "a world size (no more ranks than the samples planned, or this job's)"


@dataclass(frozen=True)
class StateBounds:
    """What a state is checked against: the sample count of the plan it resumes (no rank's
    order is longer), the live world size, the loader's batch size and the newest state layout
    this tierfeed reads."""

    samples: int
    world_size: int
    batch_size: int
    version: int

    @property
    def ranks(self) -> int:
        """The most ranks a saved world may have: the live world's, else no more than the plan
        has samples (a larger world's ranks hold nothing) and `MAX_WORLD_SIZE`."""
        return max(self.world_size, min(MAX_WORLD_SIZE, max(1, self.samples)))

    @property
    def epochs(self) -> int:
        """Epochs lie below this (`epoch_bound`)."""
        return epoch_bound(self.samples)


def epoch_bound(samples: int) -> int:
    """Epochs of a plan of ``samples`` lie below this: the plans compute ``epoch * samples`` in
    int64 and the epoch is shared with workers as one."""
    return min(2**31, 2**62 // max(1, samples))


def checked_epoch(epoch: int, samples: int) -> int:
    """``epoch`` given to ``set_epoch`` (an int, or numpy's), as an int.

    Raises:
        ConfigError: not a whole number from 0 to below `epoch_bound`.
    """
    bound = epoch_bound(samples)
    try:
        value = -1 if isinstance(epoch, bool) else operator.index(epoch)
    except TypeError:
        value = -1
    if not 0 <= value < bound:
        raise ConfigError(
            f"set_epoch: the epoch is a whole number from 0 to {bound - 1}, got {epoch!r}"
        )
    return value


def state_name(index: int, count: int) -> str:
    """How messages name the ``index``-th of ``count`` states: from its top when it is the only
    one, else as ``states[index]``."""
    return "" if count == 1 else f"states[{index}]"


def state_list(state: object, bounds: StateBounds) -> list[Mapping[str, Any]]:
    """``state`` (one rank's state, or every rank's in a list) as a list of states, refused
    when it is neither or lists more states than a saved world may have ranks."""
    if isinstance(state, Mapping):
        return [state]
    if not isinstance(state, list | tuple):
        raise ConfigError(
            "load_state_dict takes a Loader.state_dict() (a dict) or every rank's (a list of "
            f"them), not {_shown(state)}"
        )
    if not state:
        raise ConfigError("load_state_dict got no state")
    if len(state) > bounds.ranks:
        raise ConfigError(
            f"load_state_dict got {len(state)} states, more than the {bounds.ranks} ranks a "
            "saved job may have here: give each rank's Loader.state_dict() once"
        )
    for i, one in enumerate(state):
        if not isinstance(one, Mapping):
            _refuse(f"states[{i}]", one, "a rank's state is a dict (Loader.state_dict())")
    return list(state)


def store_entry(state: Mapping[str, Any], name: str = "") -> tuple[int, str, str] | None:
    """The (samples, index checksum, where) a state records of its store; None if it records
    none (a state saved before states did)."""
    if state.get("store") is None:
        return None
    path = _at(name, "store")
    store = _mapping(state["store"], path, "a store entry")
    samples = _whole(_needed(store, path, "samples"), f"{path}.samples", 0, 2**63 - 1, "a count")
    index = _text(_needed(store, path, "index"), f"{path}.index", 64, "an index checksum")
    where = _text(_needed(store, path, "where"), f"{path}.where", MAX_TEXT, "a store path")
    return samples, index, where


def check_states(states: Sequence[Mapping[str, Any]], bounds: StateBounds) -> None:
    """Refuse ``states`` (`state_list`) unless every field has the type, sign and size a
    ``Loader.state_dict()`` of a loader within ``bounds`` can have, and every rank's states
    come from one job (the same restarts of the epoch).

    Raises:
        ConfigError: naming the first field at fault and what it must be.
    """
    positions = _Positions(bounds)
    positions.allow(len(states))
    first: object = None
    for i, state in enumerate(states):
        name = state_name(i, len(states))
        _check_state(state, name, bounds, positions)
        path, segments = _segments_in(state, name)
        if i == 0:
            _check_segments(segments, path, bounds, positions)
            first = segments
        elif segments != first:  # bounded: ``first`` is checked, a list compares its length
            raise ConfigError(
                "the states come from different jobs (world sizes or restarts differ): "
                f"{path} differs from the first state's"
            )


def _check_state(
    state: Mapping[str, Any], name: str, bounds: StateBounds, positions: _Positions
) -> None:
    """Every field of one state but its segments (`_check_segments`)."""
    if "version" in state:
        layout = "a state layout (a newer tierfeed's state needs that tierfeed)"
        _whole(state["version"], _at(name, "version"), 1, bounds.version, layout)
    epoch = _whole(
        _needed(state, name, "epoch"), _at(name, "epoch"), 0, bounds.epochs - 1, "an epoch"
    )
    _whole(
        _needed(state, name, "batch_size"), _at(name, "batch_size"), 1, 2**63 - 1, "a batch size"
    )
    if "drop_last" in state:
        _flag(state["drop_last"], _at(name, "drop_last"))
    size = bounds.world_size
    if "world_size" in state:
        size = _whole(state["world_size"], _at(name, "world_size"), 1, bounds.ranks, _WORLD)
    if "rank" in state:
        _whole(state["rank"], _at(name, "rank"), 0, size - 1, f"a rank of {size}")
    cursors = "done" not in state and "workers" in state  # the first layout: worker cursors
    workers = 0
    if "num_workers" in state or cursors:
        count = _needed(state, name, "num_workers")
        workers = _whole(count, _at(name, "num_workers"), 0, MAX_WORKERS, "a number of workers")
    if state.get("samples") is not None:
        _text(state["samples"], _at(name, "samples"), MAX_TEXT, "a selection of samples")
    if "plan" in state:
        _check_plan(state["plan"], _at(name, "plan"), epoch)
    if cursors:
        _check_workers(state["workers"], _at(name, "workers"), workers, positions)
    else:
        positions.done(_needed(state, name, "done"), _at(name, "done"))


def _check_plan(value: object, path: str, epoch: int) -> None:
    """A `PlanState`'s values (its segments: `_check_segments`)."""
    plan = _mapping(value, path, "a plan state")
    if "plans" in plan:
        _whole(plan["plans"], f"{path}.plans", 1, 2**31, "a generation of plans")
    _text(_needed(plan, path, "spec"), f"{path}.spec", MAX_SPEC, "a plan spec")
    _whole(_needed(plan, path, "seed"), f"{path}.seed", 0, SEED_LIMIT - 1, "a seed")
    _flag(_needed(plan, path, "drop_last"), f"{path}.drop_last")
    _whole(_needed(plan, path, "epoch"), f"{path}.epoch", epoch, epoch, "the state's epoch")


def _segments_in(state: Mapping[str, Any], name: str) -> tuple[str, object]:
    """Where a state keeps its epoch's segments (its plan's, or its own for another plan), and
    them."""
    if "plan" in state:
        path = _at(name, "plan")
        return f"{path}.segments", _needed(state["plan"], path, "segments")
    return _at(name, "segments"), state.get("segments", [])


def _check_segments(value: object, path: str, bounds: StateBounds, positions: _Positions) -> None:
    """An `EpochProgress`: per segment a world size, and a count consumed per rank or each
    rank's done positions."""
    segments = _items(value, path, 0, MAX_SEGMENTS, "an epoch's segments")
    left = MAX_SEGMENT_RANKS
    for i, segment in enumerate(segments):
        at = f"{path}[{i}]"
        pair = _items(segment, at, 2, 2, "a segment: [world size, what each rank consumed]")
        ranks = _whole(pair[0], f"{at}[0]", 1, bounds.ranks, _WORLD)
        if ranks > left:
            _refuse(
                f"{at}[0]",
                ranks,
                f"the segments' ranks together are at most {_said(MAX_SEGMENT_RANKS)}",
            )
        left -= ranks
        consumed = pair[1]
        if not isinstance(consumed, list | tuple):
            _whole(consumed, f"{at}[1]", 0, bounds.samples, "samples consumed per rank")
            continue
        dones = _items(consumed, f"{at}[1]", ranks, ranks, f"done positions of {ranks} ranks")
        positions.allow(ranks)
        for rank, done in enumerate(dones):
            positions.done(done, f"{at}[1][{rank}]")


def _check_workers(value: object, path: str, workers: int, positions: _Positions) -> None:
    """A state of the first layout: each worker's cursor and the positions it read ahead, in
    its slice of the rank's order."""
    cursors = _mapping(value, path, "the workers' cursors")
    if len(cursors) > workers:
        _refuse(path, cursors, f"cursors of at most num_workers={workers} workers")
    positions.allow(len(cursors))
    for key, cursor in cursors.items():
        at = f"{path}[{_shown(key)}]"
        number: object = key
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 8:
            number = int(key)  # a state that went through JSON
        _whole(number, at, 0, workers - 1, "a worker")
        entry = _mapping(cursor, at, "a worker's cursor")
        cursor_at = f"{at}.cursor"
        _whole(_needed(entry, at, "cursor"), cursor_at, 0, positions.samples, "a position")
        positions.listed(_needed(entry, at, "ahead"), f"{at}.ahead", 0, False)


class _Positions:
    """Checks lists of positions, each walked once and charged against the positions an epoch
    of the store can list in all: every sample once (delivered), plus each listed rank's
    padding and the short batch drop_last drops (`allow`)."""

    def __init__(self, bounds: StateBounds) -> None:
        self.samples = bounds.samples
        self._batch = bounds.batch_size
        self._left = bounds.samples + _SLACK

    def allow(self, ranks: int) -> None:
        """Room for the positions ``ranks`` more ranks' done lists may hold beyond the
        samples they delivered."""
        self._left += min(ranks * self._batch, self.samples) + 2 * ranks

    def done(self, value: object, path: str) -> None:
        """A `Done`: ``[prefix, [positions beyond it, increasing]]``."""
        pair = _items(value, path, 2, 2, "done positions: [a prefix, [positions beyond it]]")
        prefix = _whole(pair[0], f"{path}[0]", 0, self.samples, "a done prefix")
        self.listed(pair[1], f"{path}[1]", prefix + 1, True)

    def listed(self, value: object, path: str, low: int, increasing: bool) -> None:
        """Positions from ``low`` up, below the plan's sample count (``increasing``: each above
        the one before)."""
        items = _items(value, path, 0, self.samples, "positions of the plan's samples")
        if len(items) > self._left:
            _refuse(path, items, "that is more positions than an epoch of the store lists in all")
        self._left -= len(items)
        previous, high = low - 1, self.samples
        for i, p in enumerate(items):
            if type(p) is not int or not previous < p < high:
                what = "a position, each above the one before," if increasing else "a position"
                _whole(p, f"{path}[{i}]", previous + 1, high - 1, what)
            if increasing:
                previous = p


# --- one value of a field --------------------------------------------------------------------


def _at(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


def _refuse(path: str, value: object, what: str) -> NoReturn:
    raise ConfigError(
        f"the loader state's field {path} is {_shown(value)}: {what}; resume from a state as "
        "Loader.state_dict() saved it, or call set_epoch() to start the epoch afresh"
    )


def _needed(mapping: Mapping[str, Any], name: str, key: str) -> Any:
    if key not in mapping:
        raise ConfigError(
            f"the loader state has no field {_at(name, key)}: it is damaged or not a "
            "Loader.state_dict(); resume from another checkpoint, or call set_epoch() to start "
            "the epoch afresh"
        )
    return mapping[key]


def _whole(value: object, path: str, low: int, high: int, what: str) -> int:
    """``value``, a whole number (not a bool, float or text) from ``low`` to ``high``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        within = f"is {low}" if low == high else f"is a whole number from {low} to {_said(high)}"
        _refuse(path, value, f"{what} {within}")
    return value


def _said(number: int) -> str:
    """A bound as a reader takes it in: ``2**64 - 1`` rather than twenty digits."""
    bits = (number + 1).bit_length() - 1
    if number >= 2**16 and number + 1 == 2**bits:
        return f"2**{bits} - 1"
    if number >= 2**16 and number == 2 ** number.bit_length() // 2:
        return f"2**{number.bit_length() - 1}"
    return str(number)


def _flag(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        _refuse(path, value, "drop_last is True or False")
    return value


def _text(value: object, path: str, most: int, what: str) -> str:
    if not isinstance(value, str) or len(value) > most:
        _refuse(path, value, f"{what} is text of at most {most} characters")
    return value


def _mapping(value: object, path: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _refuse(path, value, f"{what} is a dict")
    return value


def _items(value: object, path: str, least: int, most: int, what: str) -> Sequence[Any]:
    """``value``, a list (or tuple) of ``least`` to ``most`` entries: checked by its length
    before any entry is looked at."""
    if not isinstance(value, list | tuple):
        _refuse(path, value, f"{what} are a list")
    if not least <= len(value) <= most:
        count = str(most) if least == most else f"{least} to {most}"
        _refuse(path, value, f"{what} are a list of {count} entries")
    return value


def _shown(value: object) -> str:
    """``value`` for a one-line message, short whatever its size."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return (
            str(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
        )
    if isinstance(value, str):
        return repr(value[:40]) + (f"... ({len(value)} characters)" if len(value) > 40 else "")
    if isinstance(value, list | tuple | Mapping):
        return f"a {type(value).__name__} of {len(value)} entries"
    return f"a {type(value).__name__}"
