"""Storage: every byte path. Chunk sources and the Store reading through them, drivers (posix,
memory, fsspec, slow) behind one retry policy, the verified copy, placement policies and the
tier stack."""

from __future__ import annotations

import importlib
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.format.chunkroot import is_url
from tierfeed.format.tree import PathStat
from tierfeed.latency import LatencyModel, LatencySampler
from tierfeed.storage.chunkfiles import DirectoryChunks
from tierfeed.storage.driver import Driver, OpCounters
from tierfeed.storage.fetch import fetch_verified
from tierfeed.storage.memory import MemoryDriver
from tierfeed.storage.posix import PosixDriver
from tierfeed.storage.retry import RetryPolicy
from tierfeed.storage.slow import SlowDriver
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.store import Sample, Store
from tierfeed.storage.tiers import Tier, TierOptions, TierStack, disk_tier

__all__ = [
    "DRIVERS",
    "ChunkSource",
    "DirectoryChunks",
    "Driver",
    "LatencyModel",
    "LatencySampler",
    "MemoryDriver",
    "OpCounters",
    "PathStat",
    "PosixDriver",
    "RetryPolicy",
    "Sample",
    "SlowDriver",
    "Store",
    "Tier",
    "TierOptions",
    "TierStack",
    "disk_tier",
    "driver_for",
    "fetch_verified",
]

# name -> (module:Class, what to install when its dependency is missing)
DRIVERS: dict[str, tuple[str, str]] = {
    "posix": ("tierfeed.storage.posix:PosixDriver", ""),
    "memory": ("tierfeed.storage.memory:MemoryDriver", ""),
    "fsspec": (
        "tierfeed.storage.fsspec_driver:FsspecDriver",
        "reinstall tierfeed (fsspec and s3fs are its own dependencies; gs:// also needs "
        "'tierfeed[gcs]', az:// 'tierfeed[azure]')",
    ),
    "slow": ("tierfeed.storage.slow:SlowDriver", ""),
}


def driver_for(location: str, read_only: bool = True, **options: Any) -> Driver:
    """A driver for a directory path or a URL (``s3://...`` and other fsspec protocols)."""
    name = "fsspec" if is_url(location) else "posix"
    target, hint = DRIVERS[name]
    module_name, _, cls_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except ImportError:
        raise ConfigError(f"the {name} driver is not installed: {hint}") from None
    path = location.removeprefix("file://")
    driver: Driver = cls(path, read_only=read_only, **options)
    return driver
