"""Operation counters of a slowed file system: live, thread-safe counting and a plain snapshot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.telemetry.counters import Counters as Tally

__all__ = ["STATS_DIR", "STATS_PATH", "Counters", "SlowFSStats"]

# Where a mount serves its live counters; hidden from the listing of its root.
STATS_DIR = "/.slowfs"
STATS_PATH = "/.slowfs/stats.json"


@dataclass(frozen=True)
class SlowFSStats:
    """What reached the slowed origin, as counted by the FUSE server.

    Only operations the kernel forwarded to the server are counted: a stat the kernel
    answered from its attribute cache, or a read served from the page cache, costs nothing
    and is not counted (see ``SlowFSOptions`` for the caching choices).

    Attributes:
        opens: files opened (each one paid one latency draw).
        stats: getattr calls, i.e. lookups and stats of any path, missing ones included.
        reads: read requests (the kernel splits reads into requests of at most 128 KiB).
        bytes_read: bytes returned by those reads.
        readdirs: directory listings.
        readlinks: symbolic links read.
        errors: operations answered with an error (ENOENT, EROFS, ...).
        stalls: operations whose latency, transfer time excluded, reached the model's
            ``stall_ms`` (the heavy tail).
        delay_s: total delay drawn from the model, in seconds, summed over all operations
            (deterministic: the sum of the first ``ops`` draws of the seeded sampler).
        queued_s: total time reads waited for the mount's shared link behind other
            transfers (``SlowFSOptions.shared_bandwidth``), on top of ``delay_s``.
        max_delay_s: the longest single drawn delay, in seconds.
    """

    opens: int = 0
    stats: int = 0
    reads: int = 0
    bytes_read: int = 0
    readdirs: int = 0
    readlinks: int = 0
    errors: int = 0
    stalls: int = 0
    delay_s: float = 0.0
    queued_s: float = 0.0
    max_delay_s: float = 0.0

    @property
    def ops(self) -> int:
        """All counted operations that paid a latency draw."""
        return self.opens + self.stats + self.reads + self.readdirs + self.readlinks

    def to_dict(self) -> dict[str, Any]:
        """The counters as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlowFSStats:
        """Build from a dict as written by ``to_dict``; unknown keys are ignored."""
        try:
            kwargs: dict[str, Any] = {
                f.name: (float if f.type == "float" else int)(data[f.name])
                for f in fields(cls)
                if f.name in data
            }
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"slowfs stats have a field of the wrong type: {exc}") from None
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str | bytes) -> SlowFSStats:
        """Parse the JSON of ``MOUNTPOINT/.slowfs/stats.json`` or of a ``--stats-file``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"slowfs stats are not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError("slowfs stats JSON is not an object")
        counters = data.get("counters", data)
        if not isinstance(counters, dict):
            raise ConfigError("slowfs stats JSON has no 'counters' object")
        return cls.from_dict(counters)

    def __sub__(self, other: SlowFSStats) -> SlowFSStats:
        """Counters accumulated since ``other`` was taken (``max_delay_s`` is kept as is)."""
        diff: dict[str, Any] = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            diff[f.name] = mine if f.name == "max_delay_s" else mine - theirs
        return SlowFSStats(**diff)


class Counters:
    """Live counters updated by the FUSE handler threads; ``snapshot()`` copies them."""

    def __init__(self) -> None:
        self._tally: Tally[float] = Tally(**SlowFSStats().to_dict())

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the integer counter ``name``."""
        self._tally.add(**{name: n})

    def delayed(self, seconds: float, stalled: bool, queued: float = 0.0) -> None:
        """Record one delay drawn from the model, and the wait for the shared link."""
        added = {"delay_s": seconds, "queued_s": queued, "stalls": int(stalled)}
        self._tally.update(add=added, peak={"max_delay_s": seconds})

    def snapshot(self) -> SlowFSStats:
        """A consistent copy of every counter."""
        return SlowFSStats.from_dict(self._tally.snapshot())
