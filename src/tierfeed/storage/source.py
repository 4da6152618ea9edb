"""`ChunkSource`: anything that serves byte ranges of a store's chunks, and the abilities a
source may have (each a harmless no-op by default, so no caller tests a concrete type)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

__all__ = ["ChunkSource"]


class ChunkSource(ABC):
    """Anything that serves byte ranges of a store's chunks: a plain directory or a tier stack.

    A source implements `read_range` and `close`. Every other ability is optional and has a
    harmless default here, so callers call it on any source and never test a concrete type:
    a source that lacks the ability does nothing (or reports nothing).
    """

    # True when `set_future` uses the sequence it is given: building one costs a pass over
    # this epoch's and the next epochs' plans, which callers skip for a source that ignores it.
    uses_future: bool = False
    # True when each request to the origin is slow or billed (an object store): a second read
    # of a sample beside the copies costs a request (`DeadlineOptions.hedge_blocked`).
    costly_requests: bool = False

    @abstractmethod
    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Return exactly ``length`` bytes of chunk ``chunk`` starting at ``offset``.

        Raises:
            ChunkCorruptError: the chunk is shorter than the range (names the chunk).
            StorageError: the chunk cannot be read.
        """

    def read_ranges(
        self, chunk: int, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes]:
        """Several ranges of ``chunk``, in the order given: what `read_range` gives for each
        (a source may serve them with one look at its tiers and one open)."""
        return [self.read_range(chunk, o, n) for o, n in zip(offsets, lengths, strict=True)]

    @abstractmethod
    def close(self) -> None:
        """Release files, threads and sockets; idempotent."""

    def discard(self, chunk: int) -> str | None:
        """The bytes just served of ``chunk`` failed their check: drop the cached copy that
        served them, so that the next read of the chunk goes one level further down.

        Returns:
            What was dropped (e.g. a tier's file), or None when no cache held the chunk: the
            bytes came from the origin itself. The default holds no cache.
        """
        return None

    def local(self, chunk: int) -> bool:
        """Whether a read of ``chunk`` is served now from this host's memory or disk (a tier
        holding a checked copy), without waiting on the origin: such a read is cheap enough
        to run on the consumer's thread. The default holds nothing locally."""
        return False

    def open_ahead(self, chunks: Sequence[int]) -> None:
        """Hint: these chunks are read next, in this order; open them in the background so a
        stalled lookup or open is paid off the read path. The default opens nothing."""
        return None

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """Hint: the chunk of every read to come, in order (from the plan), for placement
        that knows the future; ``read_bytes`` is the mean bytes of one read. The default
        ignores it (and says so with `uses_future` False)."""
        return None

    def set_reads(
        self, chunks: npt.ArrayLike, offsets: npt.ArrayLike, ends: npt.ArrayLike | None = None
    ) -> None:
        """Hint: this epoch's reads in the order they are consumed, as the chunk and the byte
        range of each (``ends`` exclusive; None: the start only), so that a copy fetches first
        what is read first. The default ignores it."""
        return None

    def served_first(self, reads: int) -> None:
        """Hint: the first ``reads`` of the order `set_reads` gave are read apart, as exact
        ranges (every worker's head: `read_first`), so a copy fetches their pieces after those
        the other reads need. The default ignores it."""
        return None

    def read_first(
        self,
        chunks: Sequence[int],
        starts: Sequence[int],
        ends: Sequence[int],
        members: Sequence[int],
        every: bool = False,
    ) -> int:
        """Hint: the samples read first (each: its chunk, the byte range of its members, how
        many members), to be read at once where that is faster than waiting for their chunks'
        copies (``every``: the batch a Loader reads itself, `tierfeed.loader.opening`);
        returns how many reads began. The default reads nothing ahead."""
        return 0

    def head_pays(self, chunks: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> bool:
        """Whether `read_first` (not ``every``) would read these samples (as it takes them)
        ahead. The default reads nothing ahead."""
        return False

    def prefetch(self) -> int:
        """Queue copies of the chunks the known future needs next; returns how many were
        queued. The default caches nothing and queues none."""
        return 0

    def schedule(self, chunk: int) -> bool:
        """Hint: ``chunk`` is read soon; queue a background copy of it into a cache. Returns
        True if a copy was queued. The default has no cache and queues nothing."""
        return False

    def begin_epoch(self) -> None:
        """A new epoch starts: pick up what changed since the last one (e.g. samples peers
        moved here). The default has nothing to pick up."""
        return None

    def stats(self) -> dict[str, Any]:
        """Counters per tier (and the origin), as plain values. An empty dict means nothing to
        report: callers treat ``{}`` as "no tiers". The default reports nothing."""
        return {}

    def drain(self, timeout: float = 60.0) -> None:
        """Wait up to ``timeout`` seconds for background copies to finish (raises
        StorageError if they do not). The default runs none, so it returns at once."""
        return None
