"""Deprecated alias of `tierfeed.distributed` (renamed: ``dist`` is the usual name of build
output, which tools skip). Kept for one release: ``import tierfeed.dist.stage`` and the like
give the very modules of `tierfeed.distributed`, so classes and state are shared."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from typing import Any

import tierfeed.distributed as _new

warnings.warn(
    "tierfeed.dist is renamed tierfeed.distributed; the old name goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)

for _info in pkgutil.iter_modules(_new.__path__):
    sys.modules[f"{__name__}.{_info.name}"] = importlib.import_module(
        f"{_new.__name__}.{_info.name}"
    )

# Modules renamed since: the old module names give the new modules.
sys.modules[f"{__name__}.stage"] = importlib.import_module(f"{_new.__name__}.staging")

__path__: list[str] = []  # a package to the import system: its submodules are the aliases above
__all__ = list(_new.__all__)


def __getattr__(name: str) -> Any:
    return getattr(_new, name)
