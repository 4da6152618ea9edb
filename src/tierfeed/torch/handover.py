"""Small tensors cross from a DataLoader worker to the training loop inside the pickle.

torch hands every tensor a worker sends over through shared memory: a segment and a file
descriptor per tensor, passed over a socket and mapped again on the other side. For a batch
of a few small tensors (labels, lengths, indices, small crops) that is most of what a warm
batch costs, many times what their bytes in the pickle cost (`bench/handover_pickle.py`;
docs/BENCHMARKS.md, "Small tensors handed over by value"). So a worker of a
`tierfeed.torch.Loader` sends a CPU tensor of at most ``limit`` bytes by value (`ship`), and
the Loader makes it a tensor again without a copy (`restore`: the unpickled array's memory).
Larger tensors keep torch's shared memory, where not copying the bytes pays for the
descriptor.

Only plain containers are looked into (tuple, namedtuple, list, dict): what a collate
returns. A tensor inside anything else goes torch's way, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["BY_VALUE_BYTES", "accelerator_available", "map_leaves", "pin", "restore", "ship"]

BY_VALUE_BYTES = 64 * 1024  # tensors up to this size travel inside the pickle

# dtypes with a numpy twin (bfloat16 and the quantized ones have none).
_NUMPY = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)


class _ByValue:
    """A small tensor's values on their way to the training loop."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array


def _small(t: torch.Tensor, limit: int) -> bool:
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and t.dtype in _NUMPY
        and not t.requires_grad
        and not t.is_conj()
        and not t.is_neg()
        and t.numel() * t.element_size() <= limit
    )


def map_leaves(data: Any, leaf: Callable[[Any], Any]) -> Any:
    """``data`` with ``leaf`` applied to everything in it but the plain containers."""
    kind = type(data)
    if kind is tuple or (isinstance(data, tuple) and hasattr(data, "_fields")):
        items = [map_leaves(x, leaf) for x in data]
        return tuple(items) if kind is tuple else kind(*items)
    if kind is list:
        return [map_leaves(x, leaf) for x in data]
    if kind is dict:
        return {k: map_leaves(v, leaf) for k, v in data.items()}
    return leaf(data)


def ship(data: Any, limit: int = BY_VALUE_BYTES) -> Any:
    """``data`` with its small CPU tensors (at most ``limit`` bytes) made picklable by value."""

    def by_value(x: Any) -> Any:
        small = isinstance(x, torch.Tensor) and _small(x, limit)
        return _ByValue(x.numpy()) if small else x

    return map_leaves(data, by_value)


def restore(data: Any) -> Any:
    """What `ship` made of a batch, with its tensors again (sharing the arrays' memory)."""
    return map_leaves(data, lambda x: torch.from_numpy(x.array) if isinstance(x, _ByValue) else x)


def accelerator_available() -> bool:
    """Whether there is an accelerator to pin memory for (CUDA, or torch's accelerator)."""
    found = getattr(torch, "accelerator", None)
    if found is not None and hasattr(found, "is_available"):
        return bool(found.is_available())
    return bool(torch.cuda.is_available())


def pin(data: Any) -> Any:
    """``data`` with its CPU tensors in page-locked memory (what DataLoader's ``pin_memory``
    gives), so that copies to the accelerator can run asynchronously."""

    def pinned(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "cpu" and not x.is_pinned():
            return x.pin_memory()
        return x

    return map_leaves(data, pinned)
