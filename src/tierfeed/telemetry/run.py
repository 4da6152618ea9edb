"""Per-epoch and live run records, written as JSON lines that `tierfeed report` draws."""

from __future__ import annotations

import heapq
import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from tierfeed.telemetry.histogram import LatencyHistogram

__all__ = ["EpochMeter", "RunRecorder", "batch_len", "read_records"]


def batch_len(batch: Any) -> int:
    """Samples in a collated batch: a tensor or array, or a list, tuple or dict of them."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, (list, tuple)):
        batch = batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else len(batch)


class EpochMeter:
    """Measures one epoch as the consumer sees it: samples, batches, waits and stalls.

    ``batch_wait`` is the time the training loop waited for each batch; ``stall_s`` is the
    sum of waits longer than ``stall_threshold_s`` (time the accelerator would have idled);
    ``first_batch_s`` is the first batch's wait (start-up included); ``slowest`` are the
    longest waits with the batch each was for (0: the first), longest first.
    """

    SLOWEST = 5

    def __init__(self, epoch: int, stall_threshold_s: float = 0.001) -> None:
        self.epoch = epoch
        self.samples = 0
        self.batches = 0
        self.batch_wait = LatencyHistogram()
        self.stall_s = 0.0
        self.first_batch_s: float | None = None
        self._slowest: list[tuple[float, int]] = []  # a min-heap of (wait, batch)
        self.stall_threshold_s = stall_threshold_s
        self.started = time.perf_counter()
        self.extra: dict[str, Any] = {}

    def batch(self, size: int, waited_s: float) -> None:
        """Record one delivered batch and how long the consumer waited for it."""
        self.samples += size
        self.batch_wait.add(waited_s)
        if len(self._slowest) < self.SLOWEST:
            heapq.heappush(self._slowest, (waited_s, self.batches))
        elif waited_s > self._slowest[0][0]:
            heapq.heapreplace(self._slowest, (waited_s, self.batches))
        self.batches += 1
        if self.first_batch_s is None:
            self.first_batch_s = waited_s
        if waited_s > self.stall_threshold_s:
            self.stall_s += waited_s

    def record(self) -> dict[str, Any]:
        """The epoch's record: throughput, wait percentiles, stall time, and ``extra``."""
        seconds = time.perf_counter() - self.started
        return {
            "type": "epoch",
            "epoch": self.epoch,
            "samples": self.samples,
            "batches": self.batches,
            "seconds": seconds,
            "samples_per_s": self.samples / seconds if seconds > 0 else 0.0,
            "stall_s": self.stall_s,
            "first_batch_s": self.first_batch_s,
            "slowest": [{"batch": b, "wait_s": w} for w, b in sorted(self._slowest, reverse=True)],
            "batch_wait": self.batch_wait.summary(),
            "batch_wait_hist": self.batch_wait.to_dict(),
            **self.extra,
        }

    def progress(self, system: str) -> dict[str, Any]:
        """A live record of the epoch so far (a ``progress`` line of the run file)."""
        record = self.record()
        keys = ("epoch", "samples", "seconds", "samples_per_s", "batch_wait", "stall_s")
        return {"type": "progress", "system": system, **{k: record[k] for k in keys}}


class RunRecorder:
    """Appends records to a JSON-lines file (one object per line, flushed), thread-safe."""

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = open(self.path, "a")  # noqa: SIM115 - closed in close()
        self._mutex = threading.Lock()
        self.write({"type": "run", "time": time.time(), **(meta or {})})

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        with self._mutex:
            if self._fh is None:
                return
            self._fh.write(json.dumps(record, default=float) + "\n")
            self._fh.flush()

    def close(self) -> None:
        """Close the file; later writes are ignored."""
        with self._mutex:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a run file (a torn last line from a killed run is ignored)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
