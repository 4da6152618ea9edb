"""A DataLoader's worker processes: started and stopped, neither held by what they inherit, and
their batches put back in the plan's turn."""

from __future__ import annotations

import collections
import gc
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

from tierfeed.errors import LoaderError
from tierfeed.loader.feed import Batch, Feed

__all__ = [
    "FAILED_STOP_S",
    "STOP_S",
    "epoch_in_turn",
    "read_ahead",
    "start_workers",
    "stop_workers",
]

STOP_S = 10.0  # stopping the workers holds its caller at most this long
FAILED_STOP_S = 0.25  # after an epoch failed: its error is raised then


def start_workers(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)``, which forks its workers, with this process's objects frozen for the
    fork (`gc.freeze`, then unfrozen here at once): each worker then starts with everything it
    inherited out of its garbage collector's reach. Otherwise a full collection in a new worker
    walks all of it, holding the GIL, as the first epoch starts (docs/BENCHMARKS.md).
    Left as it is where this process froze objects itself (an unfreeze would undo that)."""
    if loader.num_workers == 0 or gc.get_freeze_count():
        return iter(loader)
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


def stop_workers(loader: DataLoader[Any] | None, wait_s: float = STOP_S) -> None:
    """Shut ``loader``'s persistent workers down now. Dropping the last references would too,
    unless they sit in a reference cycle (a traceback's, after an error): the garbage
    collector then closes the workers' queues before the iterator's shutdown tells them to
    stop, and PyTorch waits 5 s for each worker before it kills it (the same with a plain
    DataLoader; pytorch/pytorch#81794).

    The shutdown runs on a thread of its own, waited for at most ``wait_s``: a worker with a
    read stuck in the kernel (a hung mount) cannot exit until the kernel lets it, and PyTorch
    waits for it, then kills it, in the background, not in the way of the error that said so.
    """
    running = getattr(loader, "_iterator", None)
    shutdown = getattr(running, "_shutdown_workers", None)
    if callable(shutdown):
        stopper = threading.Thread(target=shutdown, name="tierfeed-stop-workers", daemon=True)
        stopper.start()
        stopper.join(wait_s)


def epoch_in_turn(
    running: Iterator[Batch], epoch: int, workers: int, ahead: list[Batch]
) -> Iterator[Batch]:
    """The batches of ``epoch`` from a continuous iteration of ``workers`` persistent workers,
    in the plan's order.

    The epoch ends when every worker has sent its last batch of it; batches of the next epoch
    that arrive before that (a worker that finished first) are kept in ``ahead``, and taken
    from there first. Worker ``w`` builds the epoch's batches ``w``, ``w + W``, ...; the
    DataLoader hands them over in its own turn, which runs on across epochs (after an epoch of
    an odd number of batches, worker 1's comes first), so they are put back in turn: batch
    ``k`` of the epoch is the ``k``-th given.
    """
    waiting = set(range(workers))
    queued: dict[int, collections.deque[Batch]] = {w: collections.deque() for w in waiting}
    turn = 0
    while waiting or any(queued.values()):
        worker = turn % workers
        while not queued[worker] and worker in waiting:
            batch = _kept(ahead, epoch) or _next_of(running, epoch, waiting)
            if batch.epoch != epoch:
                ahead.append(batch)
                continue
            if batch.last:
                waiting.discard(batch.worker)
            if batch.data is not None or batch.skipped:  # None: its samples all left out
                queued[batch.worker].append(batch)
        turn += 1
        if queued[worker]:
            yield queued[worker].popleft()


def _kept(ahead: list[Batch], epoch: int) -> Batch | None:
    """The first kept batch of ``epoch``, taken out of ``ahead``."""
    for i, batch in enumerate(ahead):
        if batch.epoch == epoch:
            return ahead.pop(i)
    return None


def _next_of(running: Iterator[Batch], epoch: int, waiting: set[int]) -> Batch:
    try:
        return next(running)
    except StopIteration:
        raise LoaderError(
            f"the workers stopped before the end of epoch {epoch} "
            f"(workers {sorted(waiting)} had not sent their last batch)"
        ) from None


def read_ahead(feed: Feed, num_workers: int, kwargs: Mapping[str, Any]) -> int:
    """How far a Loader's readers may run ahead of the batches it delivered (positions), with
    ``num_workers`` workers and its DataLoader's ``kwargs`` (``prefetch_factor``)."""
    workers = max(1, num_workers)
    queued = int(kwargs.get("prefetch_factor", 0)) + 1
    batch = feed.batch_size
    # A worker's slice is whole batches dealt in turn: its position p stands at most
    # (workers - 1) batches beyond p * workers in the rank's order.
    return workers * (feed.prefetch.window + queued * batch) + (workers - 1) * batch
