"""An epoch's delivered order as a run records it, and the replay made from that record.

With the deadline guard on, a late read is delivered after ready ones: the order depends on the
storage's timing. What it was is recorded all the same, and small: each worker's positions
delivered out of turn, by delivery number (`GuardedStream.swaps`), under the workers and batch
size that cut the epoch into the workers' slices. Given back to a Loader of the same plan,
workers and batch size (`Loader.replay`), the record delivers that order again, exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tierfeed.errors import ConfigError

__all__ = ["MAX_SWAPS", "order_record", "replay_of"]

MAX_SWAPS = 1 << 22  # swaps a record may list in all (a record is input: bounded)


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


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pair(worker: str, pair: object) -> tuple[int, int]:
    if not isinstance(pair, Sequence) or len(pair) != 2 or not all(_whole(v) for v in pair):
        raise ConfigError(
            f"replay: swaps of worker {worker!r}: {pair!r} is not [delivery number, position]"
        )
    return int(pair[0]), int(pair[1])
