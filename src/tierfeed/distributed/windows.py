"""The window executor: runs an epoch's exchange windows on a background thread.

It waits until the strategy says a window may run (the loader's progress), reads what this
rank sends, makes the window's one all-to-all on the Comm's gloo group (with its timeout),
publishes what arrived and lets the strategy settle. Every failure leaves it as an
`ExchangeError` naming the rank, epoch and window; it is kept, written into the inbox
(readers in worker processes fail at once), and raised from the training loop's next call.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierfeed.distributed.comm import Comm
from tierfeed.distributed.copies import LocalCopies
from tierfeed.distributed.schedule import Transfers
from tierfeed.distributed.strategies import EpochState, ScheduleStrategy
from tierfeed.errors import ExchangeError

__all__ = ["ExchangeCounters", "WindowExecutor"]

RESTORE = -1  # the window number of a restore's single exchange


@dataclass
class ExchangeCounters:
    """What this rank's exchanger did."""

    windows: int = 0
    samples_sent: int = 0
    bytes_sent: int = 0
    samples_received: int = 0
    bytes_received: int = 0
    exchange_s: float = 0.0  # wall time in windows, waits for slower peers included
    read_s: float = 0.0  # reading what is sent
    collective_s: float = 0.0  # in all_to_all (transfer and waiting for peers)
    write_s: float = 0.0  # publishing what arrived
    delete_s: float = 0.0  # deleting what was sent (partial)
    punched_bytes: int = 0
    held: int = 0  # samples this rank stores now (partition plans)
    max_held: int = 0
    held_bytes: int = 0  # their member bytes (staged samples, and under partial what moved)
    max_held_bytes: int = 0  # the most at once (received before sent ones are deleted)

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return dict(self.__dict__)


@dataclass
class _Timing:
    started: float
    read: float = 0.0
    collective: float = 0.0
    written: float = 0.0


class WindowExecutor:
    """Runs windows of transfers for one rank.

    Args:
        comm: the exchange's own byte group.
        copies: this rank's local copies.
        strategy: what each window moves.
        window: positions of the ranks' orders per window.
        counters: what this rank's exchanger did (updated here).
    """

    def __init__(
        self,
        comm: Comm,
        copies: LocalCopies,
        strategy: ScheduleStrategy,
        window: int,
        counters: ExchangeCounters,
    ) -> None:
        self.comm, self.copies, self.strategy = comm, copies, strategy
        self.rank, self.world_size = comm.rank, comm.world_size
        self.window = window
        self.counters = counters
        self.batch_size = 1  # for messages: windows are named by the steps they cover
        self.cond = threading.Condition()
        self.error: ExchangeError | None = None

    # --- naming ---------------------------------------------------------------------------

    def describe(self, epoch: int, w: int | None) -> str:
        """The exchange of ``epoch``'s window ``w`` in words (None: before its first)."""
        if w is None:
            return f"exchange of epoch {epoch}, before window 0"
        if w == RESTORE:
            return f"restore of epoch {epoch} (its one window)"
        first, last = w * self.window, (w + 1) * self.window - 1
        return (
            f"exchange of epoch {epoch}, window {w} (steps {first // self.batch_size}-"
            f"{last // self.batch_size} at batch size {self.batch_size})"
        )

    def failure(self, epoch: int, w: int | None, exc: BaseException) -> ExchangeError:
        """``exc`` as an ExchangeError naming this rank, ``epoch`` and window ``w``."""
        if isinstance(exc, ExchangeError):
            return exc  # the Comm's, the one raiser in a window: its ``what`` is `describe`'s
        return ExchangeError(
            f"rank {self.rank} of {self.world_size}: {self.describe(epoch, w)} failed: {exc}"
        )

    def fail(self, exc: ExchangeError) -> None:
        """Keep the first failure, and tell this rank's readers at once."""
        if self.error is None:
            self.error = exc
        with contextlib.suppress(OSError):
            self.copies.fail(str(exc))

    def guarded(self, epoch: int, w: int | None, step: Callable[[], None]) -> None:
        """Run ``step``; any failure leaves as an ExchangeError naming rank, epoch, window."""
        try:
            step()
        except Exception as exc:
            error = self.failure(epoch, w, exc)
            if error is exc:
                raise
            raise error from exc

    # --- the background thread --------------------------------------------------------------

    def run(self, state: EpochState, previous: threading.Thread | None = None) -> None:
        """The thread body: every window of ``state``'s epoch, as the loader allows."""
        try:
            if previous is not None:
                previous.join()
            if self.error is not None:
                return
            self.guarded(state.epoch, None, lambda: self.strategy.prepare(state))
            for w in range(state.windows):
                with self.cond:
                    self.cond.wait_for(functools.partial(self.strategy.ready, state, w))
                state.window = w
                self.guarded(state.epoch, w, functools.partial(self._step, state, w))
        except BaseException as exc:  # kept, and raised in the training loop's thread
            self.fail(self.failure(state.epoch, state.window, exc))

    def _step(self, state: EpochState, w: int) -> None:
        transfers = self.strategy.transfers(state, w)
        if self.strategy.collective(transfers):
            self._exchange(state.epoch, w, transfers, settle=True)
        self.strategy.after(self.copies, state, w)

    def exchange(self, epoch: int, w: int, transfers: Transfers, settle: bool = True) -> None:
        """One window of ``transfers`` now, on the calling thread (a restore)."""
        self.guarded(epoch, w, lambda: self._exchange(epoch, w, transfers, settle))

    def _exchange(self, epoch: int, w: int, transfers: Transfers, settle: bool) -> None:
        timing = _Timing(time.perf_counter())
        sent, received = transfers.sent_by(self.rank), transfers.received_by(self.rank)
        sends = [self.copies.payload(sent.sample[sent.dst == d]) for d in range(self.world_size)]
        sizes = self.copies.sample_bytes
        recv_sizes = [
            int(sizes[received.sample[received.src == s]].sum()) for s in range(self.world_size)
        ]
        timing.read = time.perf_counter()
        parts = self.comm.all_to_all(sends, recv_sizes, self.describe(epoch, w))
        timing.collective = time.perf_counter()
        if len(received):
            name = f"e{epoch:05d}-w{w:06d}" if w >= 0 else f"e{epoch:05d}-r000000"
            self.copies.publish(name, received.sample, memoryview(b"".join(parts)))
        timing.written = time.perf_counter()
        c = self.counters
        out, into = sum(len(s) for s in sends), sum(recv_sizes)
        if settle:
            c.punched_bytes += self.strategy.settle(self.copies, sent, received)
            if self.strategy.mode == "move":  # what arrived is published before what left goes
                c.held += len(received) - len(sent)
                c.max_held = max(c.max_held, c.held)
                c.max_held_bytes = max(c.max_held_bytes, c.held_bytes + into)
                c.held_bytes += into - out
        self._count(timing, sent, received, out, into)

    def _count(self, t: _Timing, sent: Transfers, received: Transfers, out: int, into: int) -> None:
        c, now = self.counters, time.perf_counter()
        c.windows += 1
        c.samples_sent += len(sent)
        c.bytes_sent += out
        c.samples_received += len(received)
        c.bytes_received += into
        c.exchange_s += now - t.started
        c.read_s += t.read - t.started
        c.collective_s += t.collective - t.read
        c.write_s += t.written - t.collective
        c.delete_s += now - t.written
