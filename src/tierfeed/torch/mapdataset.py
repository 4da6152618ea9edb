"""`MapDataset`: a store as a map-style dataset, ``ds[i]`` one sample, for code written around
indices and samplers (``DataLoader(ds, batch_size=..., shuffle=True)``).

It reads one sample per call, through the store's tiers if given, each read checked against the
member's checksum, and opens the store lazily in each process (DataLoader workers, fork or
spawn, get their own descriptors). It has none of `Dataset`'s fast path: no read-ahead on a
plan, no deadline guard, no whole-chunk copies ahead of the reads, no exact resume; prefer
`Dataset` to train from slow storage, and this where code needs ``len`` and ``ds[i]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset as TorchDataset

from tierfeed.loader.compose import TierConfig, open_store, select_samples
from tierfeed.loader.decode import decode_read
from tierfeed.loader.location import StoreLocation
from tierfeed.storage.store import Sample, Store
from tierfeed.torch.fields import decoder, sample_fields

__all__ = ["MapDataset"]


class MapDataset(TorchDataset[Any]):
    """``ds[i]``: ``decode`` of the ``i``-th sample of the store (or of the selection).

    Args:
        store: a store directory or URL (``s3://bucket/ds``).
        decode: Sample -> item, or a decode by name (``"fields"``, ``"auto"``, ``"pil"``,
            ``"torch"``, as `Dataset` takes them); by default `sample_fields`, a dict
            ``{"__key__": ..., "__label__": ..., "jpg": b"...", ...}``. Its errors reach the
            caller as `DecodeError`, naming the sample and its chunk.
        samples: the store's samples it holds (ids or a boolean mask, as `Dataset` takes
            them; ``ImageFolder(store).sample_ids`` leaves stray files out); all by default.
        tiers: cache tiers between the store and the reads (a RAM or local-disk tier).
        storage_options: for a URL, what its fsspec file system takes.

    Raises:
        ConfigError: a bad selection or decode name; IndexFormatError: no store there.
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        decode: Callable[[Sample], Any] | str = sample_fields,
        samples: npt.ArrayLike | None = None,
        tiers: TierConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._location = StoreLocation.of(store, storage_options)
        self.decode = decoder(decode) if isinstance(decode, str) else decode
        self.tiers = tiers
        self._store: Store | None = None
        self._pid = -1
        opened = self._open()  # a missing store or a bad selection fails here, at once
        ids = np.arange(len(opened), dtype=np.int64)
        self.ids: npt.NDArray[np.int64] = (
            ids if samples is None else select_samples(opened.index, samples)
        )

    def _open(self) -> Store:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self._location, self.tiers, lazy=True)
            self._pid = os.getpid()
        return self._store

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> Any:
        sample = int(self.ids[index])  # (an IndexError past the end, as a list gives)
        store = self._open()
        return decode_read(self.decode, store, sample, store.read_sample(sample))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"], state["_pid"] = None, -1  # descriptors do not cross processes
        return state
