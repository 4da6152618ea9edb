"""The default decode and collate: a sample as a dict of its fields, batches as dicts of lists;
and the decodes by name that turn fields into values by their extension.

`sample_fields` is what `Dataset` hands each sample to without a ``decode``: WebDataset's and
MosaicML Streaming's shape, ``{"__key__": "cat/001", "__label__": 0, "jpg": b"..."}``, a
field per member named by its extension (``""`` for a file without one). `collate_fields`
batches such dicts as torch's default collate does (``__label__`` a tensor, keys and bytes
lists), except that a field some samples lack (a sidecar ``.json`` on some samples of a store
packed by key) is a list with ``None`` where it is missing instead of an error.

`decoder` names the decodes a `Dataset` takes as text: ``"fields"`` (the default, bytes),
``"auto"`` or ``"pil"`` (each field by its extension, `tierfeed.format.codecs`: json, text,
integers, numpy arrays, tensors, images as PIL images) and ``"torch"`` (the same, with images as
uint8 CHW tensors and numpy arrays as tensors, so a batch collates to tensors of one shape).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate

from tierfeed.errors import ConfigError
from tierfeed.format.codecs import IMAGE_FORMATS, decode_field, field_ext
from tierfeed.storage.store import Sample

__all__ = ["DECODERS", "collate_fields", "decoded_fields", "decoder", "sample_fields"]

DECODERS = ("fields", "auto", "pil", "torch")

_collate: Callable[[list[Any]], Any] = default_collate  # (torch's is untyped)


def sample_fields(sample: Sample) -> dict[str, Any]:
    """``{"__key__": key, "__label__": label (-1 when unlabelled), ext: bytes, ...}``."""
    return {"__key__": sample.key, "__label__": sample.label, **sample.fields}


def decoded_fields(sample: Sample, images: str = "pil") -> dict[str, Any]:
    """`sample_fields` with each field decoded by its extension; ``images``: ``pil`` (PIL
    images) or ``torch`` (uint8 CHW tensors, and numpy arrays as tensors)."""
    out: dict[str, Any] = {"__key__": sample.key, "__label__": sample.label}
    for name, data in sample.fields.items():
        value = decode_field(name, data, "pil")
        if images == "torch":
            if field_ext(name) in IMAGE_FORMATS:
                array = np.asarray(value)
                array = array[:, :, None] if array.ndim == 2 else array
                value = torch.from_numpy(array.copy()).permute(2, 0, 1)
            elif isinstance(value, np.ndarray):
                value = torch.from_numpy(value)
        out[name] = value
    return out


def decoder(name: str) -> Callable[[Sample], Any]:
    """The decode a `Dataset` takes by name (`DECODERS`); picklable for spawned workers."""
    if name == "fields":
        return sample_fields
    if name in ("auto", "pil"):
        return functools.partial(decoded_fields, images="pil")
    if name == "torch":
        return functools.partial(decoded_fields, images="torch")
    raise ConfigError(
        f"decode={name!r} is not one of {', '.join(map(repr, DECODERS))} or a function"
    )


def collate_fields(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch of `sample_fields` dicts as one dict: a field whose values are all numbers, or
    all tensors or numpy arrays of one shape, stacked by torch's default collate (labels
    become a tensor); any other field (bytes, text, JSON values, PIL images, arrays of
    several shapes) a list, holding ``None`` for the samples without it."""
    names = dict.fromkeys(name for sample in batch for name in sample)  # first-seen order
    out: dict[str, Any] = {}
    for name in names:
        values = [sample.get(name) for sample in batch]
        out[name] = _collate(values) if _stackable(values) else values
    return out


def _stackable(values: list[Any]) -> bool:
    if all(isinstance(v, (int, float)) for v in values):  # (bool is an int)
        return True
    if all(isinstance(v, (torch.Tensor, np.ndarray)) for v in values):
        shapes = {(tuple(v.shape), str(v.dtype)) for v in values}
        return len(shapes) == 1 and all(
            not isinstance(v, np.ndarray) or v.dtype.kind in "biuf" for v in values
        )
    return False
