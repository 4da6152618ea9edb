"""Every ChunkSource the conformance suite runs, by name, over one small packed store.

Add a source by adding one factory to `SOURCES`: it takes the store's opened index and a
scratch directory of its own (for tier directories, an inbox) and returns a ChunkSource
serving that store's chunks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.format.conftest import write_tree
from tierfeed.distributed.namespace import NamespaceDriver
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.storage import DirectoryChunks, MemoryDriver, PosixDriver, Tier, TierStack, disk_tier
from tierfeed.storage.source import ChunkSource

Factory = Callable[[Index, Path], ChunkSource]

QUOTA = 2**24  # every tier holds the whole store


def build_store(root: Path, samples: int = 60, chunk_size: int = 8192, seed: int = 15) -> Path:
    """Pack a generated tree into ``root / "store"`` and return the store directory.

    Member sizes run from 0 bytes to a few tar blocks, so chunks hold several members each and
    member data sits between 512-byte tar headers at offsets that are not block multiples.
    """
    rng = random.Random(seed)
    sizes = [0, 1, 511, 512, 513, 1500, 4000]
    files = {
        f"c{i % 3}/s{i:04d}.bin".encode(): rng.randbytes(sizes[i % len(sizes)] + rng.randrange(64))
        for i in range(samples)
    }
    write_tree(root / "src", files)
    pack(root / "src", root / "store", PackOptions(chunk_size=chunk_size, progress=False))
    return root / "store"


def directory(index: Index, tmp: Path) -> ChunkSource:
    return DirectoryChunks(index.path.parent, index.chunks(), index.path)


def directory_direct(index: Index, tmp: Path) -> ChunkSource:
    return DirectoryChunks(index.path.parent, index.chunks(), index.path, direct=True)


def _origin(index: Index) -> PosixDriver:
    return PosixDriver(index.path.parent, read_only=True)


def stack_no_tiers(index: Index, tmp: Path) -> ChunkSource:
    return TierStack(index.chunks(), _origin(index))


def stack_ram(index: Index, tmp: Path) -> ChunkSource:
    return TierStack(index.chunks(), _origin(index), [Tier(MemoryDriver(), QUOTA, name="ram")])


def stack_disk(index: Index, tmp: Path) -> ChunkSource:
    return TierStack(index.chunks(), _origin(index), [disk_tier(tmp / "disk", QUOTA)])


def stack_ram_disk(index: Index, tmp: Path) -> ChunkSource:
    tiers = [Tier(MemoryDriver(), QUOTA, name="ram"), disk_tier(tmp / "disk", QUOTA)]
    return TierStack(index.chunks(), _origin(index), tiers)


def stack_second_read(index: Index, tmp: Path) -> ChunkSource:
    """A RAM-tiered stack after one read of every chunk: later reads come from the tier."""
    stack = TierStack(index.chunks(), _origin(index), [Tier(MemoryDriver(), QUOTA, name="ram")])
    for info in index.chunks():
        stack.read_range(info.id, 0, min(info.size, 1))
    stack.drain(timeout=30)
    held = stack.tiers[0].held
    if len(held) != len(index.chunks()):
        stack.close()
        raise RuntimeError(f"the RAM tier holds {len(held)} of {len(index.chunks())} chunks")
    return stack


def _namespace(index: Index, tmp: Path) -> NamespaceDriver:
    """A job namespace on a node that staged every chunk (an empty inbox)."""
    local = np.ones(len(index.chunks()), dtype=bool)
    return NamespaceDriver(index, local, tmp / "inbox", timeout_s=1.0)


def namespace(index: Index, tmp: Path) -> ChunkSource:
    return TierStack(index.chunks(), _namespace(index, tmp))


def namespace_ram(index: Index, tmp: Path) -> ChunkSource:
    tiers = [Tier(MemoryDriver(), QUOTA, name="ram")]
    return TierStack(index.chunks(), _namespace(index, tmp), tiers)


SOURCES: dict[str, Factory] = {
    "directory": directory,
    "directory-direct": directory_direct,
    "stack-no-tiers": stack_no_tiers,
    "stack-ram": stack_ram,
    "stack-disk": stack_disk,
    "stack-ram-disk": stack_ram_disk,
    "stack-second-read": stack_second_read,
    "namespace": namespace,
    "namespace-ram": namespace_ram,
}
