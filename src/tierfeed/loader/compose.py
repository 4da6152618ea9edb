"""Opening a store with its tiers, and the plan of its samples: what every face composes.

`torch.Dataset`, `torch.ImageFolder`, `tierfeed mount`, stage-in and the distributed
namespace open stores here, so a store is read the same way (origin read-only, tiers in
front, members checked) whichever face reads it. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from tierfeed.cachedir import CacheFolder
from tierfeed.errors import ConfigError
from tierfeed.format.index import Index
from tierfeed.loader.location import StoreLocation
from tierfeed.loader.tierconfig import TierConfig, default_disk_bytes
from tierfeed.plan import DatasetShape, Plan, PlanSpec
from tierfeed.storage import (
    DirectoryChunks,
    Driver,
    PosixDriver,
    TierOptions,
    TierStack,
)
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.store import Store

__all__ = [
    "StoreOpener",
    "TierConfig",
    "default_disk_bytes",
    "open_store",
    "plan_for",
    "select_samples",
    "selection_id",
    "tier_stack",
]


def tier_stack(index: Index, tiers: TierConfig, origin: Driver | None = None) -> TierStack:
    """A tier stack over ``origin`` (read-only: e.g. a job's namespace, or a URL's driver), by
    default over the chunk files under the index's `chunk_root` (opened read-only).

    Raises:
        ConfigError: no ``origin`` for an index whose chunks lie under a URL it records.
    """
    if origin is None:
        if index.chunk_url is not None:
            raise ConfigError(
                f"{index.path}: its chunks lie under {index.chunk_url}; read them through "
                "that URL's driver (`StoreLocation.chunk_origin`)"
            )
        origin = PosixDriver(index.chunk_root, read_only=True)
    return TierStack(
        index.chunks(), origin, tiers.tiers(), tiers.policy, TierOptions(tiers.threads)
    )


def open_store(
    path: str | os.PathLike[str] | StoreLocation | Sequence[str | os.PathLike[str]],
    tiers: TierConfig | None = None,
    source: ChunkSource | None = None,
    storage_options: Mapping[str, Any] | None = None,
    lazy: bool = False,
) -> Store:
    """Open the store at ``path``: its directory, its index file, or a URL (``s3://bucket/ds``
    and the other fsspec protocols).

    A URL's index is fetched once per host into the local cache (beside the disk tier's
    chunks, else `tierfeed.config.default_cache_dir`) and mapped from there; chunk bytes are
    ranged reads of the objects, copied into the tiers as for a directory. A directory whose
    index records a URL chunk root (shards in a bucket its user cannot write:
    `tierfeed.format.chunkroot`) reads its chunks under that URL the same way.

    Args:
        path: the store; or tar shards by name (a list of paths, a brace pattern), indexed
            once into the user's cache (`tierfeed.loader.shardstore`).
        tiers: read it through these cache tiers (RAM, local disk); none by default.
        source: read chunk bytes from here instead (e.g. a job's namespace).
        storage_options: for a URL, what its fsspec file system takes (credentials,
            ``client_kwargs={"endpoint_url": ...}``); by default the environment's. For a
            directory whose index records a URL chunk root, that URL's.
        lazy: a large index this host has not checked is checked on use (`Index`): the
            store's reads check the rows they take. For readers of samples by id (the
            loader); a walk over every path (a mount) wants it checked in full.

    Raises:
        IndexFormatError: no index, another format version, or a damaged index.
        StorageError: a URL's store cannot be read (access denied, unreachable).
    """
    location = StoreLocation.of(path, storage_options)
    cache = tiers.index_cache() if tiers is not None else None
    if location.remote:
        return _open_remote(location, cache, tiers, source, lazy)
    index = location.open_index(cache, lazy=lazy)
    if source is not None:
        return Store(index, source)  # the caller's (a job's namespace): no second way known
    return _open_local(location, index, tiers)


def _open_local(location: StoreLocation, index: Index, tiers: TierConfig | None) -> Store:
    """A store in a directory (its ``index`` open): its chunk files, beside the index or in
    the shards' directory it records, read through ``tiers`` if given, else straight; or the
    shards under the URL it records, read as a store at a URL is."""
    if index.chunk_url is not None:
        try:
            origin = location.chunk_origin(index)
        except BaseException:
            index.close()
            raise
        return _store_at_url(location, index, origin, tiers, None)
    if tiers is not None:
        source: ChunkSource = tier_stack(index, tiers)
    else:
        source = DirectoryChunks(index.chunk_root, index.chunks(), index.path)
    return Store(index, source, second_source=second_way(location, index))


def second_way(location: StoreLocation, index: Index) -> Callable[[], ChunkSource]:
    """Makes a hedge's way to the chunks of the store at ``location`` (``index`` open): for
    chunks under a URL a driver of its own (a second ranged GET), else the chunk files read
    straight."""
    if location.remote or index.chunk_url is not None:
        return lambda: TierStack(index.chunks(), location.chunk_origin(index))
    root = index.chunk_root
    return lambda: DirectoryChunks(root, index.chunks(), index.path, direct=True)


def _open_remote(
    location: StoreLocation,
    cache: CacheFolder | None,
    tiers: TierConfig | None,
    source: ChunkSource | None,
    lazy: bool,
) -> Store:
    """A store at a URL: one driver (one client) checks the index and reads the chunks."""
    origin = location.origin()
    try:
        index = location.open_index(cache, origin, lazy=lazy)
    except BaseException:
        origin.close()
        raise
    return _store_at_url(location, index, origin, tiers, source)


def _store_at_url(
    location: StoreLocation,
    index: Index,
    origin: Driver,
    tiers: TierConfig | None,
    source: ChunkSource | None,
) -> Store:
    """A store whose chunks lie under a URL (its own, or the one its local index records),
    read through ``origin`` and the tiers, a store at a URL's (the defaults without
    ``tiers``); a hedged read gets a driver of its own (a second ranged GET). Errors name
    each chunk by its URL."""
    if source is None:
        source = tier_stack(index, tiers or TierConfig(), origin)
    else:
        origin.close()  # the chunks come from the caller's source
    where = location.chunks_at(index)
    return Store(index, source, location=where, second_source=second_way(location, index))


@dataclass(frozen=True)
class StoreOpener:
    """Opens a store by path or URL (through tiers if configured); picklable, so each process
    (DataLoader workers included) opens its own. Its index is checked on use (``lazy``): a
    rank reads and checks only its own rows of a large index."""

    path: Path | StoreLocation
    tiers: TierConfig | None = None
    lazy: bool = True

    def __call__(self) -> Store:
        return open_store(self.path, self.tiers, lazy=self.lazy)

    def index(self) -> Index:
        """The store's index alone: enough to plan, with no tier stack or copy threads."""
        return self.index_and_origin(keep=False)[0]

    def index_and_origin(self, keep: bool = True) -> tuple[Index, Driver | None]:
        """The store's index and, with ``keep``, for a URL the driver that fetched or checked
        it, for a directory whose index records a URL chunk root that URL's driver, open (its
        client made: the caller closes it); None for a directory of chunk files."""
        location = StoreLocation.of(self.path)
        cache = self.tiers.index_cache() if self.tiers else None
        if not (location.remote and keep):
            index = location.open_index(cache, lazy=self.lazy)
            if not keep or index.chunk_url is None:
                return index, None
            try:
                return index, location.chunk_origin(index)
            except BaseException:
                index.close()
                raise
        origin = location.origin()
        try:
            return location.open_index(cache, origin, lazy=self.lazy), origin
        except BaseException:
            origin.close()
            raise

    def copier_store(self, index: Index, origin: Driver | None = None) -> Store | None:
        """`copier_over` as a store (chunks named as this store's, a hedge's way to them), or
        None where it is."""
        stack = self.copier_over(index, origin)
        if stack is None:
            return None
        location = StoreLocation.of(self.path)
        where, second = location.chunks_at(index), second_way(location, index)
        return Store(index, stack, location=where, second_source=second)

    def copier_over(self, index: Index, origin: Driver | None = None) -> TierStack | None:
        """A tier stack over ``index`` (this store's, which the caller has open) that only
        copies: the disk tier the host's processes share, no RAM tier (it serves no read);
        for chunks at a URL through ``origin`` if given (the stack closes it), else a driver of
        its own (`StoreLocation.chunk_origin`). None where the tiers have no disk tier or do
        not follow the plan (`ColdStart`)."""
        tiers = self.tiers
        if tiers is None or tiers.disk_dir is None or tiers.policy != "clairvoyant":
            if origin is not None:
                origin.close()
            return None
        if origin is None:
            origin = StoreLocation.of(self.path).chunk_origin(index)
        return tier_stack(index, dataclasses.replace(tiers, ram_bytes=0), origin)


def plan_for(
    index: Index, spec: PlanSpec | str, samples: npt.NDArray[np.int64] | None = None
) -> Plan:
    """The plan of a store's samples under ``spec``; of the ``samples`` selected (sorted sample
    ids, `select_samples`) when given: its positions then index that selection."""
    if isinstance(spec, str):
        spec = PlanSpec.parse(spec)
    # Views of the index's mapped sections, not copies: a rank's plan reads its part of them.
    # The chunk order is not checked here (an index checked on use has not checked it): a
    # plan only uses it through `DatasetShape.chunk_starts`, a partition whatever it holds.
    # A selection in store order keeps the samples' chunk order.
    chunk, label = index.sample_chunk, index.sample_label
    if samples is not None:
        chunk, label = chunk[samples], label[samples]
    return Plan(DatasetShape(chunk, None, label, ordered=True), spec)


def select_samples(index: Index, samples: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The store's sample ids ``samples`` names, sorted: ids (each at most once, any order)
    or a boolean mask with one entry per sample of the store.

    Raises:
        ConfigError: not integers or booleans, a mask of another length, an id out of the
            store's range or named twice, or nothing selected.
    """
    n = index.num_samples
    array = np.asarray(samples)
    if array.dtype == np.bool_:
        if array.shape != (n,):
            raise ConfigError(
                f"samples= is a mask of {array.size} entries; the store has {n} samples"
            )
        ids = np.flatnonzero(array).astype(np.int64)
    elif array.size == 0 or np.issubdtype(array.dtype, np.integer):
        if array.ndim != 1:
            raise ConfigError(f"samples= must be one-dimensional, got shape {array.shape}")
        ids = np.sort(array.astype(np.int64))
        outside = ids[(ids < 0) | (ids >= n)]
        if len(outside):
            raise ConfigError(
                f"samples= names sample {int(outside[0])}; the store's ids are 0 to {n - 1}"
            )
        twice = ids[1:][ids[1:] == ids[:-1]]
        if len(twice):
            raise ConfigError(
                f"samples= names sample {int(twice[0])} more than once; an epoch reads each "
                "sample once"
            )
    else:
        raise ConfigError(
            f"samples= must be sample ids (integers) or a mask (booleans), got {array.dtype}"
        )
    if not len(ids):
        raise ConfigError("samples= selects no sample")
    return ids


def selection_id(samples: npt.NDArray[np.int64]) -> str:
    """What a loader state records of a selection (its size and a hash of its ids), so that a
    state saved reading one selection is never resumed reading another."""
    return f"{len(samples)}:{xxhash.xxh3_64_hexdigest(samples.astype('<i8').tobytes())}"
