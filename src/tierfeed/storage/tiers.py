"""The tier stack: reads served by the highest tier holding a chunk; misses copied upward.

A read of (chunk, offset, length) goes to the first tier that holds the chunk. On a miss, a
whole-chunk copy is started ahead of the prefetch queue (one per host: every process of it
reads from the same copy in flight) and the read waits, boundedly, for its piece to land; when
it does not land in time, or no tier would take the chunk, the range is read from the origin
apart. A copy is verified against the chunk's checksum and published atomically, so a tier
never serves part of a chunk; pieces in flight are only ever served as the ranges that landed,
each checked against its member's checksum by the store. The origin
is read-only: it is never written or deleted. What is particular to a tier (for a disk
directory that every process of a host fills: its locks, claims, marks and rescans) is its
`TierFiles` (`tierfeed.storage.disktier`); how a chunk gets into the tiers is
`tierfeed.storage.filling`; this module orders the tiers and serves reads. A read served by a
slower tier schedules a copy into the faster ones that lack the chunk (RAM from disk).

Threads: readers (any number), copy threads (a `Copier`'s) and fetch threads (the pieces of
copies: `TierOptions.fetch_threads`) share the tiers' bookkeeping
(what each holds, the placement policies, the counters) under one lock, held for bookkeeping
only, never across I/O; the copier keeps what is in flight under its own. Placements into one
tier are serialised by that tier's own lock, so concurrent copies cannot overrun its quota. A
copy that fails, for any reason, is counted and logged; its thread goes on with the next one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ChunkCorruptError, ConfigError, NotFoundError, StorageError
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.chunktable import ChunkKeys, ChunkSizes, mean_chunk_size
from tierfeed.storage.copier import Copier, Gate
from tierfeed.storage.disktier import Tier, TierCounters, cache_key, disk_tier
from tierfeed.storage.driver import Driver
from tierfeed.storage.filling import TierFilling
from tierfeed.storage.landing import FetchCounters, landing_for
from tierfeed.storage.placement import Clairvoyant, Placement, make_policy
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.tuning import FetchTuner, LookAhead

__all__ = ["Tier", "TierCounters", "TierOptions", "TierStack", "cache_key", "disk_tier"]

_log = logging.getLogger("tierfeed.tiers")
_RESCAN_S = 1.0  # stats() looks at a shared directory again after this long
# Copies a read waits for, started beside the copy threads when they are all busy.
_URGENT_COPIES = 8
_HEDGE_THREADS = 4  # second requests for late pieces: threads of their own, made when needed
# The first pieces of copies, until the fetch tuner has measured the origin: small where a
# request is cheap (a late one is hedged at little cost), larger where requests are billed.
_FIRST_PIECE = 512 * 1024
_FIRST_PIECE_COSTLY = 4 * 2**20


@dataclass(frozen=True)
class TierOptions:
    """Background copying.

    Attributes:
        threads: copy and prefetch threads.
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
            while whole chunks are still on their way. Where a piece takes longer to land (an
            object store's GETs), a read waits up to twice a piece's fitted time (at most
            5 s); 0: no wait.
    """

    threads: int = 4
    queue: int = 256
    verify_cached: bool = True
    fetch_threads: int = 8
    piece_bytes: int | None = None
    landing_wait_s: float = 0.5

    def __post_init__(self) -> None:
        piece = 1 if self.piece_bytes is None else self.piece_bytes
        if self.fetch_threads < 1 or piece < 1 or self.landing_wait_s < 0:
            raise ConfigError(f"bad tier options: {self}")


class TierStack(TierFilling, ChunkSource):
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
        self.chunks = chunks
        self.origin = origin
        self.tiers = list(tiers)
        self.options = options or TierOptions()
        self.policy_name = policy
        self.policies: list[Placement] = [make_policy(policy) for _ in self.tiers]
        self.origin_counters = TierCounters()
        self._by_key = ChunkKeys(chunks)  # entries made as chunks are used, not up front
        self._sizes = ChunkSizes(chunks)
        # The bookkeeping lock: tiers' held/verified/counters, the policies, corrupt chunks.
        # Held for bookkeeping only, never across I/O (the copier keeps its own in-flight set).
        self._mutex = threading.Lock()
        self._corrupt: dict[int, str] = {}
        self._refused: set[int] = set()  # chunks no tier would take at the last look
        self._warned: set[str] = set()
        self._shunned: set[int] = set()  # chunks whose fetch in flight served bad bytes
        self._checking: dict[int, threading.Lock] = {}  # chunk -> held while a copy is checked
        self._complete = set()  # see TierFilling
        for tier in self.tiers:
            tier.files.sweep()  # left by a process killed mid-copy
            self._scan(tier)
        # Chunks being copied land where every process of the host reads them: the directory
        # of the first disk tier, else this process's memory.
        self.landing = landing_for(next((t.directory for t in self.tiers if t.shared), None))
        self.landing.sweep()
        self.fetch_counters = FetchCounters()
        piece = self.options.piece_bytes or (
            _FIRST_PIECE_COSTLY if origin.costly_requests else _FIRST_PIECE
        )
        self.tuner = FetchTuner.starting(
            origin.parallel_requests, self.options.fetch_threads, piece
        )
        fetch_threads = self.tuner.limits.max_inflight
        self._gate = Gate()
        self._demanded: dict[int, int] = {}  # chunk -> offset a read waits for in its copy
        self._elsewhere: dict[int, float] = {}  # chunk -> when its claim was found taken
        self._splits = 0  # pieces read as halves for the tuner's fit (a few)
        self._landing_seen: set[int] = set()
        self._ahead = LookAhead(mean_chunk_size(chunks))
        # Only clairvoyant tiers prefetch: other stacks do not count reads for it.
        self._looks_ahead = any(isinstance(p, Clairvoyant) for p in self.policies)
        self._fetches = ThreadPoolExecutor(
            fetch_threads if self.tiers else 1, thread_name_prefix="tierfeed-fetch"
        )
        self._hedges = ThreadPoolExecutor(_HEDGE_THREADS, thread_name_prefix="tierfeed-hedge")
        self._hedge_origin = origin.for_hedges() if self.tiers else origin
        self._hedged_bytes = self._begun_bytes = 0
        empty = np.zeros(0, dtype=np.int64)
        self._reads = (empty, empty, empty, empty)  # see `set_reads`
        threads = self.options.threads if self.tiers else 0  # named tierfeed-copy-<i>
        self._copier = Copier(
            self._copy,
            threads,
            self.options.queue,
            needed=self._needed,
            failed=self._copy_failed,
            urgent_threads=_URGENT_COPIES if self.tiers else 0,
        )

    # --- tier contents ------------------------------------------------------------------

    def _scan(self, tier: Tier) -> None:
        """What a tier holds now (other processes may have filled a shared directory)."""
        held = tier.files.scan(self._by_key)
        with self._mutex:
            tier.held = held
            tier.scanned = time.monotonic()

    def _warn(self, what: str, message: str) -> None:
        """Log the first failure of each kind; later ones are only counted."""
        with self._mutex:
            if what in self._warned:
                return
            self._warned.add(what)
        _log.warning("%s (further such failures are counted, not logged)", message)

    # --- reads ----------------------------------------------------------------------------

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Bytes of ``chunk``: from the highest tier holding it, else from its copy in flight,
        else from the origin."""
        return self._read(chunk, (offset,), (length,), look_again=True)[0]

    def read_ranges(
        self, chunk: int, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes]:
        """Several ranges of ``chunk``: from a tier holding it with one look at the tiers and
        one open of its copy; when no tier does, each range as `read_range` reads it."""
        if not offsets:
            return []
        return self._read(chunk, offsets, lengths, look_again=True)

    def local(self, chunk: int) -> bool:
        """A tier holds a copy of ``chunk`` that is checked (or needs no check) and not known
        bad; or its copy in flight has landed whole (`TierFilling._complete`: read as it is,
        each range checked by its member's checksum, while the whole chunk is checked and
        placed). No lock: a membership test is atomic, and a copy evicted meanwhile is read by
        the ordinary path (`_read_copy` finds it gone and the read goes one level down)."""
        if chunk in self._corrupt:
            return False
        if chunk in self._complete:
            return True
        verify = self.options.verify_cached
        return any(
            chunk in tier.held and (not verify or chunk in tier.verified) for tier in self.tiers
        )

    def _read(
        self,
        chunk: int,
        offsets: Sequence[int],
        lengths: Sequence[int],
        look_again: bool,
        counted: bool = False,
    ) -> list[bytes]:
        """The ranges; ``counted``: the policies and the look-ahead have seen these reads."""
        info = self.chunks[chunk]
        with self._mutex:
            failure = self._corrupt.get(chunk)
            if not counted:
                for policy in self.policies:
                    for _ in offsets:
                        policy.accessed(chunk)
            holding = [chunk in t.held for t in self.tiers]
        if failure is not None:
            raise ChunkCorruptError(failure)
        if self._looks_ahead and not counted:
            now = time.monotonic()
            horizon = self._ahead.due(now, self.tuner.rate, self._copier.inflight, len(offsets))
            if horizon:
                self.prefetch(horizon)
        data = self._from_held(info, holding, offsets, lengths)
        if data is not None:
            self._complete.discard(chunk)  # placed: read from the tier from now on
        elif chunk in self._complete:
            data = self._from_complete(info, offsets, lengths)
        if data is not None:
            return data
        if len(offsets) > 1:  # no tier holds it: each range its own way (copy in flight, origin)
            return [
                self._read(chunk, (o,), (n,), look_again, counted=True)[0]
                for o, n in zip(offsets, lengths, strict=True)
            ]
        offset, length = offsets[0], lengths[0]
        if chunk not in self._refused:  # a chunk no tier takes is read from the origin
            # Placed by another process since this one looked: read it from the tier (once:
            # a copy that vanishes again is read below).
            if look_again and self._appeared(info):
                return self._read(chunk, offsets, lengths, look_again=False, counted=True)
            one = self._from_arrival(info, offset, length)
            if one is not None:
                return [one]
            if look_again and self._appeared(info):  # placed by the copy this read awaited
                return self._read(chunk, offsets, lengths, look_again=False, counted=True)
        one = self._origin_read(info, offset, length, gated=False)
        with self._mutex:
            self.origin_counters.hits += 1
            self.origin_counters.bytes += len(one)
        self.schedule(chunk)
        return [one]

    def _from_held(
        self, info: ChunkInfo, holding: list[bool], offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes] | None:
        """The ranges from the highest tier holding the chunk (and usable), else None."""
        for i, (tier, held) in enumerate(zip(self.tiers, holding, strict=True)):
            if held and self._usable(tier, info):
                data = self._read_copy(tier, info, offsets, lengths)
                if data is not None:
                    with self._mutex:
                        tier.counters.hits += len(data)
                        tier.counters.bytes += sum(map(len, data))
                    if i > 0:
                        self.schedule(info.id)  # a faster tier lacks it: fill it from this one
                    return data
            with self._mutex:
                tier.counters.misses += len(offsets)
        return None

    def _read_copy(
        self, tier: Tier, info: ChunkInfo, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes] | None:
        """The ranges from ``tier``'s copy; None if the copy is gone, or short (then dropped)."""
        try:
            data = tier.driver.read_ranges(self._by_key.key(info.id), offsets, lengths)
        except NotFoundError:  # evicted by another process just now
            with self._mutex:
                tier.held.pop(info.id, None)
                tier.verified.discard(info.id)
            return None
        if any(len(d) != n for d, n in zip(data, lengths, strict=True)):
            self._drop(tier, info)  # truncated behind the cache's back: never serve it
            return None
        return data

    def _usable(self, tier: Tier, info: ChunkInfo) -> bool:
        """A cached copy is checked before this process serves it (a disk copy once per host
        and file: see `SharedDirectory.usable`); a bad one is dropped and fetched again."""
        if not self.options.verify_cached or info.id in tier.verified:
            return True  # a membership test is atomic: no lock for the common case
        with self._mutex:
            checking = self._checking.setdefault(info.id, threading.Lock())
        with checking:  # one reader checks a copy (reads all of it); the others wait for it
            if info.id in tier.verified:
                return True
            try:
                good = tier.files.usable(info)
            except NotFoundError:
                with self._mutex:
                    tier.held.pop(info.id, None)
                return False
            if good:
                with self._mutex:
                    tier.verified.add(info.id)
                return True
        self._drop(tier, info)
        self.schedule(info.id)  # fetch it again
        return False

    def _drop(self, tier: Tier, info: ChunkInfo) -> str:
        """Remove a bad copy of a chunk from ``tier``; returns which copy it was. The next miss
        fetches the chunk again."""
        key = cache_key(info)
        with self._mutex:
            tier.held.pop(info.id, None)
            tier.verified.discard(info.id)
            tier.counters.corrupt_dropped += 1
            self._refused.clear()
        where = f"copy {tier.files.where(key)} of tier {tier.name}"
        tier.files.unmark(key)
        try:
            tier.driver.delete(key)
        except NotFoundError:
            pass  # another process dropped it first
        except StorageError as exc:
            self._warn(f"drop:{tier.name}", f"cannot remove the bad {where}: {exc}")
        _log.warning("dropped the bad %s (chunk %s); it is fetched again", where, info.name)
        return where

    def discard(self, chunk: int) -> str | None:
        """Drop the highest cached copy of ``chunk``: the bytes it served failed their check."""
        with self._mutex:
            tier = next((t for t in self.tiers if chunk in t.held), None)
        if tier is not None:
            return self._drop(tier, self.chunks[chunk])
        self._complete.discard(chunk)
        arrival = None if chunk in self._shunned else self.landing.find(self.chunks[chunk])
        if arrival is None:
            return None
        arrival.close()
        self._shunned.add(chunk)  # read it from the origin from now on
        return f"copy in flight of chunk {self.chunks[chunk].name}"

    # --- copies ---------------------------------------------------------------------------

    def schedule(self, chunk: int) -> bool:
        """Queue a whole-chunk copy into the tiers; False if present, queued, or queue full."""
        if not self.tiers or not self.origin.holds_whole(self.chunks[chunk].name):
            return False  # e.g. a namespace holding only some members of the chunk
        return self._copier.schedule(chunk)

    # --- clairvoyance ---------------------------------------------------------------------

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """Tell clairvoyant tiers the chunk of every read to come, and prefetch its start.

        Args:
            sequence: one chunk id per read, in order (from the plan).
            read_bytes: mean bytes of one read (weighs a whole-chunk copy against reads).
        """
        for i, policy in enumerate(self.policies):
            if isinstance(policy, Clairvoyant):
                # Built aside (an O(reads) pass), then swapped in: readers never wait on it.
                fresh = Clairvoyant()
                fresh.set_future(sequence, read_bytes)
                with self._mutex:
                    self.policies[i] = fresh
                    self._refused.clear()  # the future decides what a tier takes
        self.prefetch()

    def set_reads(
        self, chunks: npt.ArrayLike, offsets: npt.ArrayLike, ends: npt.ArrayLike | None = None
    ) -> None:
        """This epoch's reads in the order they are consumed (their chunks, and the byte
        ranges they read: ``offsets`` to ``ends``, exclusive; None: the start only): a copy
        fetches its chunk's pieces in the order these need them, every piece a read spans."""
        chunk_of = np.asarray(chunks, dtype=np.int64)
        by_chunk = np.argsort(chunk_of, kind="stable")  # each chunk's reads, in order
        starts = np.asarray(offsets, dtype=np.int64)
        stops = starts + 1 if ends is None else np.asarray(ends, dtype=np.int64)
        self._reads = (chunk_of[by_chunk], by_chunk, starts, stops)

    def _reads_of(
        self, chunk: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The positions of ``chunk``'s reads in the order of consumption, and their byte
        ranges (start, end)."""
        sorted_chunks, positions, starts, stops = self._reads
        lo, hi = np.searchsorted(sorted_chunks, (chunk, chunk + 1))
        mine = positions[lo:hi]
        return mine, starts[mine], stops[mine]

    def prefetch(self, horizon: int = 64) -> int:
        """Queue the chunks of the next ``horizon`` reads of the known future that fit (the
        tiers' quotas and policies decide); returns how many."""
        queued = 0
        landing: set[int] | None = None
        for tier, policy in zip(self.tiers, self.policies, strict=True):
            if isinstance(policy, Clairvoyant):
                landing = self._landing_here() if landing is None else landing
                with self._mutex:
                    taken = self._committed(tier, landing, -1)
                    chosen = list(policy.prefetch(taken, tier.quota, self._sizes, horizon))
                for chunk in chosen:
                    queued += self.schedule(chunk)
        return queued

    def open_ahead(self, chunks: Sequence[int]) -> None:
        """Open these chunks at the origin in the background, in this order (origins that
        can, e.g. POSIX)."""
        # Copies read through descriptors of their own (`Driver.read_block`): opened too.
        self.origin.open_ahead([self.chunks[c].name for c in chunks], blocks=bool(self.tiers))

    def begin_epoch(self) -> None:
        """A new epoch: the origin loads what changed (a job namespace's inbox); tiers that
        refused a chunk are asked again."""
        with self._mutex:
            self._refused.clear()
        self.origin.begin_epoch()

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until queued copies are done (tests, benchmarks, stage-in), at most
        ``timeout`` seconds; raises StorageError if they are not."""
        self._copier.drain(timeout)

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
                    self._scan(tier)
        with self._mutex:
            out: dict[str, Any] = {
                t.name: dict(
                    t.counters.snapshot(), held_bytes=sum(t.held.values()), shared=int(t.shared)
                )
                for t in self.tiers
            }
            # Transient faults the origin's driver tried again (resets, short bodies, 5xx).
            out["origin"] = dict(
                self.origin_counters.snapshot(), retries=self.origin.counters.retries
            )
        if self.tiers:
            out["fetch"] = dict(
                self.fetch_counters.snapshot(),
                piece_kib=self.tuner.piece // 1024,
                inflight=self.tuner.inflight,
                origin_mbps=round(self.tuner.rate / 1e6, 1),
            )
        out["origin"]["ops"] = self.origin.counters.snapshot()
        return out

    def close(self) -> None:
        """Stop and join the copy threads; idempotent."""
        if self._copier.closed:
            return
        self._copier.close()  # queued copies are dropped, running ones finish
        self._fetches.shutdown(wait=True, cancel_futures=True)
        self._hedges.shutdown(wait=True, cancel_futures=True)
        self.origin.close()
        if self._hedge_origin is not self.origin:
            self._hedge_origin.close()
        for tier in self.tiers:
            tier.driver.close()

    def __enter__(self) -> TierStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
