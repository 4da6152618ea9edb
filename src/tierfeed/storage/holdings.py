"""What each tier of a stack holds, and whether a held copy may be served.

`Holdings` is the bookkeeping a tier stack's reads (`tierfeed.storage.tiers`) and its copies
(`tierfeed.storage.filler`) share: each tier's chunks and checked copies, the placement
policies, the chunks known bad, the chunks no tier would take, and the copies in flight that
landed whole. One lock guards it, held for bookkeeping only, never across I/O.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager

from tierfeed.errors import NotFoundError, StorageError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.storage.chunktable import ChunkKeys, ChunkSizes, total_chunk_size
from tierfeed.storage.disktier import Tier, cache_key
from tierfeed.storage.placement import Clairvoyant, Placement, make_policy

__all__ = ["Holdings"]

_log = logging.getLogger("tierfeed.tiers")


class Holdings:
    """The tiers' contents and the checks of their copies.

    Args:
        chunks: the store's chunks.
        tiers: cache tiers, fastest first.
        policy: the placement policy's name (one instance per tier).
        verify_cached: check a cached copy against its checksum before this process serves it.

    What it knows of chunks beside the tiers' contents is its own, changed only through its
    verbs (each under the lock): the chunks whose origin copy is bad (`mark_corrupt`, the
    message a read of them raises), the chunks no tier would take at the last look (`wanted`
    remembers a refusal, `ask_again` forgets them once room is made or the future changes),
    the copies in flight this process saw land whole (`landed_whole`: read as local until
    placed), and the copies in flight not to be read (`shun`: they served bad bytes, or
    waited out another process's placement lock).

    Attributes:
        mutex: guards ``held``/``verified``/``counters`` of every tier, ``policies`` and the
            sets above.
    """

    def __init__(
        self, chunks: Sequence[ChunkInfo], tiers: Sequence[Tier], policy: str, verify_cached: bool
    ) -> None:
        self.chunks = chunks
        self.tiers = list(tiers)
        self.policies: list[Placement] = [make_policy(policy) for _ in self.tiers]
        self.keys = ChunkKeys(chunks)  # entries made as chunks are used, not up front
        self.sizes = ChunkSizes(chunks)
        self._store_bytes = total_chunk_size(chunks)
        self.verify = verify_cached
        self.mutex = threading.Lock()
        self._corrupt: dict[int, str] = {}
        self._refused: set[int] = set()
        self._complete: set[int] = set()
        self._shunned: set[int] = set()
        self._warned: set[str] = set()
        self._checking: dict[int, threading.Lock] = {}  # chunk -> held while its copy is checked
        # The first tier every process of the host fills (a disk directory): where copies
        # are claimed and land. None: each process's own tiers (RAM) only.
        self.shared: Tier | None = next((t for t in self.tiers if t.shared), None)
        for tier in self.tiers:
            tier.files.sweep()  # left by a process killed mid-copy
            self.scan(tier)

    @property
    def clairvoyant(self) -> bool:
        """Whether a tier places by the plan's future (and so prefetches)."""
        return any(isinstance(p, Clairvoyant) for p in self.policies)

    def scan(self, tier: Tier) -> None:
        """What a tier holds now (other processes may have filled a shared directory)."""
        held = tier.files.scan(self.keys)
        with self.mutex:
            tier.held = held
            tier.scanned = time.monotonic()

    def warn(self, what: str, message: str) -> None:
        """Log the first failure of each kind; later ones are only counted."""
        with self.mutex:
            if what in self._warned:
                return
            self._warned.add(what)
        _log.warning("%s (further such failures are counted, not logged)", message)

    def accessed(self, chunk: int, reads: int) -> list[bool]:
        """Tell the policies of ``reads`` reads of ``chunk``; which tiers hold it."""
        with self.mutex:
            for policy in self.policies:
                for _ in range(reads):
                    policy.accessed(chunk)
            return self.holding(chunk)

    def holding(self, chunk: int) -> list[bool]:
        """Which tiers hold ``chunk`` now (a membership test each: atomic, no lock needed)."""
        return [chunk in t.held for t in self.tiers]

    # --- what is known of a chunk: read without the lock (membership is atomic), changed
    # under it ------------------------------------------------------------------------------

    def failure(self, chunk: int) -> str | None:
        """Why a read of ``chunk`` fails (its origin copy is bad), or None."""
        return self._corrupt.get(chunk)

    def mark_corrupt(self, chunk: int, message: str) -> None:
        with self.mutex:
            self._corrupt[chunk] = message

    def refuses(self, chunk: int) -> bool:
        """Whether no tier would take ``chunk`` at the last look."""
        return chunk in self._refused

    def ask_again(self) -> None:
        """Room was made, or the future changed: every tier is asked again."""
        with self.mutex:
            self._refused.clear()

    def landed_whole(self, chunk: int) -> None:
        """This process saw ``chunk``'s copy in flight land whole: read as local until placed."""
        with self.mutex:
            self._complete.add(chunk)

    def is_landed_whole(self, chunk: int) -> bool:
        return chunk in self._complete

    def forget_landed(self, chunk: int) -> None:
        """``chunk``'s copy in flight is placed, gone, or not to be trusted. Asked on every
        read a tier serves: the lock only when there is something to forget."""
        if chunk in self._complete:
            with self.mutex:
                self._complete.discard(chunk)

    def shun(self, chunk: int) -> None:
        """Read ``chunk`` from the origin from now on, not from its copy in flight."""
        with self.mutex:
            self._shunned.add(chunk)

    def shuns(self, chunk: int) -> bool:
        return chunk in self._shunned

    def settled(self, chunk: int) -> bool:
        """Whether asking for a copy of ``chunk`` is moot: every tier holds it, or none would
        take it at the last look (the cheap answers, asked on every read of a chunk no tier
        holds)."""
        with self.mutex:
            return chunk in self._refused or all(chunk in t.held for t in self.tiers)

    def wanted(self, chunk: int, landing: set[int]) -> bool:
        """Whether a tier lacks ``chunk`` and its policy would take it, counting the copies
        ``landing`` on this host as taken (`committed`); a refusal by every tier that lacks it
        is remembered until `ask_again`."""
        size = self.sizes[chunk]
        with self.mutex:
            lacking = [
                (t, p)
                for t, p in zip(self.tiers, self.policies, strict=True)
                if chunk not in t.held
            ]
            if not lacking or chunk in self._refused:
                return False
            if any(
                p.choose(self.committed(t, landing, chunk), chunk, size, t.quota, fetched=True)[0]
                for t, p in lacking
            ):
                return True
            self._refused.add(chunk)
            return False

    def set_policy(self, i: int, policy: Placement) -> None:
        """Tier ``i`` places by ``policy`` from now on (a clairvoyant one told a new future):
        what a tier takes is decided anew."""
        with self.mutex:
            self.policies[i] = policy
            self._refused.clear()

    def make_room(self, i: int, info: ChunkInfo) -> list[int] | None:
        """Whether tier ``i`` takes ``info``, decided under the lock: the chunks it evicts for
        it (taken off its books now; the caller removes their files), or None if it holds the
        chunk already or its policy says no."""
        tier = self.tiers[i]
        with self.mutex:
            if info.id in tier.held:
                return None  # another process wrote it
            ok, victims = self.policies[i].choose(
                tier.held, info.id, info.size, tier.quota, fetched=True
            )
            if not ok:
                return None
            for victim in victims:
                tier.held.pop(victim, None)
                tier.verified.discard(victim)
                tier.counters.evictions += 1
            self._refused.clear()  # room made, or a chunk placed: ask again
            return victims

    def host_lock(self, tier: Tier) -> AbstractContextManager[None]:
        """What a placement into ``tier`` holds while it decides and writes: the host-wide
        lock of a shared directory (`TierFiles.placing`), or nothing where the tier has room
        for every chunk of the store. There no placement can take another's room or evict
        what another placed, so there is nothing to serialise, and each take of the lock cost
        every copy of the host: on a crowded machine its holder waited for the CPU after
        each of its system calls, and the host's copies queued behind it (docs/BENCHMARKS.md,
        "Ranks on a crowded node"). One copy per chunk is still the claim's
        (`TierFiles.claim`), and a copy that lands meanwhile is still seen before placing."""
        if tier.quota >= self._store_bytes:
            return contextlib.nullcontext()
        return tier.files.placing()

    def placed(self, tier: Tier, info: ChunkInfo) -> None:
        """``info`` is in ``tier`` now, checked."""
        with self.mutex:
            tier.held[info.id] = info.size
            tier.verified.add(info.id)

    def local(self, chunk: int) -> bool:
        """A tier holds a checked (or unchecked by choice) copy of ``chunk`` not known bad, or
        its copy in flight landed whole. No lock: membership tests are atomic, and a copy
        evicted meanwhile is read by the ordinary path (found gone, read one level down)."""
        if chunk in self._corrupt:
            return False
        if chunk in self._complete:
            return True
        return any(
            chunk in tier.held and (not self.verify or chunk in tier.verified)
            for tier in self.tiers
        )

    def read_held(
        self, info: ChunkInfo, holding: list[bool], offsets: Sequence[int], lengths: Sequence[int]
    ) -> tuple[list[bytes], int] | None:
        """The ranges from the highest tier holding the chunk whose copy is usable, and that
        tier's level (0: the fastest); None when none serves them."""
        for level, (tier, held) in enumerate(zip(self.tiers, holding, strict=True)):
            if held and self.usable(tier, info):
                data = self._read_copy(tier, info, offsets, lengths)
                if data is not None:
                    with self.mutex:
                        tier.counters.hits += len(data)
                        tier.counters.bytes += sum(map(len, data))
                    return data, level
            with self.mutex:
                tier.counters.misses += len(offsets)
        return None

    def _read_copy(
        self, tier: Tier, info: ChunkInfo, offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes] | None:
        """The ranges from ``tier``'s copy; None if the copy is gone, or short (then dropped)."""
        try:
            data = tier.driver.read_ranges(self.keys.key(info.id), offsets, lengths)
        except NotFoundError:  # evicted by another process just now
            with self.mutex:
                tier.held.pop(info.id, None)
                tier.verified.discard(info.id)
            return None
        if any(len(d) != n for d, n in zip(data, lengths, strict=True)):
            self.drop(tier, info)  # truncated behind the cache's back: never serve it
            return None
        return data

    def usable(self, tier: Tier, info: ChunkInfo) -> bool:
        """Whether ``tier``'s copy may be served: checked before this process serves it (a
        disk copy once per host and file: see `SharedDirectory.usable`); a bad one is dropped,
        and the next miss fetches the chunk again."""
        if not self.verify or info.id in tier.verified:
            return True  # a membership test is atomic: no lock for the common case
        with self.mutex:
            checking = self._checking.setdefault(info.id, threading.Lock())
        with checking:  # one reader checks a copy (reads all of it); the others wait for it
            if info.id in tier.verified:
                return True
            try:
                good = tier.files.usable(info)
            except NotFoundError:
                with self.mutex:
                    tier.held.pop(info.id, None)
                return False
            if good:
                with self.mutex:
                    tier.verified.add(info.id)
                return True
        self.drop(tier, info)
        return False

    def drop(self, tier: Tier, info: ChunkInfo) -> str:
        """Remove a bad copy of a chunk from ``tier``; returns which copy it was."""
        key = cache_key(info)
        with self.mutex:
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
            self.warn(f"drop:{tier.name}", f"cannot remove the bad {where}: {exc}")
        _log.warning("dropped the bad %s (chunk %s); it is fetched again", where, info.name)
        return where

    def highest(self, chunk: int) -> Tier | None:
        """The fastest tier holding ``chunk``, if any."""
        with self.mutex:
            return next((t for t in self.tiers if chunk in t.held), None)

    def appeared(self, info: ChunkInfo) -> bool:
        """Whether a tier holds the chunk, a shared one looked at again (a copy by another
        process lands, and its arrival ends, between two looks)."""
        for tier in self.tiers:
            if info.id in tier.held:
                return True
            if tier.shared:
                with contextlib.suppress(StorageError):
                    if tier.files.has(cache_key(info)):
                        with self.mutex:
                            tier.held[info.id] = info.size
                        return True
        return False

    def whole(self, info: ChunkInfo) -> bytes | None:
        """The whole chunk from a tier that holds it (a shared one looked at again first:
        another process may have filled it), checked; None if none does."""
        for tier in self.tiers:
            if tier.shared:
                self.scan(tier)
            with self.mutex:
                held = info.id in tier.held
            if held and self.usable(tier, info):
                with contextlib.suppress(NotFoundError):
                    data = tier.driver.read(cache_key(info))
                    # Checked again whatever the marks say: it is about to be copied on.
                    if len(data) == info.size and checksum_bytes(data) == info.checksum:
                        return data
        return None

    def committed(self, tier: Tier, landing: set[int], chunk: int) -> dict[int, int]:
        """What a placement decision for ``chunk`` counts as taken in ``tier`` (under
        ``mutex``): what it holds and, in a tier the host's processes share, the copies
        landing for it. Deciding on what was held alone, each of two DataLoader workers saw
        room for the same bytes: both copied, and chunks were evicted before their reads came
        (the origin bytes it cost: docs/BENCHMARKS.md)."""
        if not tier.shared:
            return tier.held
        view = dict(tier.held)
        for c in landing - {chunk} - view.keys():
            view[c] = self.sizes[c]
        return view
