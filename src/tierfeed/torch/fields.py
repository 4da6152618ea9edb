"""The default decode and collate: a sample as a dict of its fields, batches as dicts of lists.

`sample_fields` is what `Dataset` hands each sample to without a ``decode``: WebDataset's and
MosaicML Streaming's shape, ``{"__key__": "cat/001", "__label__": 0, "jpg": b"..."}``, a
field per member named by its extension (``""`` for a file without one). `collate_fields`
batches such dicts as torch's default collate does (``__label__`` a tensor, keys and bytes
lists), except that a field some samples lack (a sidecar ``.json`` on some samples of a store
packed by key) is a list with ``None`` where it is missing instead of an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data._utils.collate import default_collate

from tierfeed.storage.store import Sample

__all__ = ["collate_fields", "sample_fields"]

_collate: Callable[[list[Any]], Any] = default_collate  # (torch's is untyped)


def sample_fields(sample: Sample) -> dict[str, Any]:
    """``{"__key__": key, "__label__": label (-1 when unlabelled), ext: bytes, ...}``."""
    return {"__key__": sample.key, "__label__": sample.label, **sample.fields}


def collate_fields(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch of `sample_fields` dicts as one dict: each field collated by torch's default
    collate where every sample has it (bytes and strings stay lists, numbers become a
    tensor), else a list holding ``None`` for the samples without it."""
    names = dict.fromkeys(name for sample in batch for name in sample)  # first-seen order
    out: dict[str, Any] = {}
    for name in names:
        values = [sample.get(name) for sample in batch]
        whole = all(name in sample for sample in batch)
        out[name] = _collate(values) if whole else values
    return out
