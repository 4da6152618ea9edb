"""`tierfeed.torch.Loader`: a DataLoader over `Dataset` with exact resume and run telemetry."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import DataLoader

from tierfeed.errors import ConfigError
from tierfeed.loader.coldstart import ColdStart
from tierfeed.loader.decode import skipped_record, skipped_warning
from tierfeed.loader.feed import Replay
from tierfeed.loader.loaderstate import resume_of, state_of
from tierfeed.loader.opening import begin_iteration
from tierfeed.loader.replay import Swaps, check_order, order_record, replay_of
from tierfeed.loader.resume import Resume
from tierfeed.telemetry import EpochMeter, RunRecorder, batch_len, combine, since
from tierfeed.telemetry.prometheus import MetricsServer
from tierfeed.torch.dataset import Batch, Dataset, feed_of, loader_view
from tierfeed.torch.handover import accelerator_available, pin, restore
from tierfeed.torch.misuse import not_a_dataset
from tierfeed.torch.workers import (
    FAILED_STOP_S,
    STOP_S,
    epoch_in_turn,
    read_ahead,
    start_workers,
    stop_workers,
)
from tierfeed.units import count

__all__ = ["Loader"]

# (the resume applied to this epoch, if any; each worker's stream state; how many of each
# worker's swaps were delivered): see `Loader.mark`
LoaderMark = tuple[Resume | None, Mapping[int, Mapping[str, Any]], Mapping[int, int]]


class Loader:
    """Iterate batches of a `Dataset` with PyTorch's DataLoader conventions.

    Batches are assembled inside the workers (``batch_size=None`` for the DataLoader), so a
    batch crosses from a worker to the trainer in one transfer. The rank's epoch order is cut
    into batches and the workers are dealt whole batches in turn, as DataLoader's batch
    sampler does: only the rank's last batch can be short, ``drop_last`` drops at most that
    one, and ``len(loader)`` is the number of batches an epoch yields (``ceil(n / batch_size)``
    of the rank's ``n`` samples, ``floor`` with drop_last), for LR schedulers and progress bars.
    With the guard off each batch is one of the plan's batches (in the plan's order while the
    workers hold equally many); the guard may move a late sample into a later batch of the
    same worker, never changing the count. ``state_dict()`` records where
    every worker stands in its slice of the plan, deferred samples included, and
    ``load_state_dict()`` resumes exactly there.

    Workers persist (DataLoader's ``persistent_workers``) and their iteration runs on across
    epochs: a worker that has sent its last batch of an epoch goes on to its slice of the next
    (the plan says which), so an epoch's first batch is ready when asked for, with no restart
    handshake, and a read that storage holds for seconds finishes in the background instead
    of holding up the end of the epoch. A `set_epoch` to another epoch than the next, a
    `load_state_dict`, or an epoch left early restarts the iteration. While workers start, this
    process reads (and decodes) the first batch (`tierfeed.loader.opening`). Call `close` (or
    use ``with``) to stop the workers.

    Args:
        dataset: the tierfeed Dataset (it holds batch size, plan and guard settings).
        num_workers: DataLoader worker processes (0 reads in this process).
        pin_memory: put each batch's CPU tensors in page-locked memory, as DataLoader's
            option does, once the batch is restored in this process (DataLoader's own pin
            thread would see only the worker's envelope); a warning, and no pinning, where
            there is no accelerator.
        prefetch_factor: batches each worker keeps ready (DataLoader's).
        run_file: append per-epoch JSON-lines records here (for `tierfeed report`), and
            a live ``progress`` record every ``live_every_s`` seconds during an epoch.
        system: the name written into run records.
        live_every_s: seconds between live progress records.
        metrics_port: serve live figures for Prometheus at ``http://127.0.0.1:PORT/metrics``
            (0: any free port, see ``metrics.port``; None: no server).
    """

    def __init__(
        self,
        dataset: Dataset,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        run_file: str | os.PathLike[str] | None = None,
        system: str = "tierfeed",
        live_every_s: float = 10.0,
        metrics_port: int | None = None,
    ) -> None:
        if not isinstance(dataset, Dataset):
            raise ConfigError(not_a_dataset(dataset))
        num_workers = count(num_workers, "Loader(num_workers=...)")
        if prefetch_factor is not None:
            prefetch_factor = count(prefetch_factor, "Loader(prefetch_factor=...)", 1)
        self.dataset = dataset
        self.num_workers = num_workers
        self._pin = pin_memory and accelerator_available()
        if pin_memory and not self._pin:
            warnings.warn(
                "Loader(pin_memory=True) but no accelerator is available: batches are not pinned",
                stacklevel=2,
            )
        self._kwargs: dict[str, Any] = {}
        if num_workers > 0:
            self._kwargs["prefetch_factor"] = prefetch_factor or 2
            self._kwargs["multiprocessing_context"] = "fork" if os.name == "posix" else None
        self._read_ahead = read_ahead(feed_of(dataset), num_workers, self._kwargs)  # positions
        self._states: dict[int, dict[str, Any]] = {}
        self._counters: dict[int, dict[str, float]] = {}
        self._tiers: dict[int, dict[str, dict[str, Any]]] = {}
        self._tier_base: dict[str, dict[str, float]] = {}  # in-process: counters carry over
        self.recorder = RunRecorder(run_file, {"system": system}) if run_file else None
        self.system = system
        self.live_every_s = live_every_s
        self.last_epoch: dict[str, Any] | None = None
        self._meter: EpochMeter | None = None
        self._loader: DataLoader[Batch] | None = None  # kept across epochs: its workers persist
        self._iter: Iterator[Batch] | None = None  # its running iteration, across epochs
        self._iter_epoch = -1  # the epoch that iteration delivers next
        self._ahead: list[Batch] = []  # batches of the next epoch that came before its turn
        self._resume: Resume | None = None  # where the next iteration starts (load_state_dict)
        self._replay: Replay | None = None  # the order the next epoch delivers (`replay`)
        self._swaps: Swaps = {}  # this iteration's so far (from the epoch's start or a resume)
        self._skipped: tuple[str, ...] = ()  # keys left out this iteration (on_error="skip")
        self._view: Dataset | None = None  # the dataset as its DataLoader reads it
        self._cold: ColdStart | None = None  # this process's copies while the workers start
        self.metrics = None if metrics_port is None else MetricsServer(self._live, metrics_port)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self.dataset.epoch

    def __len__(self) -> int:
        """Batches this rank delivers in a whole epoch (the one the next iteration reads).

        An iteration resumed mid-epoch by `load_state_dict` delivers only the rest of them.
        """
        return feed_of(self.dataset).num_batches(None, self._resume)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (as DistributedSampler.set_epoch); clears any resume position."""
        changed = epoch != self.dataset.epoch
        self.dataset.set_epoch(epoch)  # checked there first
        if changed:
            self._resume = None
            self._states = {}

    def state_dict(self, mark: LoaderMark | None = None) -> dict[str, Any]:
        """A few plain values: the epoch, and the positions of this rank's order delivered so
        far (a prefix and the few a deferral moved past it), with the rank and world size;
        with ``mark`` (`mark`), as they were when it was taken.

        Independent of the number of workers: `load_state_dict` resumes it with any. To resume
        in a job of another world size, give `load_state_dict` every rank's state (gather them
        with `gather_state_dict`)."""
        resume, states, made = mark if mark is not None else self.mark()
        state = state_of(feed_of(self.dataset), resume, self.num_workers, states)
        upto = {w: s[: made.get(w, 0)] for w, s in self._swaps.items()}  # the swaps so far
        state["order"] = order_record(upto, self.num_workers, self.dataset.batch_size)
        return state

    def mark(self) -> LoaderMark:
        """Where the batches delivered so far end, taken cheaply (the workers' positions, not a
        state yet: that costs O(samples of the rank)); `state_dict(mark)` makes it one later.
        A `DevicePrefetcher` marks each batch it copies ahead, and makes a state only when
        asked for one."""
        resume = self._resume if self._resumes(self.dataset.epoch) else None
        swaps = self._swaps
        return (
            resume,
            dict(self._states),
            None if swaps is None else {w: len(s) for w, s in swaps.items()},
        )

    def gather_state_dict(self) -> list[dict[str, Any]]:
        """Every rank's `state_dict`, gathered over torch.distributed's default group (call it
        on every rank): what `load_state_dict` needs to resume in another world size."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return [self.state_dict()]
        states: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(states, self.state_dict())
        return states

    def replay(self, record: Mapping[str, Any]) -> None:
        """Deliver the next iteration in the order a run recorded (``last_epoch["order"]``, or
        the ``order`` of that epoch in the run file, or a state's ``order``: the part before
        it): the same samples in the same order, whatever the storage's timing is now; a late
        read is waited for (and hedged), not deferred. It needs what that run had: the plan
        (spec, seed), epoch (`set_epoch` it first), world, workers, batch size and prefetch
        window, and its start: the epoch's, or after `load_state_dict` of the state that run
        resumed from (a resumed epoch replays as two: README, "Which order").

        Raises:
            ConfigError: not a recorded order, or one of other workers or batch size.
        """
        self._replay = replay_of(record, self.num_workers, self.dataset.batch_size)

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Resume from a `state_dict()`: the next iteration delivers the rest of the epoch.

        Any number of workers resumes it. ``state`` may also be every rank's state (a list,
        `gather_state_dict`): then a job of another world size resumes the epoch, each new
        rank taking an equal share of what the old ranks had left (padded as
        DistributedSampler pads), so every sample is still delivered once."""
        resume = resume_of(feed_of(self.dataset), state)
        check_order(state)
        self._resume = resume
        self.dataset.set_epoch(resume.epoch)
        self._states = {}

    def _resumes(self, epoch: int) -> bool:
        resume = self._resume
        return resume is not None and resume.epoch == epoch

    def _dataloader(self) -> DataLoader[Batch]:
        """The DataLoader for the next epoch: the running one, unless workers must start anew
        from a resume position (it is given to them when they start)."""
        if self._loader is None or self._resume is not None or self._replay is not None:
            self._stop_workers()
            feed = feed_of(self.dataset).for_loader(self._resume, self._replay)
            self._view = loader_view(self.dataset, feed)
            self._replay = None
            self._loader = DataLoader(
                self._view,
                batch_size=None,
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
                **self._kwargs,
            )
            self._tier_base = {}
        return self._loader

    def _stop_workers(self, wait_s: float = STOP_S) -> None:
        """Shut the DataLoader's persistent workers down now (`stop_workers`)."""
        stop_workers(self._loader, wait_s)
        self._iter, self._iter_epoch, self._ahead = None, -1, []
        self._loader = None

    def __iter__(self) -> Iterator[Any]:
        loader = self._dataloader()
        epoch, exchange = self.dataset.epoch, feed_of(self.dataset).exchange
        if self._iter is None or self._iter_epoch != epoch:
            self._begin(loader)
        self._iter_epoch = epoch
        start = self._resumed_positions()
        self._swaps, self._skipped = {}, ()
        if exchange is not None:
            exchange.begin_epoch(epoch, start, self._read_ahead)
        meter = self._meter = EpochMeter(epoch)
        asked = time.perf_counter()
        batch: Batch
        next_live = time.perf_counter() + self.live_every_s
        delivered = start
        finished = False
        try:
            for batch in self._epoch_batches(epoch):
                if batch.data is None:  # every sample of it left out (on_error="skip")
                    self._took(batch)
                    delivered += len(batch.skipped)
                    continue
                data = restore(batch.data)
                if self._pin:
                    data = pin(data)
                size = batch.size or batch_len(data)  # (a list of samples: not its first's)
                meter.batch(size, time.perf_counter() - asked)
                delivered += size + len(batch.skipped)
                if exchange is not None:
                    exchange.consumed(epoch, delivered)
                if self.recorder is not None and time.perf_counter() >= next_live:
                    self.recorder.write(meter.progress(self.system))
                    next_live = time.perf_counter() + self.live_every_s
                self._took(batch)
                yield data
                asked = time.perf_counter()
            finished = True
        except GeneratorExit:  # the caller left the epoch early: the workers stay
            raise
        except BaseException:
            # The epoch failed (a worker's error, an interrupt): its workers stop now, and
            # the next iteration starts new ones; the error is not held behind a stuck one.
            self._stop_workers(FAILED_STOP_S)
            raise
        finally:
            if not finished:
                self._iter = None  # left mid-epoch: the next iteration starts over
        if exchange is not None:
            exchange.end_epoch(epoch)
        self._finish(meter)

    def _took(self, batch: Batch) -> None:
        """Keep what a delivered batch says of its worker: state, counters, swaps, tiers."""
        self._states[batch.worker] = batch.state
        self._counters[batch.worker] = batch.counters
        if batch.swaps:
            self._swaps.setdefault(batch.worker, []).extend(batch.swaps)
        if batch.tiers is not None:
            self._tiers[batch.worker] = batch.tiers
        self._skipped += batch.skipped

    def _begin(self, loader: DataLoader[Batch]) -> None:
        """Start (or restart: another epoch was chosen, or the last one was left early) the
        workers' iteration at this epoch; what ran ahead is dropped. Workers forked now start
        beside this process's copies of the epoch's first chunks (`ColdStart`), and its first
        batch is read here meanwhile (`tierfeed.loader.opening`)."""
        forks = loader.num_workers > 0 and getattr(loader, "_iterator", None) is None
        if forks:  # no copy thread of this process runs across a fork
            ColdStart.stop_if_any(self._cold)
        feed = feed_of(self._view)  # type: ignore[arg-type]  # made with the DataLoader
        cold = feed.cold_start() if forks else None
        self._cold = cold or self._cold
        try:
            start = lambda: start_workers(loader)  # noqa: E731
            self._iter, first = begin_iteration(feed, cold, loader.num_workers, start)
        except BaseException:
            self._stop_workers(FAILED_STOP_S)  # worker 0 skips the first batch: none reads it
            raise
        self._ahead = []
        if first is not None:  # worker 0's, taken in its turn; its counters apart from its own
            self._counters[-1], first.counters = first.counters, {}
            self._ahead.append(first)

    def _epoch_batches(self, epoch: int) -> Iterator[Batch]:
        """The running iteration's batches of ``epoch``, in the plan's order
        (`epoch_in_turn`)."""
        assert self._iter is not None and self._view is not None
        running = self._iter
        if not feed_of(self._view).continuous:
            yield from running  # the workers' iterators end with the epoch
            self._iter = None
            return
        yield from epoch_in_turn(running, epoch, max(1, self.num_workers), self._ahead)
        self._iter_epoch = epoch + 1  # the workers have gone on to the next epoch

    def _resumed_positions(self) -> int:
        """Positions of the rank's order read before a resume (a prefix: a lower bound).

        The resumed run reads the positions not done in order, so after it delivers ``d`` of
        them every position below ``prefix + d`` is done."""
        resume = self._resume
        return resume.done.prefix if resume is not None and self._resumes(self.epoch) else 0

    def _guard_totals(self) -> dict[str, float]:
        totals = combine({"guard": c} for c in list(self._counters.values())).get("guard", {})
        totals.pop("assemble_s", None)
        return totals

    def _live(self) -> dict[str, Any]:
        """The running (or last) epoch's figures, for the metrics server."""
        if self._meter is None:
            return {}
        return {**self._meter.record(), "guard": self._guard_totals(), "tiers": self._tier_totals()}

    def _finish(self, meter: EpochMeter) -> None:
        totals = self._guard_totals()
        tiers = self._tier_totals()
        meter.extra = {
            "system": self.system,
            "guard": totals,
            "tiers": since(tiers, self._tier_base),
            "order": order_record(self._swaps, self.num_workers, self.dataset.batch_size),
            "skipped": skipped_record(self._skipped),
        }
        self._tier_base = tiers  # the processes persist: their counters accumulate
        self.last_epoch = meter.record()
        if self._skipped:
            warnings.warn(skipped_warning(self.epoch, self._skipped), stacklevel=3)
        if self.recorder is not None:
            self.recorder.write(self.last_epoch)
        # The epoch is complete: a state_dict taken now resumes at the next epoch.
        self._resume, self._states, self._counters, self._tiers = None, {}, {}, {}
        self._swaps, self._skipped = {}, ()
        self.dataset.set_epoch(self.dataset.epoch + 1)

    def _tier_totals(self) -> dict[str, dict[str, float]]:
        """Tier counters over workers (each its own process's), and `ColdStart`'s when done."""
        cold = self._cold.stats if self._cold is not None else None
        return combine([*self._tiers.values(), *([cold] if cold else [])])

    def close(self) -> None:
        """Stop the workers and this process's reads; close the run file and metrics server."""
        self._stop_workers()
        ColdStart.stop_if_any(self._cold)
        self.dataset.close()  # its views' store and threads too: they share them
        if self.recorder is not None:
            self.recorder.close()
        if self.metrics is not None:
            self.metrics.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
