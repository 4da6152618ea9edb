"""The mixes of tierfeed's datasets with `Loader` and torch's DataLoader that cannot work, found
where they are made, each with what to write instead (issue 46): before, they failed batches
later, inside, with an ``AttributeError`` or a collate error that named neither.

- ``Loader(ImageFolder(...))``, ``Loader(MapDataset(...))``: a map-style dataset has no plan to
  drive; torch's DataLoader reads it.
- ``Dataset(...)[i]``: `Dataset` is iterable; `MapDataset` answers ``ds[i]``.
- ``DataLoader(Dataset(...))`` with a ``batch_size`` of its own (1 by default): it would
  collate the Dataset's whole batches into batches of them.
"""

from __future__ import annotations

import sys

from torch.utils.data._utils.fetch import _IterableDatasetFetcher

__all__ = ["BATCHED_AGAIN", "NOT_MAP_STYLE", "batched_again", "not_a_dataset"]

NOT_MAP_STYLE = (
    "a tierfeed.torch.Dataset is iterable (it yields whole batches in its plan's order): "
    "iterate it, or Loader(ds); for ds[i], use tierfeed.torch.MapDataset(store)"
)
BATCHED_AGAIN = (
    "DataLoader(ds, batch_size=...) batches the batches a tierfeed.torch.Dataset yields (its "
    "batch_size is the Dataset's): write DataLoader(ds, batch_size=None, ...), or "
    "tierfeed.torch.Loader(ds, num_workers=...)"
)


def not_a_dataset(dataset: object) -> str:
    """What to write instead of ``Loader(dataset)`` for a ``dataset`` that is not a tierfeed
    `Dataset` (the Loader drives its plan, resume and guard; nothing else has them)."""
    kind = type(dataset).__name__
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return (
            f"Loader({kind}(...)): a {kind} is map-style (ds[i]); read it with torch's "
            f"DataLoader({kind}(...), batch_size=..., shuffle=True, num_workers=...), or give "
            "the Loader a tierfeed.torch.Dataset(store) for the fast path (plan, guard, resume)"
        )
    return f"Loader takes a tierfeed.torch.Dataset(store), not a {kind}"


def batched_again() -> bool:
    """Whether the caller of `Dataset.__iter__` (this function's caller) is a DataLoader's
    fetcher that batches what it yields (``batch_size`` not None): it would collate the
    Dataset's batches into batches of them, labels ``[1, 8]``, and fail batches later on a
    short one. torch makes the iterator in the fetcher's ``__init__``; under another torch,
    another caller: not judged."""
    caller = sys._getframe(2).f_locals.get("self")
    return isinstance(caller, _IterableDatasetFetcher) and bool(caller.auto_collation)
