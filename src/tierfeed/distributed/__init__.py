"""Distributed: stage-in to node-local storage, one namespace over the job, sample exchange.

The names load on first use (PEP 562): `tierfeed stage --help` does not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierfeed.distributed.comm import Comm
    from tierfeed.distributed.exchanger import ExchangeCounters, ExchangeOptions, Exchanger
    from tierfeed.distributed.holders import SampleHolders, chunk_holders
    from tierfeed.distributed.job import Namespace
    from tierfeed.distributed.namespace import NamespaceDriver
    from tierfeed.distributed.pls import Scheduler
    from tierfeed.distributed.staging import StageReport, local_dir_for, stage

# name -> the module defining it, imported when the name is first used.
_LAZY = {
    "Comm": "comm",
    "ExchangeCounters": "exchanger",
    "ExchangeOptions": "exchanger",
    "Exchanger": "exchanger",
    "chunk_holders": "holders",
    "SampleHolders": "holders",
    "Namespace": "job",
    "NamespaceDriver": "namespace",
    "Scheduler": "pls",
    "StageReport": "staging",
    "local_dir_for": "staging",
    "stage": "staging",
}

__all__ = [
    "Comm",
    "ExchangeCounters",
    "ExchangeOptions",
    "Exchanger",
    "Namespace",
    "NamespaceDriver",
    "SampleHolders",
    "Scheduler",
    "StageReport",
    "chunk_holders",
    "local_dir_for",
    "stage",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later uses are plain attribute lookups
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
