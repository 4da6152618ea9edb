"""tierfeed: keep deep-learning training fed from slow shared storage."""

from __future__ import annotations

from tierfeed.errors import TierfeedError
from tierfeed.world import World

__version__ = "0.1.0"

__all__ = [
    "TierfeedError",
    "World",
    "__version__",
]
