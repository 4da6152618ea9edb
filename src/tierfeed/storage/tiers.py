"""The tier stack: reads served by the highest tier holding a chunk; misses copied upward.

A read of (chunk, offset, length) is served, in this order, by the fastest tier holding a
checked copy of the chunk, by the chunk's copy in flight once the read's bytes have landed
(a copy is started at once when none is in flight and a tier would take the chunk), and by
the origin. The origin is read-only: it is never written or deleted. A copy is verified
against the chunk's checksum and published atomically, so a tier never serves part of a
chunk; pieces in flight are served only as the ranges that landed, each checked against its
member's checksum by the store. A read served by a slower tier schedules a copy into the
faster ones that lack the chunk (RAM from disk).

The parts, each behind a small interface: `Holdings` (`tierfeed.storage.holdings`: what each
tier holds and whether a copy may be served, under one lock never held across I/O), a
`Filler` (`tierfeed.storage.filler`: copy threads, placement, copies in flight, look-ahead),
`OriginFetch` (`tierfeed.storage.originfetch`: every request to the origin, timed for the
tuner) and, per tier, its `TierFiles` (`tierfeed.storage.disktier`: a shared directory's
locks, claims, marks and rescans).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

from tierfeed.errors import ChunkCorruptError, StorageError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.disktier import Tier, TierCounters, cache_key, disk_tier
from tierfeed.storage.driver import Driver
from tierfeed.storage.filelanding import landing_for
from tierfeed.storage.filler import Filler
from tierfeed.storage.headreads import HeadReads
from tierfeed.storage.holdings import Holdings
from tierfeed.storage.landing import pieces_of
from tierfeed.storage.originfetch import OriginFetch
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.tieroptions import TierOptions

__all__ = ["Tier", "TierCounters", "TierOptions", "TierStack", "cache_key", "disk_tier"]

_RESCAN_S = 1.0  # stats() looks at a shared directory again after this long
_HEAD_SPREAD = 2  # head reads when the first batch's pieces are this many times its bytes
_HEAD_COSTLY_PIECES = 4  # on an object store: when its chunks' pieces are this many times it
_COPY_GRACE_S = 1.0  # at close, running copies get this long to finish before they are stopped


class TierStack(ChunkSource):
    """A ChunkSource over cache tiers and a read-only origin.

    Args:
        chunks: the store's chunks (names relative to the origin's root).
        origin: where chunks live; used read-only.
        tiers: cache tiers, fastest first (e.g. RAM, then local disk).
        policy: ``fill-top``, ``lru`` or ``clairvoyant`` (one instance per tier).
        options: background thread settings.
    """

    uses_future = True  # clairvoyant tiers place and prefetch by the plan's future

    def __init__(
        self,
        chunks: Sequence[ChunkInfo],
        origin: Driver,
        tiers: Sequence[Tier] = (),
        policy: str = "fill-top",
        options: TierOptions | None = None,
    ) -> None:
        self.chunks, self.origin, self.policy_name = chunks, origin, policy
        self.costly_requests = origin.costly_requests
        self.options = options or TierOptions()
        self.holdings = Holdings(chunks, tiers, policy, self.options.verify_cached)
        self.tiers = self.holdings.tiers
        o = self.options
        self.fetch = OriginFetch(origin, bool(self.tiers), o.fetch_threads, o.piece_bytes)
        # Chunks being copied land where every process of the host reads them: the directory
        # of the first disk tier, else this process's memory.
        shared = self.holdings.shared
        landing = landing_for(None if shared is None else shared.directory)
        landing.sweep()
        self.filler = Filler(self.holdings, self.fetch, landing, self.options)
        self.head = HeadReads(self.fetch)
        self._closed = False

    @property
    def origin_counters(self) -> TierCounters:
        """The origin's reads, bytes and copies."""
        return self.fetch.origin_counters

    # --- reads ----------------------------------------------------------------------------

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Bytes of ``chunk``: from the highest tier holding it, else from its copy in flight,
        else from the origin."""
        return self._read(chunk, (offset,), (length,))[0]

    def read_ranges(
        self, chunk: int, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes]:
        """Several ranges of ``chunk``: from a tier holding it with one look at the tiers and
        one open of its copy; when no tier does, each range as `read_range` reads it."""
        if not offsets:
            return []
        return self._read(chunk, offsets, lengths)

    def local(self, chunk: int) -> bool:
        """A tier holds a checked copy of ``chunk``, or its copy in flight landed whole (read
        as it is, each range checked by its member's checksum, until it is placed)."""
        return self.holdings.local(chunk)

    def _read(self, chunk: int, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """The ranges: held, else landed whole, else one by one (`_miss`)."""
        if self._closed:  # a RAM tier would still serve: closed is closed for every read
            raise StorageError(f"{self.chunks[chunk].name}: closed")
        failure = self.holdings.failure(chunk)
        if failure is not None:
            raise ChunkCorruptError(failure)
        holding = self.holdings.accessed(chunk, len(offsets))
        self.filler.seen(len(offsets))
        info = self.chunks[chunk]
        data = self._local(info, holding, offsets, lengths)
        if data is not None:
            return data
        if len(offsets) == 1:
            return [self._miss(info, offsets[0], lengths[0])]
        out = []
        for offset, length in zip(offsets, lengths, strict=True):
            holding = self.holdings.holding(chunk)  # a copy may land between two
            one = self._local(info, holding, (offset,), (length,))
            out.append(self._miss(info, offset, length) if one is None else one[0])
        return out

    def _local(
        self, info: ChunkInfo, holding: list[bool], offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes] | None:
        """The ranges from the fastest tier holding the chunk, else from its copy in flight
        if it landed whole; None if neither serves them."""
        held = self.holdings.read_held(info, holding, offsets, lengths)
        if held is not None:
            self.holdings.forget_landed(info.id)  # placed: read from the tier from now on
            data, level = held
            if level > 0:
                self.filler.schedule(info.id)  # a faster tier lacks it: fill it from this one
            return data
        if self.holdings.is_landed_whole(info.id):
            return self.filler.read_landed(info, offsets, lengths)
        return None

    def _miss(self, info: ChunkInfo, offset: int, length: int) -> bytes:
        """A range no tier served: from a head read (`read_first`), else from a tier that
        another process filled since the last look, else from the chunk's copy in flight,
        else from the origin (a chunk no tier takes: from the origin at once)."""
        data = self.head.take(info.id, offset, length)
        if data is not None:
            self.filler.schedule(info.id)
            return data
        if not self.holdings.refuses(info.id):
            # Two looks at the tiers, for two different copies; one look misses one of them.
            # Before: another process (a worker sharing the disk tier) placed the chunk since
            # this one last looked; unseen, the read would ask for a copy of a chunk held
            # already and wait for it. After: the copy this read asked for was placed and its
            # arrival ended while the read did not look (between two polls for its arrival,
            # or by another process that claimed it): `read_landing` has nothing to serve,
            # and unseen, the read would go to the origin for bytes a tier holds. A look
            # serves only a copy renamed into place whole and checked, never a half-placed
            # one, and costs a check of the tier's view, not a wait: the bound is the wait's.
            data = self._placed_meanwhile(info, offset, length)
            if data is None:
                data = self.filler.read_landing(info, offset, length)
            if data is None:
                data = self._placed_meanwhile(info, offset, length)
            if data is not None:
                return data
        data = self.fetch.read(info, offset, length)
        self.filler.schedule(info.id)
        return data

    def _placed_meanwhile(self, info: ChunkInfo, offset: int, length: int) -> bytes | None:
        """The range from a tier this process thought lacked the chunk, if one has it now."""
        if not self.holdings.appeared(info):
            return None
        held = self.holdings.read_held(info, self.holdings.holding(info.id), (offset,), (length,))
        return None if held is None else held[0][0]

    def read_first(
        self,
        chunks: Sequence[int],
        starts: Sequence[int],
        ends: Sequence[int],
        members: Sequence[int],
        every: bool = False,
    ) -> int:
        """Read at once, each as one exact range (`HeadReads`), the samples a worker delivers
        first, when the copies' first pieces would not serve them as soon: their chunks not
        held here outnumber the copies that start together (`Filler.copies_at_once`), or the
        pieces they fall in are more than `_HEAD_SPREAD` times their own bytes (a shuffled
        first batch touches a piece per sample, and the copies would fetch them all before
        it is whole). The copies' pieces wait for the head reads in flight, a bounded time
        (`OriginFetch.heads_begin`): they share the link.

        From an origin that bills requests (an object store) a cold epoch makes one GET a
        piece and a copy fetches its pieces in offset order, so the first batch waits for the
        copies of its chunks whole; a head costs a GET a sample. It is read where the pieces
        of its chunks are at least `_HEAD_COSTLY_PIECES` times its samples: a store large
        enough that waiting for it takes seconds, and the head's GETs a small share of the
        epoch's. On a store of a few chunks, the whole of it lands about as soon as a head
        would, and the head's GETs only slow the epoch (docs/BENCHMARKS.md, "The first batch
        from a user-sized object store"). ``every`` (the batch a Loader reads itself while
        its workers start): from a file system whatever the store, and the copies' pieces do
        not wait for it; from an object store by the same rule, a GET a sample costing as
        much there. Returns how many reads began."""
        if not self.tiers:
            return 0  # no copies: every read is the origin's already, in parallel
        cold = [i for i, c in enumerate(chunks) if not self.holdings.local(int(c))]
        anyway = every and not self.origin.costly_requests
        if not anyway and not self._head_pays(chunks, starts, ends, cold):
            return 0
        return self.head.start(
            [self.chunks[int(chunks[i])] for i in cold],
            [int(starts[i]) for i in cold],
            [int(ends[i]) for i in cold],
            [int(members[i]) for i in cold],
            first=not anyway,
        )

    def head_pays(self, chunks: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> bool:
        """Whether `read_first` would read these samples ahead (none held here: all would)."""
        cold = [i for i, c in enumerate(chunks) if not self.holdings.local(int(c))]
        return bool(self.tiers and cold) and self._head_pays(chunks, starts, ends, cold)

    def _head_pays(
        self, chunks: Sequence[int], starts: Sequence[int], ends: Sequence[int], cold: list[int]
    ) -> bool:
        """Whether the head's reads ``cold`` (of `read_first`'s) serve it sooner than the
        copies would, at a cost worth it (`read_first` says when)."""
        piece = self.fetch.tuner.piece
        if self.origin.costly_requests:
            spanned = {int(chunks[i]) for i in cold}
            pieces = sum(pieces_of(self.chunks[c].size, piece) for c in spanned)
            return pieces >= _HEAD_COSTLY_PIECES * len(cold)
        pieces = len({(int(chunks[i]), int(starts[i]) // piece) for i in cold})
        spread = pieces * piece > _HEAD_SPREAD * sum(int(ends[i]) - int(starts[i]) for i in cold)
        return len({int(chunks[i]) for i in cold}) > self.filler.copies_at_once or spread

    def discard(self, chunk: int) -> str | None:
        """Drop the highest cached copy of ``chunk``: the bytes it served failed their check.
        Reads served a chunk no tier holds from its head reads, else its copy in flight."""
        tier = self.holdings.highest(chunk)
        if tier is not None:
            return self.holdings.drop(tier, self.chunks[chunk])
        if self.head.drop(chunk):
            return f"head read of chunk {self.chunks[chunk].name}"
        if self.filler.shun_landing(self.chunks[chunk]):
            return f"copy in flight of chunk {self.chunks[chunk].name}"
        return None

    # --- copies and the future ------------------------------------------------------------

    def schedule(self, chunk: int) -> bool:
        """Queue a whole-chunk copy into the tiers; False if present, queued, or queue full."""
        return self.filler.schedule(chunk)

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """Tell clairvoyant tiers the chunk of every read to come, and prefetch its start.

        Args:
            sequence: one chunk id per read, in order (from the plan).
            read_bytes: mean bytes of one read (weighs a whole-chunk copy against reads).
        """
        self.filler.set_future(sequence, read_bytes)

    def set_reads(
        self, chunks: npt.ArrayLike, offsets: npt.ArrayLike, ends: npt.ArrayLike | None = None
    ) -> None:
        """This epoch's reads in the order they are consumed (their chunks, and the byte
        ranges they read: ``offsets`` to ``ends``, exclusive; None: the start only): a copy
        fetches its chunk's pieces in the order these need them, every piece a read spans."""
        self.filler.set_reads(chunks, offsets, ends)

    def served_first(self, reads: int) -> None:
        """The first ``reads`` of the order `set_reads` gave are read apart (head reads): a
        copy fetches the pieces the other reads need first (`Foresight.served_first`)."""
        self.filler.served_first(reads)

    def prefetch(self, horizon: int = 64) -> int:
        """Queue the chunks of the next ``horizon`` reads of the known future that fit (the
        tiers' quotas and policies decide); returns how many."""
        return self.filler.prefetch(horizon)

    def open_ahead(self, chunks: Sequence[int]) -> None:
        """Open these chunks at the origin in the background, in this order (origins that
        can, e.g. POSIX)."""
        # Copies read through descriptors of their own (`Driver.read_block`): opened too.
        self.origin.open_ahead([self.chunks[c].name for c in chunks], blocks=bool(self.tiers))

    def begin_epoch(self) -> None:
        """A new epoch: the origin loads what changed (a job namespace's inbox); tiers that
        refused a chunk are asked again."""
        self.holdings.ask_again()
        self.origin.begin_epoch()

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until queued copies are done (tests, benchmarks, stage-in), at most
        ``timeout`` seconds; raises StorageError if they are not."""
        self.filler.drain(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters of every tier, of the origin and of copies in flight, as plain values.

        A tier's ``hits`` and ``bytes`` are the reads it served; the origin's ``hits`` are the
        reads it served and its ``bytes`` everything read from it (those reads and the pieces
        of copies); ``fetch`` counts the pieces and the reads served from copies in flight, and
        gives what the fetch tuner chose (``piece_kib``, ``inflight``) and the origin's
        throughput it measured (``origin_mbps``).

        ``held_bytes`` is a gauge; a shared directory is looked at again when the last look is
        older than a second, and such a tier says ``shared: 1`` so that processes sharing it
        are not summed (see `tierfeed.telemetry.combine`).
        """
        for tier in self.tiers:
            if tier.shared and time.monotonic() - tier.scanned > _RESCAN_S:
                with contextlib.suppress(StorageError):
                    self.holdings.scan(tier)
        with self.holdings.mutex:
            out: dict[str, Any] = {
                t.name: dict(
                    t.counters.snapshot(), held_bytes=sum(t.held.values()), shared=int(t.shared)
                )
                for t in self.tiers
            }
        # Transient faults the origin's driver tried again (resets, short bodies, 5xx).
        retries = self.origin.counters.retries
        out["origin"] = dict(self.origin_counters.snapshot(), retries=retries)
        if self.tiers:
            out["fetch"] = self.fetch.stats()
        out["origin"]["ops"] = self.origin.counters.snapshot()
        return out

    def close(self) -> None:
        """Stop and join the copy threads; idempotent. Running copies get `_COPY_GRACE_S`
        to finish, then are stopped: a copy the origin holds (a hung mount) holds no close."""
        if self._closed:
            return
        self._closed = True
        self.filler.close(_COPY_GRACE_S)  # queued copies are dropped, running ones finish
        self.fetch.stop()  # or end now
        self.filler.join(_COPY_GRACE_S)
        self.head.close()
        self.fetch.close()
        for tier in self.tiers:
            tier.driver.close()

    def __enter__(self) -> TierStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
