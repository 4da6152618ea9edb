"""The exchanger: moves sample bytes between ranks in windows, on a background thread.

The plan picks a schedule strategy (`tierfeed.distributed.strategies`): ``fetch`` for global
and local plans (each window fetched ahead of the loader, deleted once read), ``move`` for
partial(q) (the moves that build the next epoch's partitions, made once the senders have read
them). One window executor (`tierfeed.distributed.windows`) runs either: the waits on the
loader, the collectives on the Comm's own gloo group with its timeout, the inbox.

Every failure leaves as an `ExchangeError` naming the rank, epoch and window. It is kept,
written into the inbox (readers in worker processes fail at once), and raised from the next
call the training loop makes.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.comm import Comm
from tierfeed.distributed.copies import LocalCopies
from tierfeed.distributed.holders import SampleHolders
from tierfeed.distributed.namespace import inbox_dir
from tierfeed.distributed.schedule import num_windows
from tierfeed.distributed.strategies import EpochState, MoveStrategy, strategy_for
from tierfeed.distributed.windows import RESTORE, ExchangeCounters, WindowExecutor
from tierfeed.errors import ConfigError, ExchangeError
from tierfeed.plan import Plan

__all__ = ["ExchangeCounters", "ExchangeOptions", "Exchanger"]


@dataclass(frozen=True)
class ExchangeOptions:
    """How exchanges are cut and paced.

    Attributes:
        window: positions of the ranks' orders per exchange (one all-to-all each).
        ahead: fetch mode: windows fetched ahead of the loader.
        timeout_s: how long any wait on a peer may take.
    """

    window: int = 256
    ahead: int = 4
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.window < 1 or self.ahead < 1 or self.timeout_s <= 0:
            raise ConfigError(f"exchange window, ahead and timeout must be positive: {self}")


class Exchanger:
    """This rank's side of the sample exchange of a job reading node-local storage.

    Args:
        comm: the byte group (every rank creates its exchanger at the same point).
        local_dir: the node-local store directory stage-in filled.
        plan: the job's plan (partial plans move samples; the others fetch them).
        holdings: who staged which chunk.
        options: window, look-ahead and timeout.
    """

    def __init__(
        self,
        comm: Comm,
        local_dir: str | Path,
        plan: Plan,
        holdings: SampleHolders,
        options: ExchangeOptions | None = None,
    ) -> None:
        self.comm, self.plan, self.holdings = comm, plan, holdings
        self.options = options or ExchangeOptions()
        self.rank, self.world_size = comm.rank, comm.world_size
        inbox = inbox_dir(local_dir, self.rank)
        self.copies = LocalCopies(Path(local_dir), inbox, holdings, self.rank)
        self.strategy = strategy_for(
            plan, holdings, self.world_size, self.options.window, self.options.ahead, self.rank
        )
        self.mode = self.strategy.mode
        self.counters = ExchangeCounters()
        self._hold(self.copies.staged())
        self.executor = WindowExecutor(
            comm, self.copies, self.strategy, self.options.window, self.counters
        )
        self._state: EpochState | None = None
        self._thread: threading.Thread | None = None

    @property
    def batch_size(self) -> int:
        """Samples per step (windows are named by the steps they cover)."""
        return self.executor.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.executor.batch_size = value

    # --- the training loop's side ---------------------------------------------------------

    def begin_epoch(self, epoch: int, start: int = 0, margin: int = 0) -> None:
        """Start the exchanges of ``epoch``; the loader has already consumed ``start``
        positions (a resumed epoch) and may read up to ``margin`` positions ahead of what it
        reports consumed (its workers' read-ahead)."""
        self._raise()
        if self._state is not None and not self._state.ended:
            self.finish()  # the previous epoch was left early: settle it first
        length = len(self.plan.order(epoch, self.rank, self.world_size))
        state = EpochState(
            epoch, num_windows(length, self.options.window), consumed=start, margin=margin
        )
        # The previous epoch's last moves may still be in flight: the new thread waits for
        # them before its own collectives, while this epoch's reads already begin (a sample
        # still on its way is waited for by the reader).
        previous = self._thread
        self._state = state
        self._thread = threading.Thread(
            target=self.executor.run,
            args=(state, previous),
            name=f"tierfeed-exchange-{self.rank}",
            daemon=True,
        )
        self._thread.start()

    def consumed(self, epoch: int, positions: int) -> None:
        """The loader has delivered ``positions`` samples of ``epoch`` (since begin_epoch)."""
        self._raise()
        with self.executor.cond:
            if self._state is not None and self._state.epoch == epoch:
                self._state.consumed = max(self._state.consumed, positions)
                self.executor.cond.notify_all()

    def end_epoch(self, epoch: int) -> None:
        """The loader has read all of ``epoch`` (every rank calls it).

        Fetch plans finish and delete the epoch's segments. Partial plans let the epoch's
        last moves run on while the next epoch starts; `finish()` waits for them.
        """
        state = self._state
        if state is None or state.epoch != epoch:
            self._raise()
            return
        self._end(state)
        if self.strategy.keeps_epochs_apart:
            self.finish()
            self.copies.forget_all()
        self._raise()

    def _end(self, state: EpochState) -> None:
        with self.executor.cond:
            state.ended = True
            self.executor.cond.notify_all()

    def finish(self) -> None:
        """Wait until every scheduled exchange is done (the next partitions are complete)."""
        state, thread = self._state, self._thread
        if state is not None:
            self._end(state)
        if thread is not None:
            windows = state.windows if state is not None else 1
            thread.join(self.options.timeout_s * (windows + 1))
            if thread.is_alive():
                epoch = state.epoch if state is not None else -1
                window = state.window if state is not None else None
                self.executor.fail(
                    ExchangeError(
                        f"rank {self.rank} of {self.world_size}: "
                        f"{self.executor.describe(epoch, window)} is stuck: no progress in "
                        f"{self.options.timeout_s * (windows + 1):g} s; check the other ranks"
                    )
                )
        self._state, self._thread = None, None
        self._raise()

    def restore(self, epoch: int) -> None:
        """Rebuild the partitions of ``epoch`` after a restart (partial plans; every rank).

        A restarted job re-runs stage-in first (it re-copies the chunks whose samples were
        sent away, so every rank holds its initial partition again); one exchange then moves
        each sample of ``epoch``'s partitions from the rank that staged it, and each rank
        deletes what it no longer holds. Fetch plans need nothing: they keep no state.
        """
        self._raise()
        if not isinstance(self.strategy, MoveStrategy) or epoch == 0:
            return
        moves = self.strategy.restore(epoch, self.holdings)
        self.executor.exchange(epoch, RESTORE, moves, settle=False)
        mine = self.plan.partition(epoch, self.rank, self.world_size)
        gone = np.setdiff1d(self.copies.staged(), mine)
        self.executor.guarded(epoch, RESTORE, lambda: self._discard(gone))
        self._hold(mine)

    def _hold(self, samples: npt.NDArray[np.int64]) -> None:
        """Count ``samples`` as what this rank stores now (and the most so far)."""
        c = self.counters
        c.held = c.max_held = len(samples)
        c.held_bytes = c.max_held_bytes = int(self.copies.sample_bytes[samples].sum())

    def _discard(self, samples: npt.NDArray[np.int64]) -> None:
        self.counters.punched_bytes += self.copies.discard(samples)

    def _raise(self) -> None:
        if self.executor.error is not None:
            raise self.executor.error

    def stats(self) -> dict[str, Any]:
        """Counters as plain values."""
        return self.counters.to_dict()

    def close(self) -> None:
        """Finish the running epoch's exchanges and release files."""
        with contextlib.suppress(ExchangeError):
            self.finish()
        self.copies.close()

    def __enter__(self) -> Exchanger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
