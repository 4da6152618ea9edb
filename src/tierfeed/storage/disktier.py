"""A cache tier, and how its files are shared: nothing to share for RAM, a lock-and-mark protocol
for a disk directory that every process of a host fills.

A `Tier` is a writable driver with a quota, what it holds, its counters, and its `TierFiles`.
`TierStack` calls that one object per tier and never asks which kind it is. The RAM kind's
claims always succeed, its lock and marks do nothing and its contents change only by this
process's hand. A `SharedDirectory` keeps the cross-process protocol of `shared_dir` (the
placement lock, per-chunk copy claims, verification marks) and the rescans and sweeps that
other processes' writes call for.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from tierfeed.cachedir import list_names, open_cache_dir
from tierfeed.errors import ConfigError, NotFoundError
from tierfeed.format.chunkref import ChunkInfo, checksum_bytes
from tierfeed.storage.driver import Driver
from tierfeed.storage.posix import PosixDriver
from tierfeed.storage.shared_dir import copy_claim, mark, marked, placement_lock, unmark
from tierfeed.telemetry.counters import Counters

__all__ = [
    "SharedDirectory",
    "Tier",
    "TierCounters",
    "TierFiles",
    "cache_key",
    "disk_tier",
    "tier_files",
]


def cache_key(info: ChunkInfo) -> str:
    """A cached chunk's name: its id and checksum, so another dataset never matches it."""
    return f"{info.id:08d}-{info.checksum:016x}.tar"


class TierFiles:
    """The files of a tier only this process fills (RAM): no locks, claims or marks.

    Args:
        driver: where the tier keeps its chunks (writable).
    """

    shared = False  # other processes fill it too: its contents change behind our back

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def where(self, key: str) -> str:
        """Where the copy ``key`` lives, for messages."""
        return key

    def has(self, key: str) -> bool:
        """Whether the copy ``key`` is there now."""
        return self.driver.exists(key)

    def sweep(self) -> int:
        """Remove what processes killed mid-copy left behind; returns how many."""
        return self.driver.remove_stale_temporaries()

    def scan(self, catalog: Mapping[str, ChunkInfo]) -> dict[int, int]:
        """What the tier holds now: chunk id -> bytes, for the names ``catalog`` knows."""
        return {catalog[p].id: catalog[p].size for p in self.driver.list() if p in catalog}

    def claim(self, key: str) -> AbstractContextManager[bool]:
        """Claim the copy of ``key`` from the origin: yields False while another process holds
        it (it copies the chunk now), True otherwise."""
        return contextlib.nullcontext(True)

    def placing(self) -> AbstractContextManager[None]:
        """Held while one placement (evict, then write) decides and writes."""
        return contextlib.nullcontext()

    def usable(self, info: ChunkInfo) -> bool:
        """Whether this process may serve the copy of ``info`` unchecked; False if it is bad.
        Raises NotFoundError if it is gone."""
        return True

    def mark(self, key: str, fd: int | None = None) -> None:
        """Record that the copy ``key`` is whole and verified; ``fd``: the file open as it, to
        be linked in at ``key`` next (see `tierfeed.storage.shared_dir.mark`)."""

    def evict(self, key: str) -> None:
        """Remove the copy ``key`` (a victim of placement) and its mark; gone already is fine."""
        with contextlib.suppress(NotFoundError):
            self.driver.delete(key)
        self.unmark(key)

    def unmark(self, key: str) -> None:
        """Forget that the copy ``key`` was verified."""


class SharedDirectory(TierFiles):
    """The files of a disk tier in a directory every process of a host fills.

    Args:
        driver: a writable driver over ``root`` (e.g. `PosixDriver`).
        root: the directory; its ``.tier.lock``, ``.claims/`` and ``.verified/`` are the
            protocol (see `tierfeed.storage.shared_dir`), used relative to a descriptor of
            it, checked as `tierfeed.cachedir` checks a shared cache (the driver checked it
            as what it is, private or shared, already).

    Raises:
        ConfigError: ``root`` is a link, another user's (root's may be shared), or writable
            by others without being sticky.
        StorageError: there is no directory ``root``.
    """

    shared = True

    def __init__(self, driver: Driver, root: Path) -> None:
        super().__init__(driver)
        self.root = root
        self._fd = open_cache_dir(root, shared=True, create=False)
        weakref.finalize(self, os.close, self._fd)

    def where(self, key: str) -> str:
        return str(self.root / key)

    def scan(self, catalog: Mapping[str, ChunkInfo]) -> dict[int, int]:
        # The keys are names in the tier's own directory: one listing of it, not a walk of
        # its folders too (claims, marks, landings). A placement scans under the host's
        # placement lock, in a process whose threads contend for the GIL: each system call
        # of a walk let go of it and waited for it again while the lock was held.
        names = list_names(self._fd, files=True)
        return {catalog[p].id: catalog[p].size for p in names if p in catalog}

    def has(self, key: str) -> bool:
        # One stat, no path parsing: asked on a miss, before the origin is read.
        try:
            os.stat(key, dir_fd=self._fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def claim(self, key: str) -> AbstractContextManager[bool]:
        return copy_claim(self._fd, key)

    def placing(self) -> AbstractContextManager[None]:
        return placement_lock(self._fd)

    def usable(self, info: ChunkInfo) -> bool:
        """Checked once per host and file: a mark records the file a process verified, so
        forked workers skip the whole-chunk read; a good file is marked."""
        key = cache_key(info)
        if marked(self._fd, key):
            return True
        if checksum_bytes(self.driver.read(key)) != info.checksum:
            return False
        mark(self._fd, key)
        return True

    def mark(self, key: str, fd: int | None = None) -> None:
        mark(self._fd, key, fd)

    def unmark(self, key: str) -> None:
        unmark(self._fd, key)


def tier_files(driver: Driver) -> TierFiles:
    """The files of a tier over ``driver``: shared if it keeps them in a local directory."""
    root = driver.directory
    return TierFiles(driver) if root is None else SharedDirectory(driver, root)


@dataclass
class TierCounters(Counters[float]):
    """What one tier did."""

    hits: int = 0
    misses: int = 0
    bytes: int = 0
    copies: int = 0
    evictions: int = 0
    corrupt_dropped: int = 0
    copy_failures: int = 0
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
    placing: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    scanned: float = 0.0  # monotonic time of the last look at a shared directory
    files: TierFiles = field(init=False, repr=False, compare=False)  # locks, claims, marks

    def __post_init__(self) -> None:
        if self.driver.read_only:
            raise ConfigError(f"tier {self.name or self.driver}: a cache tier must be writable")
        self.name = self.name or self.driver.name
        self.files = tier_files(self.driver)

    @property
    def directory(self) -> Path | None:
        """The directory of a disk tier (None for RAM)."""
        return self.driver.directory

    @property
    def shared(self) -> bool:
        """True for a directory other processes may fill too (needs locks and rescans)."""
        return self.files.shared


def disk_tier(path: str | os.PathLike[str], quota: int, shared: bool = False) -> Tier:
    """A local-disk tier in ``path``: made 0700 (0755 if ``shared``) if missing, else checked
    and left as it is (`tierfeed.cachedir`).

    Raises:
        ConfigError: ``path`` is a link, another user's, or writable by others (a shared one:
            unless sticky).
        StorageError: it cannot be made or opened.
    """
    return Tier(PosixDriver(Path(path), shared=shared), quota, name=f"disk:{path}")
