"""An epoch's delivered order as a run records it, and the replay made from that record.

With the deadline guard on, a late read is delivered after ready ones: the order depends on the
storage's timing. What it was is recorded all the same, and small: each worker's positions
delivered out of turn, by delivery number (`GuardedStream.swaps`), under the workers and batch
size that cut the epoch into the workers' slices. Given back to a Loader of the same plan,
workers and batch size (`Loader.replay`), the record delivers that order again, exactly.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

from tierfeed.errors import ConfigError

__all__ = ["MAX_SWAPS", "Swaps", "check_order", "order_record", "replay_of", "replayed_position"]

MAX_SWAPS = 1 << 22  # swaps a record may list in all (a record is input: bounded)
Swaps = dict[int, list[tuple[int, int]]]  # each worker's, ``(delivery number, position)``


def order_record(
    swaps: Mapping[int, Sequence[tuple[int, int]]], workers: int, batch_size: int
) -> dict[str, Any]:
    """What a run record keeps of an epoch's order: the workers and batch size that cut it, and
    each worker's swaps (``[delivery number, position]``; workers without any left out)."""
    listed = {str(w): [[k, p] for k, p in s] for w, s in sorted(swaps.items()) if s}
    return {"workers": workers, "batch_size": batch_size, "swaps": listed}


def replay_of(record: object, workers: int, batch_size: int) -> dict[int, dict[int, int]]:
    """Each worker's swaps to deliver, from ``record`` (`order_record`: a Loader's
    ``last_epoch["order"]``, or the ``order`` of an epoch in its run file).

    Raises:
        ConfigError: not such a record, or one made with other workers or another batch size
            (the workers' slices would differ).
    """
    if not isinstance(record, Mapping) or set(record) != {"workers", "batch_size", "swaps"}:
        raise ConfigError(
            "replay: give an epoch's order as recorded (Loader.last_epoch['order'], or the "
            "'order' of an epoch in the run file)"
        )
    made = (record["workers"], record["batch_size"])
    if made != (workers, batch_size) or not all(_whole(v) for v in made):
        raise ConfigError(
            f"replay: the order was recorded with {made[0]!r} workers and batch size "
            f"{made[1]!r}; replay it with the same (this loader: {workers} and {batch_size})"
        )
    listed = record["swaps"]
    if not isinstance(listed, Mapping) or len(listed) > max(1, workers):
        raise ConfigError("replay: 'swaps' maps each worker (as text) to its swaps")
    out: dict[int, dict[int, int]] = {}
    total = 0
    for name, swaps in listed.items():
        worker = int(name) if isinstance(name, str) and name.isdigit() else -1
        if not 0 <= worker < max(1, workers) or not isinstance(swaps, Sequence):
            raise ConfigError(f"replay: swaps of worker {name!r}: not a worker of this loader")
        total += len(swaps)
        if total > MAX_SWAPS:
            raise ConfigError(f"replay: more than {MAX_SWAPS} swaps; not a recorded order")
        out[worker] = dict(_pair(name, pair) for pair in swaps)
    return out


def check_order(state: object) -> None:
    """Check the ``order`` a Loader state lists (the swaps delivered before it, to replay that
    part: `order_record`), if it lists one.

    Raises:
        ConfigError: an ``order`` that is not a record of swaps (a state is input).
    """
    record = state.get("order") if isinstance(state, Mapping) else None
    if record is None:
        return
    try:
        if not isinstance(record, Mapping):
            raise ConfigError("not a record of swaps")
        made = [_count(record.get(k)) for k in ("workers", "batch_size")]
        replay_of(record, *made)
    except ConfigError as exc:
        raise ConfigError(f"the loader state's 'order' is damaged: {exc}") from None


def replayed_position(
    replay: Mapping[int, int], delivered: int, cursor: int, window: Container[int]
) -> int:
    """The position a replay delivers next, its ``delivered``-th: as recorded, else the
    oldest not delivered (``cursor``); it must be among the reads ahead (``window``)."""
    pos = replay.get(delivered, cursor)
    if pos not in window:
        raise ConfigError(
            f"cannot replay: position {pos} of the order is not among the reads ahead at "
            f"delivery {delivered}; replay with the prefetch window, batch size and workers "
            "of the run recorded"
        )
    return pos


def _count(value: object) -> int:
    """``value`` where it is a count (an int, not a bool, not negative); -1 otherwise."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pair(worker: str, pair: object) -> tuple[int, int]:
    if not isinstance(pair, Sequence) or len(pair) != 2 or not all(_whole(v) for v in pair):
        raise ConfigError(
            f"replay: swaps of worker {worker!r}: {pair!r} is not [delivery number, position]"
        )
    return int(pair[0]), int(pair[1])
