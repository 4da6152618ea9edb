"""tierfeed: keep deep-learning training fed from slow shared storage."""

from __future__ import annotations

from tierfeed.errors import TierfeedError
from tierfeed.format.chunkref import ChunkInfo, ChunkSource
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, PackReport, pack
from tierfeed.format.shards import index_shards
from tierfeed.format.store import PathStat, Sample, Store, open_store
from tierfeed.format.verify import verify_store
from tierfeed.world import World

__version__ = "0.1.0"

__all__ = [
    "ChunkInfo",
    "ChunkSource",
    "Index",
    "PackOptions",
    "PackReport",
    "PathStat",
    "Sample",
    "Store",
    "TierfeedError",
    "World",
    "__version__",
    "index_shards",
    "open_store",
    "pack",
    "verify_store",
]
