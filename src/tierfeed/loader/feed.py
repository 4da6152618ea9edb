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
import copy
import ctypes
import dataclasses
import multiprocessing
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError, StorageError
from tierfeed.format.index import Index
from tierfeed.loader.batching import batch_count, worker_slice
from tierfeed.loader.clairvoyance import EPOCHS_AHEAD, open_ahead, tell_future, tell_head
from tierfeed.loader.coldstart import ColdStart
from tierfeed.loader.compose import selection_id
from tierfeed.loader.decode import decode_read, decode_sample, describe_sample, without_skipped
from tierfeed.loader.feedconfig import EpochExchange, FeedConfig, OrderPlan
from tierfeed.loader.latency import DeadlineOptions
from tierfeed.loader.processstore import ProcessStore
from tierfeed.loader.readers import hedge_store
from tierfeed.loader.resume import Resume, StoreId, run_positions
from tierfeed.loader.statecheck import checked_epoch
from tierfeed.loader.stream import GuardedStream, PrefetchOptions, StreamState
from tierfeed.plan import Plan, remaining_order
from tierfeed.storage.store import Store
from tierfeed.world import World

__all__ = ["Batch", "EpochExchange", "Feed", "FeedConfig", "OrderPlan", "Replay"]

IntArray = npt.NDArray[np.int64]
# An epoch's order as a Loader recorded it: each worker's positions delivered out of turn, by
# delivery number (`GuardedStream.swaps`).
Replay = Mapping[int, Mapping[int, int]]
_F = TypeVar("_F", bound="Feed")


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
    swaps: tuple[tuple[int, int], ...] = ()  # its stream's since the last (`GuardedStream.swaps`)
    skipped: tuple[str, ...] = ()  # keys of its samples left out (`on_error="skip"`)
    size: int = 0  # samples in ``data``, as collated (0: not said; `batch_len` guesses)


_DRAIN_S = 30.0  # how long an exiting worker waits for its queued copies
HEAD_BATCHES = 1  # batches of each worker read at once as exact ranges (`tell_head`)


class Feed:
    """Reads a rank's plan as batches, in whatever process iterates it.

    Args:
        store: returns this process's Store (a `StoreOpener`, by path), or the `ProcessStore`
            that opens it.
        plan: the rank's sample order of each epoch.
        config: how it reads (`FeedConfig`; `tierfeed.torch.Dataset` says what each means).
        samples: the store's sample ids the plan's positions name (sorted), when the plan
            plans a selection of them (`tierfeed.loader.compose.select_samples`).
        resume: where its first iteration starts (a Loader's view: `for_loader`).
    """

    def __init__(
        self,
        store: Callable[[], Store] | ProcessStore,
        plan: OrderPlan,
        config: FeedConfig,
        samples: IntArray | None = None,
        resume: Resume | None = None,
    ) -> None:
        self._process = store if isinstance(store, ProcessStore) else ProcessStore(store)
        self.plan = plan
        self.config = config
        self.samples = samples
        # What a loader state records of the selection (`tierfeed.loader.compose.selection_id`).
        self.selection = None if samples is None else selection_id(samples)
        # The epoch lives in shared memory: persistent DataLoader workers see set_epoch().
        self._epoch = multiprocessing.get_context("fork").RawValue(ctypes.c_int64, 0)
        self._resume = resume  # applied by the next iteration, once
        self._replay: Replay | None = None  # likewise: each worker's swaps to deliver
        self._opened = 0  # likewise: samples of worker 0's slice the Loader delivers itself

    def for_loader(self: _F, resume: Resume | None, replay: Replay | None = None) -> _F:
        """This feed as a `tierfeed.torch.Loader` reads it: its iteration runs on across epochs
        (``read_across_epochs``) and starts at ``resume``; its first epoch delivers the order
        ``replay`` recorded (each worker's `GuardedStream.swaps`), if given. The view shares
        this feed's plan, epoch, store and reader threads; this feed is left as it is."""
        view = copy.copy(self)
        view.config = dataclasses.replace(self.config, read_across_epochs=True)
        view._resume, view._replay = resume, replay
        return view

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return self.config.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether the rank's last batch of an epoch is dropped when short."""
        return self.config.drop_last

    @property
    def world(self) -> World:
        """The rank and world size it reads for."""
        return self.config.world

    @property
    def exchange(self) -> EpochExchange | None:
        """The rank's sample exchange, if any."""
        return self.config.exchange

    @property
    def prefetch(self) -> PrefetchOptions:
        """The read-ahead window per worker."""
        return self.config.prefetch

    @property
    def deadline(self) -> DeadlineOptions:
        """The deadline guard."""
        return self.config.deadline

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads (as DistributedSampler.set_epoch); worker
        processes that outlive an epoch see it too. ConfigError: not an int below
        `epoch_bound` (a larger one would wrap in the value the workers share)."""
        samples = self.plan.shape.num_samples if isinstance(self.plan, Plan) else 1
        self._epoch.value = checked_epoch(epoch, samples)

    def store(self) -> Store:
        """This process's store (opened lazily; workers open their own)."""
        return self._process.store()

    def plan_index(self) -> Index:
        """The index to plan from (`ProcessStore.plan_index`)."""
        return self._process.plan_index()

    def store_id(self) -> StoreId:
        """What a loader state records of the store it reads (`ProcessStore.store_id`)."""
        return self._process.store_id()

    def rank_order(
        self, epoch: int | None = None, resume: Resume | None = None
    ) -> npt.NDArray[np.int64]:
        """The rank's sample ids for ``epoch`` (the current one by default), in order; resumed
        (``resume``) after a restart with another world size, this rank's share of what the
        epoch had left."""
        epoch = self.epoch if epoch is None else epoch
        rank, size = self.world.rank, self.world.world_size
        resume = _of_epoch(resume, epoch)
        if resume is not None and resume.progress.segments:
            if not isinstance(self.plan, Plan):
                raise ConfigError("resuming in another world size needs a tierfeed Plan")
            order = remaining_order(self.plan, epoch, rank, size, resume.progress)
        else:
            order = np.asarray(self.plan.order(epoch, rank, size), dtype=np.int64)
        return order if self.samples is None else self.samples[order]

    def rank_size(self, epoch: int | None = None, resume: Resume | None = None) -> int:
        """``len(rank_order(epoch, resume))``, without computing the order where the plan can
        tell it (a tierfeed `Plan`, not resumed from another world size): a loader's state and
        length need only this."""
        epoch = self.epoch if epoch is None else epoch
        resumed = _of_epoch(resume, epoch)
        if isinstance(self.plan, Plan) and not (resumed and resumed.progress.segments):
            return self.plan.order_size(epoch, self.world.world_size)
        return len(self.rank_order(epoch, resume))

    def worker_order(
        self,
        worker: int,
        num_workers: int,
        epoch: int | None = None,
        rank_order: npt.NDArray[np.int64] | None = None,
        resume: Resume | None = None,
    ) -> npt.NDArray[np.int64]:
        """The samples one worker reads: of the rank's order cut into batches (after a resume,
        of what it has left), batches ``worker``, ``worker + num_workers``, ...
        ``rank_order``: `rank_order(epoch, resume)`, where the caller has it already."""
        epoch = self.epoch if epoch is None else epoch
        order = self.rank_order(epoch, resume) if rank_order is None else rank_order
        return self._slice(order, self._run(order, epoch, resume), worker, num_workers)

    def cold_start(self) -> ColdStart | None:
        """The main process's copies of the opening of this feed's next iteration, not begun
        (`ColdStart.of`: a Loader makes it before forking its workers, starts it after); the
        rank's reads are made by its thread, after the fork, not on the way to it."""
        epoch, resume = self.epoch, self._resume

        def reads() -> IntArray:
            rank = self.rank_order(epoch, resume)
            return rank[self._run(rank, epoch, resume)]

        return ColdStart.of(self._process, reads)

    def opening(self, num_workers: int, able: bool = True) -> int:
        """How many samples of the next iteration a Loader about to fork ``num_workers``
        workers reads itself (`tierfeed.loader.opening`), ``able`` to (it has a store to read them
        through): worker 0's first batch, where its slice holds more (the batch is then
        neither its last nor the epoch's), the iteration runs on across epochs (a Loader's,
        which puts batches in turn), and replays no recorded order; else 0. Said in this view
        before the fork, so worker 0 starts after them."""
        self._opened = 0
        if not (able and num_workers > 0 and self.continuous and self._replay is None):
            return 0
        epoch, resume = self.epoch, _of_epoch(self._resume, self.epoch)
        done = None if resume is None else resume.done
        n = self.rank_size(epoch, resume)
        run = len(run_positions(n, self.batch_size, self.drop_last, done))
        self._opened = self.batch_size if run > self.batch_size * num_workers else 0
        return self._opened

    def _run(self, rank: IntArray, epoch: int, resume: Resume | None) -> IntArray:
        """The positions of ``rank`` (the rank's order of ``epoch``) this run reads: after a
        resume not those delivered before it, and not a short last batch drop_last drops."""
        resume = _of_epoch(resume, epoch)
        done = None if resume is None else resume.done
        return run_positions(len(rank), self.batch_size, self.drop_last, done)

    def _slice(self, rank: IntArray, run: IntArray, worker: int, num_workers: int) -> IntArray:
        """Worker ``worker``'s batches of the positions ``run`` of ``rank``."""
        return rank[worker_slice(run, self.batch_size, worker, num_workers, False)]

    def num_batches(self, epoch: int | None = None, resume: Resume | None = None) -> int:
        """Batches the rank delivers in a whole epoch: ``ceil(n / batch_size)`` of its ``n``
        samples, ``floor`` with drop_last (any number of workers, guard or not)."""
        return batch_count(self.rank_size(epoch, resume), self.batch_size, self.drop_last)

    @property
    def continuous(self) -> bool:
        """Whether an iteration runs on into the following epochs (a Loader's, without a
        sample exchange): each worker reads the next epoch's slice as it finishes this one, so
        an epoch's first batch is ready when it is asked for. Every worker marks its last
        batch of an epoch (``Batch.last``) and the Loader sorts batches by ``Batch.epoch``."""
        return self.config.read_across_epochs and self.config.exchange is None

    def iterate(self, worker: int, num_workers: int, in_worker: bool) -> Iterator[Batch]:
        """The batches ``worker`` of ``num_workers`` builds, from the current epoch on (only
        it when not continuous). ``in_worker``: this runs in a worker process of its own."""
        epoch = self.epoch
        # A resume is applied once: a persistent worker's next iteration starts fresh.
        resume, self._resume = self._resume, None
        replay, self._replay = self._replay, None
        opened, self._opened = self._opened, 0
        mine = None if replay is None else replay.get(worker, {})
        stream = self._stream(epoch, worker, num_workers, resume, mine, opened)
        following: GuardedStream[Any] | None = None
        if in_worker and self.continuous:
            self._process.close_at_exit()
        try:
            while True:
                for batch in self._batches(stream, worker, epoch):
                    if batch.last and self.continuous and not in_worker:
                        # In this process nothing asks for the next batch before the next
                        # epoch: start its reads before handing over this epoch's last batch.
                        following = self._stream(epoch + 1, worker, num_workers, None)
                        following.start()
                    yield batch
                stream.close()
                if not self.continuous:
                    break
                if following is None:
                    # A worker: the DataLoader keeps asking ahead, so this runs as soon as the
                    # last batch is sent, off the path of any batch.
                    following = self._stream(epoch + 1, worker, num_workers, None)
                stream, following, epoch = following, None, epoch + 1
        finally:
            stream.close()
            if following is not None:
                following.close()
        if not self.config.read_across_epochs and in_worker:
            # The worker process ends with its epoch: let its copies reach the disk tier.
            with contextlib.suppress(StorageError):
                self.store().source.drain(timeout=_DRAIN_S)

    def _stream(
        self,
        epoch: int,
        worker: int,
        num_workers: int,
        resume: Resume | None,
        replay: Mapping[int, int] | None = None,
        opened: int = 0,
    ) -> GuardedStream[Any]:
        """This worker's guarded read stream over its slice of ``epoch``: the path of its
        samples through the feed, from the plan to the reads behind the guard. ``opened``:
        samples of worker 0's slice the Loader delivered itself (`read_opening`); worker 0
        starts after them."""
        store = self.store()
        rank = self.rank_order(epoch, resume)
        run = self._run(rank, epoch, resume)
        order = self._slice(rank, run, worker, num_workers)
        _check_rows(store, rank, order)
        store.source.begin_epoch()  # e.g. a namespace source loads the samples peers moved here
        start = opened if worker == 0 else 0
        open_ahead(store, order[start:])
        head = HEAD_BATCHES * self.batch_size
        if tell_head(store, order[start : start + head]):
            # The rank's reads served apart: every worker's head, and the Loader's batch.
            store.source.served_first(head * max(1, num_workers) + opened)
        if store.source.uses_future:
            ahead = range(epoch + 1, epoch + 1 + EPOCHS_AHEAD)
            later = [self.worker_order(worker, num_workers, e) for e in ahead]
            # What the rank reads (after a resume, the rest): the copies' pieces come in its order.
            tell_future(store, rank[run], [order, *later])
        return self._guarded(store, order, replay, StreamState(start) if start else None)

    def _guarded(
        self,
        store: Store,
        order: IntArray,
        replay: Mapping[int, int] | None = None,
        state: StreamState | None = None,
    ) -> GuardedStream[Any]:
        """The deadline guard over reads of ``order`` (rows checked) on this process's reader
        threads: a run of local samples read at once, a late read hedged a second way.
        ``state``: where in ``order`` it starts."""
        config, decode = self.config, self.config.decode
        # This worker's samples alone: nothing O(dataset) per epoch.
        nbytes = store.index.sample_bytes(order, rows_checked=True)
        sizes = dict(zip(order.tolist(), nbytes.tolist(), strict=True))
        readers = self._process.readers(config.prefetch.threads, decode)
        second = config.hedge_source or store.second_source
        deadline = config.deadline.for_origin(store.source.costly_requests, second is not None)
        hedge = readers.hedge_reader(lambda: hedge_store(store, second))
        return GuardedStream(
            order,
            lambda i: decode_sample(decode, store, i),
            hedge=hedge if deadline.hedges else None,
            local=store.local,
            read_local=lambda ids: [
                decode_read(decode, store, i, data)
                for i, data in zip(ids, store.read_samples(ids, rows_checked=True), strict=True)
            ],
            size_of=sizes.__getitem__,
            describe=lambda i: describe_sample(store, i),
            prefetch=config.prefetch,
            deadline=deadline,
            pool=readers.pool,
            hedge_pool=readers.hedges,
            replay=replay,
            state=state,
        )

    def close(self) -> None:
        """Stop this process's reads and close its store (a Loader does this for its own)."""
        self._process.close()

    def _batches(self, stream: GuardedStream[Any], worker: int, epoch: int) -> Iterator[Batch]:
        """The epoch's batches from one worker's stream, the last one marked; in a continuous
        iteration a worker whose slice yields no batch sends an empty one (``data`` None).

        The slice is whole batches of the rank's order (only the rank's last batch can be
        short, and with drop_last it is not in any slice), so cutting the stream every
        ``batch_size`` samples gives exactly the batches this worker was dealt. The guard may
        deliver a late sample in a later batch of this worker than its own; the number of
        batches does not change.
        """
        size = self.config.batch_size
        items: list[Any] = []
        started = time.perf_counter()
        sent = False
        for _, value in stream:
            items.append(value)
            left = stream.remaining
            if len(items) < size and left > 0:
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
        counters = stream.counters.for_batch(time.perf_counter() - started)
        tiers = self.store().source.stats() or None  # {}: a source without tiers
        state = stream.state().to_dict()
        kept, skipped = without_skipped(items)  # data None: every sample of it left out
        data = self.config.collate(kept) if kept else None
        swaps = stream.new_swaps()
        return Batch(data, worker, epoch, state, counters, tiers, last, swaps, skipped, len(kept))


def _of_epoch(resume: Resume | None, epoch: int) -> Resume | None:
    """``resume`` where it resumes ``epoch``; None otherwise (another epoch starts afresh)."""
    return resume if resume is not None and resume.epoch == epoch else None


def _check_rows(store: Store, rank: IntArray, order: IntArray) -> None:
    """An index checked on use checks the rows this worker touches this epoch, once: its
    own, or the rank's (which hold its own) where its copies are told the rank's reads."""
    store.index.check_samples(rank if store.source.uses_future else order)
