"""The first batch of a Loader's iteration, read by the Loader's own process while its
DataLoader workers start.

A forked worker reads nothing for its first fraction of a second: it opens the store (an
object store's client made, its index looked at), plans its slice and starts its threads,
while the training process, which has the store open and knows the plan, waits. So the
training process reads worker 0's first batch itself (`read_opening`), through the tier stack
of its copies (`ColdStart`): the batch's samples read at once as exact ranges (`HeadReads`),
each through the deadline guard, hedged a second way where the store has one, decoded and
collated here. Worker 0 was told before the fork (`Feed.opening`) and starts its slice after
them, its state and swaps numbered as if it had delivered them: the order, a state taken
after the batch, a resume and the run's order record are all the ones worker 0 would have
made, and each sample is still delivered once.

It applies where `ColdStart` does (a disk tier the host shares, the clairvoyant policy), to
an iteration that runs on across epochs and replays no recorded order, where worker 0 has
more than one batch, and from an object store only where a worker would read its own first
batch at once (`ColdStart.opens`): a GET a sample, which on a store of a few chunks costs the
cold epoch more than the first batch gains.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tierfeed.loader.clairvoyance import open_ahead, tell_head
from tierfeed.loader.coldstart import ColdStart
from tierfeed.loader.decode import decode_sample, describe_sample, without_skipped
from tierfeed.loader.feed import Batch, Feed
from tierfeed.loader.readers import Readers, hedge_store
from tierfeed.loader.stream import GuardedStream, StreamState
from tierfeed.storage.store import Store

__all__ = ["begin_iteration", "read_opening"]

IntArray = npt.NDArray[np.int64]
T = TypeVar("T")


def begin_iteration(
    feed: Feed, cold: ColdStart | None, workers: int, start: Callable[[], T]
) -> tuple[T, Batch | None]:
    """Fork the workers (``start()``, what it returns first) over ``feed`` (a Loader's view),
    with ``cold`` (the main process's copies, made before the fork: None where none apply)
    started after it; and the iteration's first batch read here meanwhile where it can be
    (`Feed.opening`), else None."""
    able = cold is not None and cold.opens(feed.batch_size)
    opened = feed.opening(workers, able)  # said in the view the workers fork with
    running = start()
    if cold is None or not opened:
        if cold is not None:
            cold.start()
        return running, None
    with cold.holding() as store:
        return running, read_opening(feed, store, cold.reads()[:opened], cold.start)


def read_opening(feed: Feed, store: Store, order: IntArray, begun: Callable[[], object]) -> Batch:
    """Worker 0's first batch (``order``: its samples, as many as `Feed.opening` said), read
    through ``store`` and collated here: the samples read at once as exact ranges (from a file
    system whatever the store, the copies' pieces not waiting for them; from an object store
    where a worker's would be, `TierStack.read_first`), then ``begun()`` (e.g. the copies
    start), then each through the guard. Its state is worker 0's after it."""
    config, decode = feed.config, feed.config.decode
    store.index.check_samples(order)
    open_ahead(store, order)  # e.g. an object store's client made meanwhile
    if tell_head(store, order, every=True):
        store.source.served_first(len(order))
    begun()
    second = config.hedge_source or store.second_source
    deadline = config.deadline.for_origin(store.source.costly_requests, second is not None)
    readers = Readers(config.prefetch.threads, decode)  # this batch's own, made after the fork
    hedge = readers.hedge_reader(lambda: hedge_store(store, second)) if deadline.hedges else None
    started = time.perf_counter()
    try:
        with GuardedStream(
            order,
            lambda i: decode_sample(decode, store, i),
            hedge=hedge,
            local=store.local,
            describe=lambda i: describe_sample(store, i),
            prefetch=config.prefetch,
            deadline=deadline,
            pool=readers.pool,
            hedge_pool=readers.hedges,
        ) as stream:
            items = [value for _, value in stream]
    finally:
        # Not waited for once the batch is whole: a read the guard went past (hedged, or its
        # sample delivered from elsewhere) ends on its daemon thread.
        readers.close(wait=False)
    kept, skipped = without_skipped(items)
    data = config.collate(kept) if kept else None
    counters = stream.counters.for_batch(time.perf_counter() - started)
    state = StreamState(len(order)).to_dict()
    swaps = tuple(stream.swaps)
    return Batch(data, 0, feed.epoch, state, counters, None, False, swaps, skipped, len(kept))
