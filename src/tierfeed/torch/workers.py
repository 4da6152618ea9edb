"""Starting and stopping a DataLoader's worker processes, neither held by what they inherit."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

__all__ = ["FAILED_STOP_S", "STOP_S", "start_workers", "stop_workers"]

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
