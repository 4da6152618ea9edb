"""The exchanger: moves sample bytes between ranks in windows, on a background thread.

Two modes, chosen by the plan:

    fetch   (global and local plans over node-local storage) each window of an epoch is
            fetched ``ahead`` windows before the loader reaches it, and deleted once read.
    move    (partial(q)) the moves that build the next epoch's partitions are made in the
            window after the senders have read the samples; the receiver writes them into its
            inbox and the sender deletes its copy (a hole punched in its staged chunk, or a
            segment of its inbox), so a rank never holds more than its partition plus what it
            has received but not yet read.

Every collective runs on the Comm's own gloo group with its timeout. A failure is kept,
written into the inbox (readers in worker processes fail at once), and raised from the next
call the training loop makes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.comm import Comm
from tierfeed.distributed.holders import Holdings
from tierfeed.distributed.inbox import Inbox, punch_holes
from tierfeed.distributed.namespace import inbox_dir
from tierfeed.distributed.schedule import Transfers, fetch_transfers, move_transfers, num_windows
from tierfeed.errors import ChunkCorruptError, ConfigError, ExchangeError
from tierfeed.format.chunkfiles import DirectoryChunks
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.index import Index
from tierfeed.plan import Plan

__all__ = ["ExchangeCounters", "ExchangeOptions", "Exchanger"]

IntArray = npt.NDArray[np.int64]


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

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return dict(self.__dict__)


@dataclass
class _Epoch:
    epoch: int
    windows: int
    schedule: list[Transfers] | None = None  # move mode: all windows, computed on the thread
    orders: list[IntArray] = field(default_factory=list)  # fetch mode: every rank's order
    consumed: int = 0
    margin: int = 0
    ended: bool = False


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
        holdings: Holdings,
        options: ExchangeOptions | None = None,
    ) -> None:
        self.comm, self.plan, self.holdings = comm, plan, holdings
        self.options = options or ExchangeOptions()
        self.rank, self.world_size = comm.rank, comm.world_size
        self.mode = "move" if plan.spec.policy == "partial" else "fetch"
        self.index = Index(Path(local_dir))
        self.inbox = Inbox(inbox_dir(local_dir, self.rank))
        self.inbox.clear()  # a fresh job: what an earlier run received is not ours
        self._chunks = DirectoryChunks(self.index.path.parent, self.index.chunks(), self.index.path)
        self._local = holdings.local_to(self.rank)
        self._sizes = self.index.sample_bytes()
        self._sample_chunk = np.asarray(self.index.sample_chunk, dtype=np.int64)
        self._starts = np.asarray(self.index.sample_member_start, dtype=np.int64)
        self._lengths = np.asarray(self.index.member_length, dtype=np.int64)
        self.batch_size = 1  # for messages: windows are named by the steps they cover
        self.counters = ExchangeCounters()
        staged = self._local[self._sample_chunk]
        self.counters.held = self.counters.max_held = int(staged.sum())
        self._cond = threading.Condition()
        self._state: _Epoch | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # --- the training loop's side ---------------------------------------------------------

    def begin_epoch(self, epoch: int, start: int = 0, margin: int = 0) -> None:
        """Start the exchanges of ``epoch``; the loader has already consumed ``start``
        positions (a resumed epoch) and may read up to ``margin`` positions ahead of what it
        reports consumed (its workers' read-ahead)."""
        self._raise()
        if self._state is not None and not self._state.ended:
            self.finish()  # the previous epoch was left early: settle it first
        length = len(self.plan.order(epoch, self.rank, self.world_size))
        state = _Epoch(
            epoch, num_windows(length, self.options.window), consumed=start, margin=margin
        )
        if self.mode == "fetch":
            state.orders = [
                self.plan.order(epoch, r, self.world_size) for r in range(self.world_size)
            ]
        # The previous epoch's last moves may still be in flight: the new thread waits for
        # them before its own collectives, while this epoch's reads already begin (a sample
        # still on its way is waited for by the reader).
        previous = self._thread
        self._state = state
        self._thread = threading.Thread(
            target=self._run,
            args=(state, previous),
            name=f"tierfeed-exchange-{self.rank}",
            daemon=True,
        )
        self._thread.start()

    def consumed(self, epoch: int, positions: int) -> None:
        """The loader has delivered ``positions`` samples of ``epoch`` (since begin_epoch)."""
        self._raise()
        with self._cond:
            if self._state is not None and self._state.epoch == epoch:
                self._state.consumed = max(self._state.consumed, positions)
                self._cond.notify_all()

    def end_epoch(self, epoch: int) -> None:
        """The loader has read all of ``epoch`` (every rank calls it).

        Fetch plans finish and delete the epoch's segments. Partial plans let the epoch's
        last moves run on while the next epoch starts; `finish()` waits for them.
        """
        state = self._state
        if state is None or state.epoch != epoch:
            self._raise()
            return
        with self._cond:
            state.ended = True
            self._cond.notify_all()
        if self.mode == "fetch":
            self.finish()
            for name in self.inbox.segments():
                self.inbox.delete(name)
        self._raise()

    def finish(self) -> None:
        """Wait until every scheduled exchange is done (the next partitions are complete)."""
        state, thread = self._state, self._thread
        if state is not None:
            with self._cond:
                state.ended = True
                self._cond.notify_all()
        if thread is not None:
            windows = state.windows if state is not None else 1
            thread.join(self.options.timeout_s * (windows + 1))
            if thread.is_alive():
                self._fail(ExchangeError(f"rank {self.rank}: an exchange is stuck"))
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
        if self.mode != "move" or epoch == 0:
            return
        world, chunk = self.world_size, self._sample_chunk
        samples, srcs, dsts = [], [], []
        for dst in range(world):
            part = self.plan.partition(epoch, dst, world)
            away = part[self.holdings.holder[chunk[part]] != dst]
            samples.append(away)
            srcs.append(self.holdings.holder[chunk[away]])
            dsts.append(np.full(len(away), dst, dtype=np.int64))
        moves = Transfers.sorted(
            np.concatenate(samples), np.concatenate(srcs), np.concatenate(dsts)
        )
        self._window(epoch, -1, moves, discard=False)
        mine = self.plan.partition(epoch, self.rank, world)
        staged = np.flatnonzero(self._local[chunk])
        self._discard(np.setdiff1d(staged, mine))
        self.counters.held = self.counters.max_held = len(mine)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        with contextlib.suppress(OSError):
            self.inbox.fail(str(exc))

    # --- the background thread --------------------------------------------------------------

    def _ready(self, state: _Epoch, w: int) -> bool:
        if state.ended:
            return True
        window, consumed = self.options.window, state.consumed
        if self.mode == "fetch":
            return w * window < consumed + state.margin + self.options.ahead * window
        return (w + 1) * window + state.margin <= consumed

    def _run(self, state: _Epoch, previous: threading.Thread | None = None) -> None:
        try:
            if previous is not None:
                previous.join()
            if self._error is not None:
                return
            if self.mode == "move":
                state.schedule = move_transfers(
                    self.plan, state.epoch, self.world_size, self.options.window
                )
            for w in range(state.windows):
                with self._cond:
                    self._cond.wait_for(lambda w=w: self._ready(state, w))  # type: ignore[misc]
                transfers = self._transfers(state, w)
                if len(transfers):
                    self._window(state.epoch, w, transfers)
                if self.mode == "fetch":
                    self._forget_read(state)
        except BaseException as exc:  # kept, and raised in the training loop's thread
            self._fail(exc)

    def _transfers(self, state: _Epoch, w: int) -> Transfers:
        if state.schedule is not None:
            return state.schedule[w]
        a, b = w * self.options.window, (w + 1) * self.options.window
        return fetch_transfers(state.orders, a, b, self._sample_chunk, self.holdings)

    def _members(self, samples: IntArray) -> IntArray:
        if len(samples) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(self._starts[s], self._starts[s + 1]) for s in samples])

    def _member_bytes(self, member: int) -> bytes:
        length = int(self._lengths[member])
        data = self.inbox.view.read(member, length)
        if data is not None:
            return data
        chunk = int(self.index.member_chunk[member])
        if not self._local[chunk]:
            key = self.index.key(self.index.member_owner(member))
            raise ExchangeError(f"rank {self.rank} was scheduled to send {key!r} but holds no copy")
        data = self._chunks.read_range(chunk, int(self.index.member_offset[member]), length)
        if checksum_bytes(data) != int(self.index.member_checksum[member]):
            raise ChunkCorruptError(
                f"rank {self.rank}: chunk {self._chunks.root / self.index.chunk_name(chunk)} no "
                f"longer holds {self.index.key(self.index.member_owner(member))!r} (sent away "
                "before a restart, or damaged); run stage-in again before restoring"
            )
        return data

    def _window(self, epoch: int, w: int, transfers: Transfers, discard: bool = True) -> None:
        started = time.perf_counter()
        sent, received = transfers.sent_by(self.rank), transfers.received_by(self.rank)
        sends = [
            b"".join(self._member_bytes(m) for m in self._members(sent.sample[sent.dst == d]))
            for d in range(self.world_size)
        ]
        recv_sizes = [
            int(self._sizes[received.sample[received.src == s]].sum())
            for s in range(self.world_size)
        ]
        what = f"restore of epoch {epoch}"
        if w >= 0:
            first, last = w * self.options.window, (w + 1) * self.options.window - 1
            what = (
                f"exchange of epoch {epoch}, window {w} (steps {first // self.batch_size}-"
                f"{last // self.batch_size} at batch size {self.batch_size})"
            )
        t1 = time.perf_counter()
        parts = self.comm.all_to_all(sends, recv_sizes, what)
        t2 = time.perf_counter()
        if len(received):
            members = self._members(received.sample)
            self.inbox.write(
                f"e{epoch:05d}-w{max(w, 0):06d}" if w >= 0 else f"e{epoch:05d}-r000000",
                members,
                self._lengths[members],
                memoryview(b"".join(parts)),
            )
        t3 = time.perf_counter()
        if self.mode == "move" and discard:
            self._discard(sent.sample)
            c = self.counters
            c.held += len(received) - len(sent)
            c.max_held = max(c.max_held, c.held)
        c = self.counters
        c.windows += 1
        c.samples_sent += len(sent)
        c.bytes_sent += sum(len(s) for s in sends)
        c.samples_received += len(received)
        c.bytes_received += sum(recv_sizes)
        now = time.perf_counter()
        c.exchange_s += now - started
        c.read_s += t1 - started
        c.collective_s += t2 - t1
        c.write_s += t3 - t2
        c.delete_s += now - t3

    def _discard(self, samples: IntArray) -> None:
        """Delete this rank's copies of samples it has sent away."""
        members = self._members(samples)
        in_chunks = [m for m in members.tolist() if self.inbox.view.locate(m) is None]
        self.inbox.discard(members)
        by_chunk: dict[int, list[tuple[int, int]]] = {}
        for m in in_chunks:
            ranges = by_chunk.setdefault(int(self.index.member_chunk[m]), [])
            ranges.append((int(self.index.member_offset[m]), int(self._lengths[m])))
        for chunk, ranges in by_chunk.items():
            path = self.index.path.parent / self.index.chunk_name(chunk)
            self.counters.punched_bytes += punch_holes(path, ranges)

    def _forget_read(self, state: _Epoch) -> None:
        """Fetch mode: delete windows the loader has read (keeping its read-ahead margin)."""
        done = (state.consumed - state.margin) // self.options.window - 1
        for name in self.inbox.segments():
            e, w = name.split("-")
            if int(e[1:]) < state.epoch or (int(e[1:]) == state.epoch and int(w[1:]) < done):
                self.inbox.delete(name)

    def stats(self) -> dict[str, Any]:
        """Counters as plain values."""
        return self.counters.to_dict()

    def close(self) -> None:
        """Finish the running epoch's exchanges and release files."""
        with contextlib.suppress(ExchangeError):
            self.finish()
        self._chunks.close()
        self.inbox.close()
        self.index.close()

    def __enter__(self) -> Exchanger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
