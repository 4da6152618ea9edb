"""The guarded stream's plain values: how far it reads ahead (`PrefetchOptions`), what its
guard did (`StreamCounters`), where it stands in its order (`StreamState`) and a position of
its window (`Entry`)."""

from __future__ import annotations

import time
from collections.abc import Collection
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tierfeed.errors import ConfigError
from tierfeed.telemetry.counters import Counters

__all__ = ["READ_INLINE", "Entry", "PrefetchOptions", "StreamCounters", "StreamState", "overtaken"]

T = TypeVar("T")


@dataclass(frozen=True)
class PrefetchOptions:
    """How far reads run ahead of the consumer.

    Attributes:
        window: samples in flight or ready ahead of the consumer.
        window_bytes: bytes in flight or ready ahead of the consumer.
        threads: reader threads (reads release the GIL while they wait on storage).
        inline_local: read a sample whose chunk this host holds (a RAM or disk tier) on the
            consumer's own thread, as a DataLoader worker reads a file: no thread hand-off,
            no future. Only what is not local goes to the reader threads and the guard.
            Turn it off to decode on the reader threads in parallel (a decoder that releases
            the GIL, with few workers), or for a disk tier on a device that stalls.
    """

    window: int = 64
    window_bytes: int = 256 * 2**20
    threads: int = 16
    inline_local: bool = True

    def __post_init__(self) -> None:
        if self.window < 1 or self.window_bytes < 1 or self.threads < 1:
            raise ConfigError(f"prefetch window, bytes and threads must be >= 1: {self}")


@dataclass
class StreamCounters(Counters[int]):
    """What the guard did; read them live or after the epoch (``waits`` is not a counter:
    `snapshot` leaves it out)."""

    delivered: int = 0
    late: int = 0  # times the sample due next missed its deadline
    deferred: int = 0  # samples delivered after a younger one took their place
    hedges: int = 0  # second reads issued
    hedge_wins: int = 0  # second reads that landed first
    inline: int = 0  # local samples read on the consumer's thread (`inline_local`)
    waits: list[float] = field(default_factory=list)  # per-sample wait of the consumer (s)

    def for_batch(self, assemble_s: float) -> dict[str, float]:
        """What a batch carries of them (a worker's so far), and the seconds it took."""
        counters: dict[str, float] = {"late": self.late, "deferred": self.deferred}
        counters |= {"hedges": self.hedges, "hedge_wins": self.hedge_wins, "inline": self.inline}
        return counters | {"assemble_s": assemble_s}


@dataclass(frozen=True)
class StreamState:
    """Resumable position in an order: every position < cursor and those in ahead are done."""

    cursor: int = 0
    ahead: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain values for a state_dict."""
        return {"cursor": self.cursor, "ahead": list(self.ahead)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamState:
        """Inverse of `to_dict`."""
        return cls(int(d["cursor"]), tuple(int(p) for p in d["ahead"]))


READ_INLINE: Future[Any] = Future()  # the primary of an entry read inline: already done
READ_INLINE.set_result(None)


class Entry(Generic[T]):
    """One position of the stream's window: its read (and hedge), or its value read inline."""

    __slots__ = (
        "hedge",
        "inline",
        "landed",
        "nbytes",
        "pending",
        "primary",
        "running_since",
        "submitted",
        "value",
    )

    def __init__(self, nbytes: int) -> None:
        self.primary: Future[T] = READ_INLINE
        self.hedge: Future[T] | None = None
        self.submitted = time.monotonic()
        self.running_since: float | None = None  # set when a thread starts the read
        self.nbytes = nbytes
        self.inline = False  # read on the consumer's thread: ``value`` holds the result
        self.pending = False  # local, read with its neighbours when it is taken
        self.landed = False  # a read of it succeeded (`watch`): a plain flag, read without locks
        self.value: T | None = None

    def futures(self) -> list[Future[T]]:
        return [self.primary] if self.hedge is None else [self.primary, self.hedge]

    def watch(self, read: Future[T]) -> Future[T]:
        """``read`` (its primary read or its hedge) sets `landed` once it succeeds."""
        read.add_done_callback(self._landed)
        return read

    def _landed(self, read: Future[T]) -> None:
        if _succeeded(read):
            self.landed = True

    def ready(self) -> bool:
        """Whether it can be taken, as far as its reads have told (`watch`): attributes only,
        no lock, for counting a whole window every few milliseconds (`overtaken`). A read
        that failed is not ready here; `done` is the exact answer."""
        return self.landed or self.inline or self.pending

    def done(self) -> bool:
        """Whether it can be taken: a read succeeded, or every read it has ended."""
        if self.landed or self.inline or self.pending:
            return True
        primary, hedge = self.primary, self.hedge
        if primary.done():
            return hedge is None or _succeeded(primary) or hedge.done()
        return hedge is not None and hedge.done() and _succeeded(hedge)


def _succeeded(read: Future[Any]) -> bool:
    """Whether a read that has ended gave a value (not cancelled, no exception)."""
    return not read.cancelled() and read.exception() is None


def overtaken(window: Collection[Entry[Any]], share: float | None) -> bool:
    """Whether ``share`` of the reads of ``window`` besides the one due (not done) are done;
    False with no share, or nothing besides it."""
    if share is None or len(window) < 2:
        return False
    return sum(1 for e in window if e.ready()) >= share * (len(window) - 1)
