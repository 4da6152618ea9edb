"""tierfeed: keep deep-learning training fed from slow shared storage.

The public names load on first use (PEP 562), so that `import tierfeed` and `tierfeed --help`
do not pay for numpy, tqdm and multiprocessing before they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tierfeed.errors import TierfeedError

if TYPE_CHECKING:
    from tierfeed.format.chunkref import ChunkInfo
    from tierfeed.format.index import Index
    from tierfeed.format.pack import PackOptions, PackReport
    from tierfeed.format.tree import PathStat
    from tierfeed.format.verify import verify_store
    from tierfeed.format.writer import WriteReport
    from tierfeed.loader.compose import open_store
    from tierfeed.loader.convert import convert
    from tierfeed.loader.upload import Writer, optimize, pack
    from tierfeed.loader.urlshards import index_shards
    from tierfeed.storage.source import ChunkSource
    from tierfeed.storage.store import Sample, Store
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
    "WriteReport",
    "Writer",
    "__version__",
    "convert",
    "index_shards",
    "open_store",
    "optimize",
    "pack",
    "verify_store",
]

# name -> the module defining it, imported when the name is first used.
_LAZY = {
    "ChunkInfo": "tierfeed.format.chunkref",
    "ChunkSource": "tierfeed.storage.source",
    "Index": "tierfeed.format.index",
    "convert": "tierfeed.loader.convert",
    "optimize": "tierfeed.loader.upload",
    "PackOptions": "tierfeed.format.pack",
    "PackReport": "tierfeed.format.pack",
    "pack": "tierfeed.loader.upload",
    "index_shards": "tierfeed.loader.urlshards",
    "PathStat": "tierfeed.format.tree",
    "Sample": "tierfeed.storage.store",
    "Store": "tierfeed.storage.store",
    "open_store": "tierfeed.loader.compose",
    "verify_store": "tierfeed.format.verify",
    "WriteReport": "tierfeed.format.writer",
    "Writer": "tierfeed.loader.upload",
    "World": "tierfeed.world",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tierfeed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later uses are plain attribute lookups
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
