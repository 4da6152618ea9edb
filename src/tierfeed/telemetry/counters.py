"""One counters type that every component fills, and the sums and differences of their snapshots.

A component declares its counters as a dataclass deriving from `Counters` (or builds one from
initial values); ``add``, ``set``, ``peak`` and ``update`` change them under its own lock and
``snapshot`` copies them into a plain dict. Snapshots of several processes, nested one level
by component (``{"ram": {...}, "origin": {...}}``), add up with `combine` and are differenced
with `since`; the figures named in `GAUGES` say what a thing is now rather than what it did,
and are treated as such.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar, cast

__all__ = ["GAUGES", "SETTINGS", "Counters", "combine", "since"]

N = TypeVar("N", int, float)
C = TypeVar("C", bound="Counters[Any]")

# Figures that say what a thing is now, not what it did: not summed over an epoch. Those in
# `SETTINGS` are a choice each process made (the same kind of thing in each): processes give
# their largest, not a sum.
SETTINGS = frozenset({"piece_kib"})
GAUGES = frozenset({"held_bytes", "shared", "inflight", "origin_mbps"}) | SETTINGS


class Counters(Generic[N]):
    """Named numbers, changed and read under one lock.

    Subclass it as a dataclass whose fields are the counters, or construct it directly with
    the counters' initial values (``Counters(reads=0, delay_s=0.0)``). Public attributes that
    are numbers are counters; anything else (a list of samples, say) rides along untouched.
    """

    _mutex: threading.Lock

    def __new__(cls: type[C], *args: Any, **kwargs: Any) -> C:
        # In __new__, not __init__: a dataclass subclass's generated __init__ never calls ours.
        self = super().__new__(cls)
        self._mutex = threading.Lock()
        return self

    def __init__(self, **initial: N) -> None:
        self.__dict__.update(initial)

    def add(self, **deltas: N) -> None:
        """Add to named counters (on every read of a hot path: kept to one lock and a loop)."""
        values = self.__dict__
        with self._mutex:
            for name, value in deltas.items():
                values[name] += value

    def set(self, **values: N) -> None:
        """Set named counters (tallies kept elsewhere, e.g. an fd cache's opens)."""
        with self._mutex:
            for name, value in values.items():
                setattr(self, name, value)

    def peak(self, **values: N) -> None:
        """Raise named counters to ``values`` where those are larger (running maxima)."""
        self.update(peak=values)

    def update(
        self, add: Mapping[str, N] | None = None, peak: Mapping[str, N] | None = None
    ) -> None:
        """Add to some counters and raise others, as one change (no snapshot sees half)."""
        with self._mutex:
            for name, value in (add or {}).items():
                setattr(self, name, getattr(self, name) + value)
            for name, value in (peak or {}).items():
                if value > getattr(self, name):
                    setattr(self, name, value)

    def snapshot(self) -> dict[str, N]:
        """The counters as a plain dict, in declaration order."""
        with self._mutex:
            return {k: cast(N, v) for k, v in self.__dict__.items() if _is_counter(k, v)}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_mutex"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mutex = threading.Lock()


def _is_counter(name: str, value: object) -> bool:
    return (
        not name.startswith("_") and isinstance(value, (int, float)) and not isinstance(value, bool)
    )


def combine(per_process: Iterable[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Snapshots of several processes (DataLoader workers) as one host's: counters add up, and
    so does each process's own RAM tier; a directory they share (``shared: 1``) is counted
    once: its gauges are the freshest look, not a sum."""
    out: dict[str, dict[str, float]] = {}
    for stats in per_process:
        for part, counters in stats.items():
            into = out.setdefault(part, {})
            shared = bool(counters.get("shared"))
            for k, v in counters.items():
                if not isinstance(v, (int, float)):
                    continue
                if (shared and k in GAUGES) or k in SETTINGS:
                    into[k] = max(into.get(k, 0), v)  # the freshest look at the one directory
                else:
                    into[k] = into.get(k, 0) + v
    return out


def since(
    now: dict[str, dict[str, float]], base: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Counters of ``now`` less those of ``base`` (an epoch's share); gauges as they are now."""
    return {
        part: {k: v if k in GAUGES else v - base.get(part, {}).get(k, 0) for k, v in c.items()}
        for part, c in now.items()
    }
