"""`TierConfig`: the cache tiers a store is read through, and the disk tier's default size.

A disk tier asked for by its directory alone (``TierConfig(disk_dir="/local/cache")``) holds
up to `default_disk_bytes`: the whole store when the file system has room for it, else what it
has free less a margin (5% of the file system, at least 1 GiB, left to everything else). The
size is chosen once, where the Dataset is made (`TierConfig.sized`), so that every worker
process of the host works to the same quota, and said in one line on stderr.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tierfeed.cachedir import CacheFolder, private_dir
from tierfeed.errors import ConfigError
from tierfeed.storage import MemoryDriver, Tier, disk_tier
from tierfeed.units import byte_count, count, human

__all__ = ["TierConfig", "default_disk_bytes"]

_MARGIN_SHARE = 20  # 1/20 of the file system is left to everything else...
_MARGIN_MIN = 2**30  # ...and at least 1 GiB


def _file_system(path: Path) -> os.statvfs_result:
    """The file system ``path`` is on, or will be (its nearest existing parent)."""
    for where in (path, *path.parents):
        try:
            return os.statvfs(where)
        except FileNotFoundError:
            continue
    return os.statvfs("/")


def default_disk_bytes(disk_dir: str | os.PathLike[str], store_bytes: int) -> int:
    """The quota of a disk tier given by its directory alone: the store's ``store_bytes``
    (every chunk), or what the file system has free less a margin (1/20 of it, at least
    1 GiB) when that is less. A cache already in ``disk_dir`` counts as free: it is the
    tier's own."""
    path = Path(disk_dir).absolute()
    st = _file_system(path)
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    free += _held(path)
    room = free - max(_MARGIN_MIN, total // _MARGIN_SHARE)
    return max(0, min(store_bytes, room))


def _held(path: Path) -> int:
    """Bytes of files already under ``path`` (a previous run's cache), not following links."""
    held = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                held += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return held


@dataclass(frozen=True)
class TierConfig:
    """Cache tiers between the store and the readers, built in each process.

    Attributes:
        ram_bytes: a RAM tier of this many bytes in each process (0: none): each DataLoader
            worker holds one, so ``num_workers=8`` with ``ram_bytes="8GB"`` may hold 64 GB
            on the host. Bytes, or a size as text (``"8GB"``, ``"512MiB"``).
        disk_dir: a local-disk tier here, shared by every process of the host (None: none).
        disk_bytes: quota of the disk tier (bytes, or a size as text: ``"100GB"``), shared by
            the host's processes; by default (None) `default_disk_bytes`: the whole store, or
            the file system's free space less a margin when that is less.
        policy: ``fill-top``, ``lru`` or ``clairvoyant`` (fed the plan's reads).
        threads: background copy threads per process (a copy a read waits for starts beside
            them when they are all busy, up to 8 more).

    Raises:
        ConfigError: a negative size, ``disk_bytes`` without a ``disk_dir`` or 0 with one.
    """

    ram_bytes: int = 0
    disk_dir: str | None = None
    disk_bytes: int | None = None
    policy: str = "clairvoyant"
    threads: int = 2

    def __post_init__(self) -> None:
        # Sizes as text ("8GB", "512MiB") become bytes; a wrong type is named here.
        object.__setattr__(
            self, "ram_bytes", byte_count(self.ram_bytes, "TierConfig(ram_bytes=...)")
        )
        if self.disk_bytes is not None:
            disk_bytes = byte_count(self.disk_bytes, "TierConfig(disk_bytes=...)")
            object.__setattr__(self, "disk_bytes", disk_bytes)
        object.__setattr__(self, "threads", count(self.threads, "TierConfig(threads=...)", 1))
        if self.disk_dir is not None and not isinstance(self.disk_dir, (str, os.PathLike)):
            raise ConfigError(f"TierConfig(disk_dir={self.disk_dir!r}): takes a directory path")
        if self.disk_bytes is not None:
            if self.disk_dir is None:
                raise ConfigError(
                    f"TierConfig(disk_bytes={self.disk_bytes}): disk_bytes without a disk_dir; "
                    "give disk_dir (the directory of the disk tier) too"
                )
            if self.disk_bytes <= 0:
                raise ConfigError(
                    f"TierConfig(disk_bytes={self.disk_bytes}): a disk tier needs a quota > 0; "
                    "leave disk_bytes out for the default, or disk_dir out for no disk tier"
                )

    def sized(self, store_bytes: int) -> TierConfig:
        """These tiers with the disk tier's quota decided, for a store of ``store_bytes``:
        the default (said in one line on stderr) when none was given; a given one larger
        than the file system is refused.

        Raises:
            ConfigError: ``disk_bytes`` is larger than the disk tier's file system, or the
                file system has no room for a default quota.
        """
        if self.disk_dir is None:
            return self
        path = Path(self.disk_dir).absolute()
        st = _file_system(path)
        total = st.f_blocks * st.f_frsize
        if self.disk_bytes is not None:
            if self.disk_bytes > total:
                raise ConfigError(
                    f"{path}: disk_bytes={self.disk_bytes} ({human(self.disk_bytes)}) is larger "
                    f"than the file system it is on ({human(total)}); give a smaller disk_bytes"
                )
            return self
        size = default_disk_bytes(path, store_bytes)
        if size <= 0:
            free = human(st.f_bavail * st.f_frsize)
            raise ConfigError(
                f"{path}: the file system has no room for a disk tier ({free} free of "
                f"{human(total)}); free some space, or give disk_bytes= or another disk_dir"
            )
        what = "the whole store" if size >= store_bytes else "the free space less a margin"
        print(
            f"tierfeed: disk tier {path}: up to {human(size)} ({what}); set "
            "TierConfig(disk_bytes=...) to choose",
            file=sys.stderr,
        )
        return dataclasses.replace(self, disk_bytes=size)

    def tiers(self) -> list[Tier]:
        """The configured tiers, fastest first (made anew: each process has its own). A disk
        tier not yet `sized` gets the default quota for a store of unknown size (the free
        space less the margin)."""
        tiers = []
        if self.ram_bytes > 0:
            tiers.append(Tier(MemoryDriver(self.ram_bytes), self.ram_bytes, name="ram"))
        if self.disk_dir is not None:
            quota = self.disk_bytes or default_disk_bytes(self.disk_dir, 2**63)
            if quota <= 0:
                raise ConfigError(f"{self.disk_dir}: the file system has no room for a disk tier")
            tiers.append(disk_tier(self.disk_dir, quota))
        return tiers

    def index_cache(self) -> CacheFolder | None:
        """Where a remote store's index is kept on this host: beside the disk tier's chunks
        (node-local), else None (the user's cache directory). The disk tier's directory is
        made, or checked, here (a link or another user's is refused at once), and checked
        again where the index is fetched (`tierfeed.cachedir.CacheFolder.open`), which uses
        everything below it from that descriptor: nothing is read or written through a link
        or in another user's directory, even one swapped in after a check."""
        if self.disk_dir is not None:
            return CacheFolder(private_dir(self.disk_dir).absolute(), (".index",))
        return None
