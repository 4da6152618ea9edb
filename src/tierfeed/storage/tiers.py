"""The tier stack: reads served by the highest tier holding a chunk; misses copied upward.

A read of (chunk, offset, length) goes to the first tier that holds the chunk. On a miss it
is range-read from the origin at once, and a whole-chunk copy is queued for a background
thread: the copy is verified against the chunk's checksum and published atomically, so a
tier never serves part of a chunk. Concurrent misses on one chunk fetch it once. The origin
is read-only: it is never written or deleted.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy.typing as npt

from tierfeed.errors import ChunkCorruptError, ConfigError, NotFoundError, StorageError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.storage.driver import Driver
from tierfeed.storage.placement import Clairvoyant, Placement, make_policy
from tierfeed.storage.posix import PosixDriver
from tierfeed.storage.shared_dir import copy_claim, mark, marked, placement_lock, unmark

__all__ = ["Tier", "TierCounters", "TierOptions", "TierStack"]


@dataclass
class TierCounters:
    """What one tier did."""

    hits: int = 0
    misses: int = 0
    bytes: int = 0
    copies: int = 0
    evictions: int = 0
    corrupt_dropped: int = 0
    copy_s: float = 0.0


@dataclass
class Tier:
    """A cache level: a writable driver with a byte quota.

    Attributes:
        driver: where chunks are kept (memory for RAM, posix for local disk).
        quota: the most bytes of chunks it may hold.
        name: for counters and messages.
    """

    driver: Driver
    quota: int
    name: str = ""
    counters: TierCounters = field(default_factory=TierCounters)
    held: dict[int, int] = field(default_factory=dict)  # chunk -> bytes
    verified: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.driver.read_only:
            raise ConfigError(f"tier {self.name or self.driver}: a cache tier must be writable")
        self.name = self.name or self.driver.name

    @property
    def directory(self) -> Path | None:
        """The directory of a disk tier (None for RAM)."""
        return self.driver.root if isinstance(self.driver, PosixDriver) else None

    @property
    def shared(self) -> bool:
        """True for a directory other processes may fill too (needs locks and rescans)."""
        return isinstance(self.driver, PosixDriver)


@dataclass(frozen=True)
class TierOptions:
    """Background copying.

    Attributes:
        threads: copy and prefetch threads.
        queue: the most copies waiting; further misses are served but not queued.
        verify_cached: check a disk-cached chunk's checksum on first use in this process.
    """

    threads: int = 4
    queue: int = 256
    verify_cached: bool = True


def cache_key(info: ChunkInfo) -> str:
    """A cached chunk's name: its id and checksum, so another dataset never matches it."""
    return f"{info.id:08d}-{info.checksum:016x}.tar"


class TierStack:
    """A ChunkSource over cache tiers and a read-only origin.

    Args:
        chunks: the store's chunks (names relative to the origin's root).
        origin: where chunks live; used read-only.
        tiers: cache tiers, fastest first (e.g. RAM, then local disk).
        policy: ``fill-top``, ``lru`` or ``clairvoyant`` (one instance per tier).
        options: background thread settings.
    """

    def __init__(
        self,
        chunks: Sequence[ChunkInfo],
        origin: Driver,
        tiers: Sequence[Tier] = (),
        policy: str = "fill-top",
        options: TierOptions | None = None,
    ) -> None:
        self.chunks = list(chunks)
        self.origin = origin
        self.tiers = list(tiers)
        self.options = options or TierOptions()
        self.policy_name = policy
        self.policies: list[Placement] = [make_policy(policy) for _ in self.tiers]
        self.origin_counters = TierCounters()
        self._mutex = threading.Lock()
        self._inflight: set[int] = set()
        self._corrupt: dict[int, str] = {}
        self._queue: queue.Queue[int | None] = queue.Queue(self.options.queue)
        self._closed = False
        for tier in self.tiers:
            if isinstance(tier.driver, PosixDriver):
                tier.driver.remove_stale_temporaries()  # left by a process killed mid-copy
            self._scan(tier)
        self._threads = [
            threading.Thread(target=self._worker, name=f"tierfeed-copy-{i}", daemon=True)
            for i in range(self.options.threads if self.tiers else 0)
        ]
        for t in self._threads:
            t.start()

    # --- tier contents ------------------------------------------------------------------

    def _scan(self, tier: Tier) -> None:
        """What a tier holds now (other processes may have filled a shared directory)."""
        names = {cache_key(c): c for c in self.chunks}
        tier.held = {names[p].id: names[p].size for p in tier.driver.list() if p in names}

    # --- reads ----------------------------------------------------------------------------

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """Bytes of ``chunk``: from the highest tier holding it, else from the origin."""
        if chunk in self._corrupt:
            raise ChunkCorruptError(self._corrupt[chunk])
        for policy in self.policies:
            policy.accessed(chunk)
        info = self.chunks[chunk]
        for tier in self.tiers:
            if chunk in tier.held and self._usable(tier, info):
                try:
                    data = tier.driver.read_range(cache_key(info), offset, length)
                except NotFoundError:  # evicted by another process just now
                    tier.held.pop(chunk, None)
                    continue
                tier.counters.hits += 1
                tier.counters.bytes += len(data)
                return data
            tier.counters.misses += 1
        data = self.origin.read_range(info.name, offset, length)
        self.origin_counters.hits += 1
        self.origin_counters.bytes += len(data)
        if len(data) != length:
            raise ChunkCorruptError(
                f"chunk {info.name} at the origin is shorter than the index says "
                f"(wanted {offset}+{length} bytes); run `tierfeed verify`"
            )
        self.schedule(chunk)
        return data

    def _usable(self, tier: Tier, info: ChunkInfo) -> bool:
        """A persistent tier's chunk is checked before this process serves it: once per host
        and file (a mark records the file it verified), so forked workers skip it."""
        if not tier.shared or not self.options.verify_cached or info.id in tier.verified:
            return True
        if tier.directory is not None and marked(tier.directory, cache_key(info)):
            tier.verified.add(info.id)
            return True
        try:
            data = tier.driver.read(cache_key(info))
        except NotFoundError:
            tier.held.pop(info.id, None)
            return False
        if checksum_bytes(data) != info.checksum:
            with contextlib.suppress(NotFoundError):
                tier.driver.delete(cache_key(info))
            tier.held.pop(info.id, None)
            tier.counters.corrupt_dropped += 1
            self.schedule(info.id)  # fetch it again
            return False
        tier.verified.add(info.id)
        if tier.directory is not None:
            mark(tier.directory, cache_key(info))
        return True

    # --- copies ---------------------------------------------------------------------------

    def schedule(self, chunk: int) -> bool:
        """Queue a whole-chunk copy into the tiers; False if present, queued, or queue full."""
        if not self.tiers or self._closed:
            return False
        with self._mutex:
            if chunk in self._inflight or any(chunk in t.held for t in self.tiers):
                return False
            self._inflight.add(chunk)
        try:
            self._queue.put_nowait(chunk)
        except queue.Full:
            with self._mutex:
                self._inflight.discard(chunk)
            return False
        return True

    def _worker(self) -> None:
        while True:
            chunk = self._queue.get()
            if chunk is None:
                return
            try:
                self._copy(chunk)
            except StorageError:
                pass  # the read path still serves from the origin; the copy is retried later
            finally:
                with self._mutex:
                    self._inflight.discard(chunk)

    def _copy(self, chunk: int) -> None:
        info = self.chunks[chunk]
        started = time.perf_counter()
        shared = next((t.directory for t in self.tiers if t.directory is not None), None)
        key = cache_key(info)
        with contextlib.nullcontext(True) if shared is None else copy_claim(shared, key) as mine:
            if not mine:
                return  # another process copies it now; a later miss finds it landed
            # Another process (a sibling DataLoader worker) may have copied it already: take
            # it from the shared directory rather than from the origin.
            data = self._from_shared(info)
            if data is None:
                data = self.origin.read(info.name)
                if len(data) != info.size or checksum_bytes(data) != info.checksum:
                    self._corrupt[chunk] = (
                        f"chunk {info.name} at the origin fails its checksum (size "
                        f"{len(data)}, index says {info.size}); the origin copy is damaged: "
                        "re-pack or restore it"
                    )
                    return
                self.origin_counters.copies += 1
            self._place_all(info, data, started)

    def _from_shared(self, info: ChunkInfo) -> bytes | None:
        """The whole chunk from a shared tier another process filled, if one holds it (checked)."""
        for tier in self.tiers:
            if not tier.shared:
                continue
            self._scan(tier)
            if info.id in tier.held and self._usable(tier, info):
                with contextlib.suppress(NotFoundError):
                    data = tier.driver.read(cache_key(info))
                    if info.id in tier.verified or checksum_bytes(data) == info.checksum:
                        return data
        return None

    def _place_all(self, info: ChunkInfo, data: bytes, started: float) -> None:
        # Inclusive: every tier that accepts the chunk keeps it, so a persistent disk tier
        # still holds it when the processes owning the RAM tiers are gone (DataLoader workers).
        for i, tier in enumerate(self.tiers):
            if self._place(i, tier, info, data):
                tier.counters.copies += 1
                tier.counters.copy_s += time.perf_counter() - started

    def _place(self, i: int, tier: Tier, info: ChunkInfo, data: bytes) -> bool:
        """Write the chunk into ``tier`` if its policy takes it; True if this call wrote it."""
        root = tier.directory
        with contextlib.nullcontext() if root is None else placement_lock(root):
            if root is not None:
                self._scan(tier)  # other processes' copies and evictions count too
                if info.id in tier.held:
                    return False  # another process wrote it
            ok, victims = self.policies[i].choose(
                tier.held, info.id, info.size, tier.quota, fetched=True
            )
            if not ok:
                return False
            for victim in victims:
                with contextlib.suppress(NotFoundError):
                    tier.driver.delete(cache_key(self.chunks[victim]))
                if root is not None:
                    unmark(root, cache_key(self.chunks[victim]))
                tier.held.pop(victim, None)
                tier.counters.evictions += 1
            tier.driver.write(cache_key(info), data)  # temporary name, then rename
            tier.held[info.id] = info.size
            tier.verified.add(info.id)
            if root is not None:
                mark(root, cache_key(info))  # checked before it was written
            return True

    # --- clairvoyance ---------------------------------------------------------------------

    def set_future(self, sequence: npt.ArrayLike, read_bytes: float = 0.0) -> None:
        """Tell clairvoyant tiers the chunk of every read to come, and prefetch its start.

        Args:
            sequence: one chunk id per read, in order (from the plan).
            read_bytes: mean bytes of one read (weighs a whole-chunk copy against reads).
        """
        for policy in self.policies:
            if isinstance(policy, Clairvoyant):
                policy.set_future(sequence, read_bytes)
        self.prefetch()

    def prefetch(self) -> int:
        """Queue the next chunks of the known future that fit; returns how many."""
        queued = 0
        sizes = {c.id: c.size for c in self.chunks}
        for tier, policy in zip(self.tiers, self.policies, strict=True):
            if isinstance(policy, Clairvoyant):
                for chunk in policy.prefetch(tier.held, tier.quota, sizes):
                    queued += self.schedule(chunk)
        return queued

    def open_ahead(self, chunks: Sequence[int]) -> None:
        """Open these chunks at the origin in the background, in this order (POSIX origins)."""
        if isinstance(self.origin, PosixDriver):
            self.origin.open_ahead([self.chunks[c].name for c in chunks])

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until queued copies are done (tests, benchmarks, stage-in)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._mutex:
                if not self._inflight or self._closed:
                    return
            time.sleep(0.005)
        raise StorageError(f"tier copies still running after {timeout} s")

    def stats(self) -> dict[str, Any]:
        """Counters of every tier and of the origin, as plain values."""
        out: dict[str, Any] = {t.name: dict(t.counters.__dict__, held_bytes=sum(t.held.values()))
                               for t in self.tiers}  # fmt: skip
        out["origin"] = dict(self.origin_counters.__dict__, ops=self.origin.counters.snapshot())
        return out

    def close(self) -> None:
        """Stop and join the copy threads; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(queue.Empty):  # queued copies are dropped, not waited for
            while True:
                dropped = self._queue.get_nowait()
                with self._mutex:
                    self._inflight.discard(dropped if dropped is not None else -1)
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        self.origin.close()
        for tier in self.tiers:
            tier.driver.close()

    def __enter__(self) -> TierStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def disk_tier(path: str | os.PathLike[str], quota: int, shared: bool = False) -> Tier:
    """A local-disk tier in ``path`` (0700 unless ``shared``)."""
    return Tier(PosixDriver(Path(path), shared=shared), quota, name=f"disk:{path}")
