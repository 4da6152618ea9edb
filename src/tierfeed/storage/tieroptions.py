"""Options of a tier stack's background copying."""

from __future__ import annotations

from dataclasses import dataclass

from tierfeed.errors import ConfigError

__all__ = ["TierOptions"]


@dataclass(frozen=True)
class TierOptions:
    """Background copying.

    Attributes:
        threads: copy and prefetch threads.
        urgent_copies: copies that a read waits for, started beside the ``threads`` when all
            of them are busy, each on a thread of its own. A global shuffle's first batches
            ask for every chunk at once; with every one of those copies in flight, the fetch
            threads take the piece any of them needs soonest (docs/architecture.md).
        queue: the most copies waiting; further misses are served but not queued.
        verify_cached: check a disk-cached chunk's checksum on first use in this process.
        fetch_threads: origin reads in flight at once while copying chunks (pieces of one
            chunk, or of the next ones queued).
        piece_bytes: bytes per origin read while copying a chunk, until the fetch tuner has
            measured the origin's latency and bandwidth and chooses; None: 512 KiB for an
            origin whose requests are cheap (a file system), 4 MiB for one that bills them (an
            object store).
        landing_wait_s: how long a read waits for its bytes to land from a copy in flight
            before it reads the origin itself. Longer: fewer origin bytes beside the copies
            (docs/BENCHMARKS.md, bench/origin_bytes.py); shorter: a shorter first-epoch tail
            while whole chunks are still on their way. A piece late from a stall is hedged by
            the copy itself, and a sample late for its batch is replaced by the deadline
            guard, so waiting costs the batch little. Where a piece takes longer to land (an
            object store's GETs), a read waits up to twice a piece's fitted time (at most
            5 s); 0: no wait.
    """

    threads: int = 4
    urgent_copies: int = 32
    queue: int = 256
    verify_cached: bool = True
    fetch_threads: int = 8
    piece_bytes: int | None = None
    landing_wait_s: float = 2.0

    def __post_init__(self) -> None:
        piece = 1 if self.piece_bytes is None else self.piece_bytes
        if self.fetch_threads < 1 or piece < 1 or self.landing_wait_s < 0 or self.urgent_copies < 0:
            raise ConfigError(f"bad tier options: {self}")
