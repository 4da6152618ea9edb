"""The feed: a rank's plan cut into whole batches, a worker's slice read through the guard,
and batches assembled in the worker (no torch: `tierfeed.torch.Dataset` adapts it to
DataLoader).

The rank's epoch order is cut into batches and workers are dealt whole batches in turn
(`tierfeed.loader.batching`), as DataLoader's batch sampler does: only the rank's last batch
can be short. Each worker reads its batches' samples through a `GuardedStream` (read-ahead,
deferral, hedging) and assembles the batches itself, so one transfer carries a batch rather
than a sample. Every batch carries the worker's stream position; `tierfeed.loader.resume` turns
those into the rank's progress, which is what makes a resume exact with any number of workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError, StorageError
from tierfeed.format.index import Index
from tierfeed.loader.batching import batch_count, worker_slice
from tierfeed.loader.compose import StoreOpener
from tierfeed.loader.decode import decode_read, decode_sample, describe_sample
from tierfeed.loader.latency import DeadlineOptions
from tierfeed.loader.location import StoreLocation
from tierfeed.loader.readers import Readers
from tierfeed.loader.resume import Resume, StoreId, run_positions
from tierfeed.loader.stream import GuardedStream, PrefetchOptions
from tierfeed.plan import Plan, remaining_order
from tierfeed.storage import DirectoryChunks
from tierfeed.storage.source import ChunkSource
from tierfeed.storage.store import Sample, Store
from tierfeed.world import World

__all__ = ["Batch", "EpochExchange", "Feed", "OrderPlan"]


class OrderPlan(Protocol):
    """What the feed needs of a sampling plan: a rank's sample order for an epoch."""

    def order(self, epoch: int, rank: int, world_size: int) -> npt.NDArray[np.int64]:
        """Sample ids rank ``rank`` reads in ``epoch``, in order (`tierfeed.plan.Plan` does)."""
        ...


class EpochExchange(Protocol):
    """What paces a sample exchange between ranks (`tierfeed.distributed.Exchanger` does):
    the Loader reports how far the epoch has been read."""

    def begin_epoch(self, epoch: int, start: int = 0, margin: int = 0) -> None:
        """The epoch starts; ``start`` positions were read before a resume; readers run up
        to ``margin`` positions ahead of what is reported consumed."""
        ...

    def consumed(self, epoch: int, positions: int) -> None:
        """``positions`` of the rank's order have been delivered."""
        ...

    def end_epoch(self, epoch: int) -> None:
        """The epoch has been read."""
        ...


@dataclass
class Batch:
    """A collated batch and where the worker that built it stands in its slice of the plan."""

    data: Any
    worker: int
    epoch: int
    state: dict[str, Any]
    counters: dict[str, float]
    tiers: dict[str, dict[str, Any]] | None = None
    last: bool = False  # the worker's last batch of the epoch


_EPOCHS_AHEAD = 2  # epochs of future reads given to clairvoyant tiers
_DRAIN_S = 30.0  # how long an exiting worker waits for its queued copies


class Feed:
    """Reads a rank's plan as batches, in whatever process iterates it (see `torch.Dataset`
    for the arguments; ``store`` is a `StoreOpener` or any function returning a Store)."""

    def __init__(
        self,
        opener: Callable[[], Store],
        plan: OrderPlan,
        batch_size: int,
        decode: Callable[[Sample], Any],
        collate: Callable[[list[Any]], Any],
        drop_last: bool,
        prefetch: PrefetchOptions | None,
        deadline: DeadlineOptions | None,
        world: World,
        hedge_source: Callable[[], ChunkSource] | None = None,
        exchange: EpochExchange | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self._opener = opener
        self.plan = plan
        self.batch_size, self.decode, self.collate = batch_size, decode, collate
        self.drop_last = drop_last
        self.prefetch = prefetch or PrefetchOptions()
        self.deadline = deadline or DeadlineOptions()
        self.world = world
        self.hedge_source = hedge_source
        self.exchange = exchange
        # The store's sample ids the plan's positions name (sorted), when it plans a selection,
        # and what a loader state records of them (`tierfeed.loader.compose.selection_id`).
        self.samples: npt.NDArray[np.int64] | None = None
        self.selection: str | None = None
        self._store_id: StoreId | None = None
        self._store: Store | None = None
        self._pid = -1
        # The epoch lives in shared memory: persistent DataLoader workers see set_epoch().
        self._epoch = multiprocessing.get_context("fork").RawValue(ctypes.c_int64, 0)
        self.resume: Resume | None = None  # where the next iteration starts (set by Loader)
        self.read_across_epochs = False  # set by Loader: its iteration outlives an epoch
        self._readers: Readers | None = None  # this process's reader threads

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads (as DistributedSampler.set_epoch); worker
        processes that outlive an epoch see it too."""
        self._epoch.value = epoch

    def store(self) -> Store:
        """This process's store (opened lazily; workers open their own)."""
        if self._store is None or self._pid != os.getpid():
            self._store = self._opener()
            self._pid = os.getpid()
        return self._store

    def plan_index(self) -> Index:
        """The index to plan from: by path, the index alone (no tier stack, no copy threads
        in a process that forks workers next); otherwise this process's store's."""
        if isinstance(self._opener, StoreOpener):
            return self._opener.index()
        return self.store().index

    def store_id(self) -> StoreId:
        """What a loader state records of the store it reads (`StoreId`), so that a state is
        never resumed on another store: taken from the index's header once, O(1)."""
        if self._store_id is None:
            where = (
                StoreLocation.of(self._opener.path).text
                if isinstance(self._opener, StoreOpener)
                else None
            )
            self._store_id = StoreId.of(self.plan_index(), where)
        return self._store_id

    def _resume_for(self, epoch: int) -> Resume | None:
        resume = self.resume
        return resume if resume is not None and resume.epoch == epoch else None

    def rank_order(self, epoch: int | None = None) -> npt.NDArray[np.int64]:
        """The rank's sample ids for ``epoch`` (the current one by default), in order; after a
        restart with another world size, this rank's share of what the epoch had left."""
        epoch = self.epoch if epoch is None else epoch
        rank, size = self.world.rank, self.world.world_size
        resume = self._resume_for(epoch)
        if resume is not None and resume.progress.segments:
            if not isinstance(self.plan, Plan):
                raise ConfigError("resuming in another world size needs a tierfeed Plan")
            order = remaining_order(self.plan, epoch, rank, size, resume.progress)
        else:
            order = np.asarray(self.plan.order(epoch, rank, size), dtype=np.int64)
        return order if self.samples is None else self.samples[order]

    def worker_order(
        self,
        worker: int,
        num_workers: int,
        epoch: int | None = None,
        rank_order: npt.NDArray[np.int64] | None = None,
    ) -> npt.NDArray[np.int64]:
        """The samples one worker reads: of the rank's order cut into batches (after a resume,
        of what it has left), batches ``worker``, ``worker + num_workers``, ...
        ``rank_order``: `rank_order(epoch)`, where the caller has it already."""
        epoch = self.epoch if epoch is None else epoch
        order = self.rank_order(epoch) if rank_order is None else rank_order
        resume = self._resume_for(epoch)
        run = run_positions(
            len(order), self.batch_size, self.drop_last, None if resume is None else resume.done
        )
        return order[worker_slice(run, self.batch_size, worker, num_workers, False)]

    def num_batches(self, epoch: int | None = None) -> int:
        """Batches the rank delivers in a whole epoch: ``ceil(n / batch_size)`` of its ``n``
        samples, ``floor`` with drop_last (any number of workers, guard or not)."""
        return batch_count(len(self.rank_order(epoch)), self.batch_size, self.drop_last)

    @property
    def continuous(self) -> bool:
        """Whether an iteration runs on into the following epochs (a Loader's, without a
        sample exchange): each worker reads the next epoch's slice as it finishes this one, so
        an epoch's first batch is ready when it is asked for. Every worker marks its last
        batch of an epoch (``Batch.last``) and the Loader sorts batches by ``Batch.epoch``."""
        return self.read_across_epochs and self.exchange is None

    def iterate(self, worker: int, num_workers: int, in_worker: bool) -> Iterator[Batch]:
        """The batches ``worker`` of ``num_workers`` builds, from the current epoch on (only
        it when not continuous). ``in_worker``: this runs in a worker process of its own."""
        epoch = self.epoch
        stream = self._stream(epoch, worker, num_workers)
        if in_worker:
            self.resume = None  # applied once: a persistent worker's next epochs start fresh
        following: GuardedStream[Any] | None = None
        try:
            while True:
                for batch in self._batches(stream, worker, epoch):
                    if batch.last and self.continuous and not in_worker:
                        # In this process nothing asks for the next batch before the next
                        # epoch: start its reads before handing over this epoch's last batch.
                        following = self._stream(epoch + 1, worker, num_workers)
                        following.start()
                    yield batch
                stream.close()
                if not self.continuous:
                    break
                if following is None:
                    # A worker: the DataLoader keeps asking ahead, so this runs as soon as the
                    # last batch is sent, off the path of any batch.
                    following = self._stream(epoch + 1, worker, num_workers)
                stream, following, epoch = following, None, epoch + 1
        finally:
            stream.close()
            if following is not None:
                following.close()
        if not self.read_across_epochs and in_worker:
            # The worker process ends with its epoch: let its copies reach the disk tier.
            with contextlib.suppress(StorageError):
                self.store().source.drain(timeout=_DRAIN_S)

    def _stream(self, epoch: int, worker: int, num_workers: int) -> GuardedStream[Any]:
        """This worker's guarded read stream over its slice of ``epoch``."""
        store = self.store()
        rank = self.rank_order(epoch)
        order = self.worker_order(worker, num_workers, epoch, rank)
        source = store.source
        # An index checked on use checks the rows this worker touches this epoch, once: its
        # own, or the rank's (which hold its own) where its copies are told the rank's reads.
        store.index.check_samples(rank if source.uses_future else order)
        # This worker's samples alone: nothing O(dataset) per epoch.
        nbytes = store.index.sample_bytes(order, rows_checked=True)
        sizes = dict(zip(order.tolist(), nbytes.tolist(), strict=True))
        readers = self._process_readers()
        hedge = readers.hedge_reader(lambda: self._hedge_reader(store))
        source.begin_epoch()  # e.g. a namespace source loads the samples peers moved here
        # The chunks this worker will read, in order of first use: open them ahead so a
        # stalled lookup or open is paid off the read path.
        chunk_of = np.asarray(store.index.sample_chunk)
        slice_chunks = chunk_of[order]
        _, first = np.unique(slice_chunks, return_index=True)
        source.open_ahead(slice_chunks[np.sort(first)].tolist())
        if source.uses_future:
            self._tell_future(source, store, rank, order, worker, num_workers, epoch)
        return GuardedStream(
            order,
            lambda i: decode_sample(self.decode, store, i),
            hedge=hedge,
            local=store.local,
            read_local=lambda ids: [
                decode_read(self.decode, store, i, data)
                # (the rows of ``order`` were checked above)
                for i, data in zip(ids, store.read_samples(ids, rows_checked=True), strict=True)
            ],
            size_of=sizes.__getitem__,
            describe=lambda i: describe_sample(store, i),
            prefetch=self.prefetch,
            deadline=self.deadline,
            pool=readers.pool,
            hedge_pool=readers.hedges,
        )

    def _tell_future(
        self,
        source: ChunkSource,
        store: Store,
        rank: npt.NDArray[np.int64],
        order: npt.NDArray[np.int64],
        worker: int,
        num_workers: int,
        epoch: int,
    ) -> None:
        """Clairvoyant tiers learn this worker's reads (``order``) for this epoch and the next
        ones: a copy made now also serves later epochs; and the rank's (``rank``) for this
        epoch, the order a copy fetches its pieces in."""
        chunk_of = np.asarray(store.index.sample_chunk)
        ahead = [order] + [
            self.worker_order(worker, num_workers, epoch + k) for k in range(1, _EPOCHS_AHEAD + 1)
        ]
        # The next epochs' rows (this epoch's, the rank's, were checked by _stream).
        store.index.check_samples(np.concatenate([np.zeros(0, dtype=np.int64), *ahead[1:]]))
        reads = np.concatenate([chunk_of[o] for o in ahead])
        # A read's share of its chunk (headers included): a copy costs ~samples-per-chunk
        # reads of it.
        footprint = float(store.index.chunk_size.sum()) / max(1, len(store.index))
        # The whole rank's order (every worker's batches, as the Loader hands them out): a
        # copy this worker makes serves the other workers' reads of the chunk too. Told
        # before the future, whose prefetch starts the first copies.
        source.set_reads(chunk_of[rank], *_byte_spans(store.index, rank))
        source.set_future(reads, read_bytes=footprint)

    def _process_readers(self) -> Readers:
        """This process's reader threads, kept across epochs: a read that storage holds for
        seconds finishes on its own thread instead of holding up the end of an epoch."""
        if self._readers is None or self._readers.pid != os.getpid():
            self._readers = Readers(self.prefetch.threads, self.decode)
        return self._readers

    def _hedge_reader(self, store: Store) -> Store | None:
        """A second way to the store's samples, for hedged reads (None: no hedging)."""
        if self.deadline.hedge_after_ms is None:
            return None
        if self.hedge_source is not None:
            source = self.hedge_source()
        elif store.second_source is not None:
            source = store.second_source()
        else:
            source = DirectoryChunks(store.root, store.chunks, store.index.path, direct=True)
        return Store(store.index, source)

    def close(self) -> None:
        """Stop this process's reads and close its store (a Loader does this for its own)."""
        if self._readers is not None and self._readers.pid == os.getpid():
            self._readers.close()
        self._readers = None
        if self._store is not None and self._pid == os.getpid():
            self._store.close()
        self._store = None

    def __getstate__(self) -> dict[str, Any]:
        # Threads and open stores belong to the process that made them.
        return {**self.__dict__, "_readers": None, "_store": None, "_pid": -1}

    def _batches(self, stream: GuardedStream[Any], worker: int, epoch: int) -> Iterator[Batch]:
        """The epoch's batches from one worker's stream, the last one marked; in a continuous
        iteration a worker whose slice yields no batch sends an empty one (``data`` None).

        The slice is whole batches of the rank's order (only the rank's last batch can be
        short, and with drop_last it is not in any slice), so cutting the stream every
        ``batch_size`` samples gives exactly the batches this worker was dealt. The guard may
        deliver a late sample in a later batch of this worker than its own; the number of
        batches does not change.
        """
        items: list[Any] = []
        started = time.perf_counter()
        sent = False
        for _, value in stream:
            items.append(value)
            left = stream.remaining
            if len(items) < self.batch_size and left > 0:
                continue
            yield self._batch(items, worker, epoch, stream, started, left == 0)
            sent = True
            items, started = [], time.perf_counter()
        if not sent and self.continuous:
            yield Batch(None, worker, epoch, stream.state().to_dict(), {}, None, last=True)

    def _batch(
        self,
        items: list[Any],
        worker: int,
        epoch: int,
        stream: GuardedStream[Any],
        started: float,
        last: bool,
    ) -> Batch:
        c = stream.counters
        counters = {
            "late": c.late,
            "deferred": c.deferred,
            "hedges": c.hedges,
            "hedge_wins": c.hedge_wins,
            "inline": c.inline,
            "assemble_s": time.perf_counter() - started,
        }
        tiers = self.store().source.stats() or None  # {}: a source without tiers
        state = stream.state().to_dict()
        return Batch(self.collate(items), worker, epoch, state, counters, tiers, last)


def _byte_spans(
    index: Index, samples: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where each sample's bytes lie in its chunk: from its first member's start to its last
    member's end (the members of a sample lie together; a hint either way), so that a copy
    fetches every piece a read of the sample needs, not only the piece it starts in."""
    start = index.sample_member_start
    first = np.asarray(start[samples], dtype=np.int64)
    last = np.asarray(start[samples + 1], dtype=np.int64) - 1

    def span(members: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], ...]:
        begin = np.asarray(index.member_offset[members], dtype=np.int64)
        return begin, begin + np.asarray(index.member_length[members], dtype=np.int64)

    (begin0, end0), (begin1, end1) = span(first), span(last)
    return np.minimum(begin0, begin1), np.maximum(end0, end1)
