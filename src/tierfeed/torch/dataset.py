"""`tierfeed.torch.Dataset`: a PyTorch IterableDataset that holds a feed (`tierfeed.loader.feed`).

Batches are built in the DataLoader workers from the plan, behind the deadline guard; this
module adds only what is PyTorch's: the worker a process is (`get_worker_info`), the default
collate, and the rank from torch.distributed. The Dataset holds its `Feed` rather than being
one, so a user's class shows what a user calls; tierfeed's own code reaches the feed through
`feed_of`, and a `Loader` reads a `loader_view` of it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import numbers
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import numpy as np
import numpy.typing as npt
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from tierfeed.config import worker_heap_wanted, world_for, world_from_env
from tierfeed.errors import ConfigError, MisuseError
from tierfeed.format.index import Index
from tierfeed.loader import DeadlineOptions, PrefetchOptions
from tierfeed.loader.compose import StoreOpener, TierConfig, plan_for, select_samples
from tierfeed.loader.decode import SkipFailures
from tierfeed.loader.feed import Batch, EpochExchange, Feed, FeedConfig, OrderPlan
from tierfeed.loader.location import StoreLocation
from tierfeed.loader.processstore import ProcessStore
from tierfeed.loader.statecheck import SEED_LIMIT
from tierfeed.plan import PlanSpec
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.store import Sample, Store
from tierfeed.torch.fields import collate_fields, decoded_fields, decoder, sample_fields
from tierfeed.torch.handover import BY_VALUE_BYTES, ship
from tierfeed.torch.misuse import BATCHED_AGAIN, NOT_MAP_STYLE, batched_again
from tierfeed.torch.workerheap import keep_worker_heap
from tierfeed.world import World

__all__ = [
    "Batch",
    "Dataset",
    "EpochExchange",
    "OrderPlan",
    "TierConfig",
    "feed_of",
    "loader_view",
    "plan_for",
]

_D = TypeVar("_D", bound="Dataset")
_Where = str | os.PathLike[str] | StoreLocation


class Dataset(IterableDataset[Batch]):
    """Yields collated batches of decoded samples in the plan's order (guard permitting).

    Args:
        store: a store directory or URL (``s3://bucket/ds``); or tar shards where they lie
            (a list of ``.tar`` paths, a brace pattern ``"shards/s-{000000..000099}.tar"``,
            gzipped ones too), indexed once into the user's cache and reused while unchanged
            (`tierfeed.loader.shardstore`); or a function returning a ChunkSource-backed
            Store for this process (e.g. over a tier stack).
        plan: the sampling plan: a `PlanSpec`, its text (``"global"``, ``"local"``,
            ``"partial:0.1"``, ``"global,chunkwise:8"``, ``"sequential"``: the store's order,
            unshuffled, for evaluation) or any object with ``order()``.
        batch_size: samples per batch.
        decode: Sample -> what the batch holds per sample (e.g. (tensor, label)). A `Sample`
            has ``key``, ``label`` (-1 when unlabelled) and ``fields``, the bytes of its files
            by extension (``{"jpg": b"..."}``). By default `sample_fields`: a dict
            ``{"__key__": ..., "__label__": ..., "jpg": b"...", ...}``; ``"auto"`` (or
            ``"pil"``) decodes each field by its extension (json, txt, cls, npy, pt, images as
            PIL images), ``"torch"`` too with images as uint8 CHW tensors. An exception it
            raises reaches the caller as `tierfeed.loader.DecodeError` (a ValueError and an
            OSError too), naming the sample key and chunk, the original chained.
        collate: list of decoded samples -> batch: torch's default_collate, or with the
            default decode or one by name `collate_fields` (a dict; labels a tensor; a field
            collated where torch's default collate can, else a list; None for the samples
            that lack it).
        drop_last: drop the rank's last batch of an epoch if it is short (as DataLoader's
            drop_last; its samples are not read). Workers are dealt whole batches, so at most
            one batch per epoch is short, whatever the number of workers.
        prefetch: read-ahead window per worker.
        deadline: the deadline guard (on, adaptive, by default).
        world: rank and world size; from torch.distributed or torchrun's environment if None.
        tiers: cache tiers (RAM, local disk) between the store and the readers.
        hedge_source: a second ChunkSource to hedge late reads against (e.g. the origin);
            when hedging is on and none is given, late reads are re-issued on the store's
            own chunk files with O_DIRECT (bypassing the pages the first read holds).
        exchange: the rank's sample exchange, paced by the Loader (`tierfeed.distributed`).
        storage_options: for a store given by URL (``s3://bucket/ds``), what its fsspec file
            system takes (credentials, ``client_kwargs={"endpoint_url": ...}``); by default
            the environment's (``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...).
        samples: read only these of the store's samples: sample ids (each once, any order) or
            a boolean mask with an entry per sample; by default all of them. The plan, the
            loader's state and the caches then work on the selection: an epoch reads each
            selected sample once and no other (`ImageFolder(store).sample_ids` selects what
            torchvision would from a tree with stray files, e.g. a ``README`` or
            ``.DS_Store``). Needs ``plan`` as a spec; not with an ``exchange``.
        cache_dir: a local-disk tier here, of the default size (the whole store, or the free
            space less a margin): ``tiers=TierConfig(disk_dir=cache_dir)`` in short, as
            MosaicML Streaming's ``local=``.
        seed: the seed of the plan's shuffles (by default the spec's own, 0 for a plan given
            as text): the same seed, epoch, rank and world give the same planned order on any
            machine. The delivered order is exactly that plan with the guard's deferral off
            (``deadline=DeadlineOptions(enabled=False)``; prefetch and hedges stay on); with
            it on (the default) a late read is delivered after ready ones, so the order
            depends on the storage's timing.
        on_error: what a sample whose decode fails does: ``"raise"`` (the default) ends the
            epoch with a `DecodeError` naming it; ``"skip"`` leaves it out of its batch (which
            is then short by one) and goes on, as WebDataset's ``handler=warn_and_continue``
            does: a Loader counts the skipped samples and lists their keys in the epoch's
            record (``loader.last_epoch["skipped"]``, the ``run_file``) and warns once an
            epoch. Every other sample is still delivered once; a read that fails (a damaged
            chunk, a stuck read) still raises.

    Raises:
        ConfigError: ``samples`` names ids outside the store, one twice, or none, or is a
            mask of another length; $TIERFEED_WORKER_HEAP is neither 0 nor 1.

    In its DataLoader workers (never in the training process) freed heap memory is kept for
    the next batch (`tierfeed.torch.workerheap`; ``TIERFEED_WORKER_HEAP=0`` leaves malloc
    as it is).
    """

    def __init__(
        self,
        store: _Where | Sequence[str | os.PathLike[str]] | Callable[[], Store],
        plan: OrderPlan | PlanSpec | str = "global",
        batch_size: int = 32,
        decode: Callable[[Sample], Any] | str = sample_fields,
        collate: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        prefetch: PrefetchOptions | None = None,
        deadline: DeadlineOptions | None = None,
        world: World | None = None,
        hedge_source: Callable[[], ChunkSource] | None = None,
        tiers: TierConfig | None = None,
        exchange: EpochExchange | None = None,
        storage_options: Mapping[str, Any] | None = None,
        samples: npt.ArrayLike | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        on_error: str = "raise",
    ) -> None:
        if samples is not None and not isinstance(plan, (str, PlanSpec)):
            raise ConfigError("samples= selects what a plan spec plans: give plan as its text")
        if samples is not None and exchange is not None:
            raise ConfigError("samples= cannot be combined with an exchange between ranks")
        tiers = _tiers(tiers, cache_dir)
        worker_heap_wanted()  # a bad $TIERFEED_WORKER_HEAP is named here, not in each worker
        opener = (
            store
            if callable(store)
            else StoreOpener(StoreLocation.of(store, storage_options), tiers)
        )
        decode = decoder(decode) if isinstance(decode, str) else decode
        config = FeedConfig(
            batch_size=batch_size,
            decode=_on_error(decode, on_error),
            collate=collate or _default_collate(decode),
            world=world or _world(),
            drop_last=drop_last,
            prefetch=prefetch or PrefetchOptions(),
            deadline=deadline or DeadlineOptions(),
            hedge_source=hedge_source,
            exchange=exchange,
        )
        process, index = _opened(opener, tiers)
        order, selected = _planned(_seeded(plan, seed), samples, process, index)
        self._feed = Feed(process, order, config, selected)
        # A Loader's view sends each batch as a `Batch`, tensors of at most so many bytes
        # inside the pickle (`loader_view`); alone, the Dataset yields the data itself.
        self._by_value_bytes = 0
        self._wrapped = False

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return self._feed.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether the rank's last batch of an epoch is dropped when short."""
        return self._feed.drop_last

    @property
    def world(self) -> World:
        """The rank and world size it reads for."""
        return self._feed.world

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._feed.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads (as DistributedSampler.set_epoch); worker
        processes that outlive an epoch see it too.

        Raises:
            ConfigError: not a whole number, or one too large for the plan's epochs.
        """
        self._feed.set_epoch(epoch)

    def store(self) -> Store:
        """This process's store, opened on first use (each worker opens its own): its
        ``index``, or what `DeviceJpegDecoder` takes (``store=ds.store``) to name a chunk."""
        return self._feed.store()

    def close(self) -> None:
        """Stop this process's reads and close its store (a `Loader` closes its dataset)."""
        self._feed.close()

    def __len__(self) -> int:
        """Batches this rank delivers in a whole epoch (what a plain ``DataLoader(ds,
        batch_size=None)`` yields in one); `Loader` is the face that resumes and reports."""
        return self._feed.num_batches()

    def __getitem__(self, index: Any) -> NoReturn:
        raise TypeError(NOT_MAP_STYLE)

    def __iter__(self) -> Iterator[Any]:
        if not self._wrapped and batched_again():
            raise MisuseError(BATCHED_AGAIN)
        info = get_worker_info()
        if info is None:
            batches = self._feed.iterate(0, 1, in_worker=False)
        else:
            freeze_inherited()
            keep_worker_heap()
            batches = self._feed.iterate(info.id, info.num_workers, in_worker=True)
            if self._by_value_bytes:
                batches = _shipped(batches, self._by_value_bytes)
        if self._wrapped:
            return batches
        return (batch.data for batch in batches if batch.data is not None)  # None: all skipped


def feed_of(dataset: Dataset) -> Feed:
    """The feed ``dataset`` holds: tierfeed's one way to it (the `Loader`, its state, tests),
    so that the plan, the resume and the workers' slices stay off the user's class."""
    return dataset._feed


def loader_view(dataset: _D, feed: Feed, by_value_bytes: int = BY_VALUE_BYTES) -> _D:
    """``dataset`` as a `Loader`'s DataLoader reads it, over ``feed`` (its own feed's
    `Feed.for_loader`: the resume and replay, the epochs read on): each batch a `Batch` (the
    data with the worker's place in the plan and its counters), which the Loader unwraps; a
    worker sends tensors of at most ``by_value_bytes`` bytes inside the pickle, not through
    shared memory (0: torch's way for all). A copy of ``dataset``, its class and attributes
    kept; ``dataset`` is left as it is."""
    view = copy.copy(dataset)
    view._feed, view._by_value_bytes, view._wrapped = feed, by_value_bytes, True
    return view


def _on_error(decode: Callable[[Sample], Any], on_error: str) -> Callable[[Sample], Any]:
    """``decode`` as ``on_error`` asks: its failures raised, or the samples skipped."""
    if on_error == "raise":
        return decode
    if on_error == "skip":
        return SkipFailures(decode)
    raise ConfigError(f"Dataset(on_error={on_error!r}): give 'raise' (the default) or 'skip'")


_frozen_in: int | None = None  # the process that froze what it inherited


def freeze_inherited() -> None:
    """In a DataLoader worker, once: put every object it inherited from its parent (torch, the
    model, the training script's state) out of the cyclic garbage collector's reach
    (`gc.freeze`). A full collection walks every tracked object while holding the GIL: with
    torch loaded that is tens of milliseconds (docs/BENCHMARKS.md), in which none of the
    worker's reader and fetch threads can issue a request; it fell at the start of the first
    epoch, where the cold epoch's first pieces wait for it. Frozen, a collection walks only
    what the worker made. Garbage cycles the parent left behind are not collected in the
    worker (they were the parent's), and the collector no longer writes to the inherited
    objects' pages, which fork shares. A `Loader` freezes them already for the fork
    (`tierfeed.torch.workers.start_workers`), before the worker's own start-up allocates;
    this covers a Dataset handed to a plain DataLoader."""
    global _frozen_in
    if _frozen_in != os.getpid():
        gc.freeze()
        _frozen_in = os.getpid()


def _shipped(batches: Iterator[Batch], limit: int) -> Iterator[Batch]:
    """A worker's batches, their small tensors sent by value (`tierfeed.torch.handover`)."""
    for batch in batches:
        batch.data = ship(batch.data, limit)
        yield batch


def _tiers(tiers: TierConfig | None, cache_dir: str | os.PathLike[str] | None) -> TierConfig | None:
    """The tiers given, or a disk tier in ``cache_dir`` (one of them at most)."""
    if cache_dir is None:
        return tiers
    if tiers is not None:
        raise ConfigError(
            "cache_dir= is TierConfig(disk_dir=...) in short: give one of cache_dir "
            "and tiers (TierConfig(disk_dir=cache_dir, ...) for more)"
        )
    return TierConfig(disk_dir=os.fspath(cache_dir))


def _default_collate(decode: Callable[[Sample], Any]) -> Callable[[list[Any]], Any]:
    """`collate_fields` for the default decode or one by name (dicts), else torch's."""
    by_name = isinstance(decode, functools.partial) and decode.func is decoded_fields
    return collate_fields if decode is sample_fields or by_name else default_collate


def _opened(
    opener: Callable[[], Store], tiers: TierConfig | None
) -> tuple[ProcessStore, Index | None]:
    """The store each process opens; by path with tiers, sized to the store, and the index
    read to size them (so that planning does not read it again)."""
    if not (isinstance(opener, StoreOpener) and tiers is not None):
        return ProcessStore(opener), None
    index, origin = opener.index_and_origin()  # the driver kept for `ColdStart`
    # Decided here, in the main process, so that every worker has the same quota; the disk
    # tier's directory was checked as the index was found (`index_cache`).
    # Exactly the store: a tier with room for all of it places without the host's lock
    # (`Holdings.host_lock`), which a mean times a count rounded a byte short would lose.
    opener = dataclasses.replace(opener, tiers=tiers.sized(index.chunks().total_size()))
    return ProcessStore(opener, index, origin), index


def _seeded(plan: OrderPlan | PlanSpec | str, seed: int | None) -> OrderPlan | PlanSpec | str:
    """``plan`` with ``seed`` (None: its own)."""
    if seed is None:
        return plan
    if (
        isinstance(seed, bool)
        or not isinstance(seed, numbers.Integral)
        or not 0 <= seed < SEED_LIMIT
    ):
        raise ConfigError(f"Dataset(seed={seed!r}): takes a whole number from 0 to 2**128 - 1")
    seed = int(seed)
    if isinstance(plan, str):
        return PlanSpec.parse(plan, seed=seed)
    if isinstance(plan, PlanSpec):
        return dataclasses.replace(plan, seed=seed)
    raise ConfigError("seed= seeds a plan spec: give plan as its text, or seed your own plan")


def _planned(
    plan: OrderPlan | PlanSpec | str,
    samples: npt.ArrayLike | None,
    process: ProcessStore,
    index: Index | None,
) -> tuple[OrderPlan, npt.NDArray[np.int64] | None]:
    """The plan, made from the store's index when given as a spec, and the samples it
    selects (sorted ids; None: all of them)."""
    if not isinstance(plan, (str, PlanSpec)):
        return plan, None
    index = process.plan_index() if index is None else index
    selected = None if samples is None else select_samples(index, samples)
    return plan_for(index, plan, selected), selected


def _world() -> World:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return world_for(dist.get_rank(), dist.get_world_size())
    return world_from_env()
