"""The window executor names rank, epoch and window in every failure it raises."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tierfeed.distributed.exchanger import ExchangeCounters
from tierfeed.distributed.strategies import EpochState
from tierfeed.distributed.windows import RESTORE, WindowExecutor
from tierfeed.errors import ExchangeError, StorageError


class _Strategy:
    mode = "fetch"
    keeps_epochs_apart = True

    def prepare(self, state: EpochState) -> None:
        return None

    def ready(self, state: EpochState, w: int) -> bool:
        return True

    def transfers(self, state: EpochState, w: int) -> Any:
        if w == 2:
            raise StorageError("chunk 7: read failed")
        return []

    def collective(self, transfers: Any) -> bool:
        return len(transfers) > 0

    def after(self, copies: Any, state: EpochState, w: int) -> None:
        return None


def _executor() -> tuple[WindowExecutor, list[str]]:
    notes: list[str] = []
    comm: Any = SimpleNamespace(rank=1, world_size=4)
    copies: Any = SimpleNamespace(fail=notes.append)
    ex = WindowExecutor(comm, copies, _Strategy(), 16, ExchangeCounters())  # type: ignore[arg-type]
    ex.batch_size = 4
    return ex, notes


def test_a_failure_in_a_window_names_rank_epoch_and_window() -> None:
    ex, notes = _executor()
    ex.run(EpochState(epoch=3, windows=5))
    assert isinstance(ex.error, ExchangeError)
    message = str(ex.error)
    assert "rank 1 of 4" in message and "epoch 3, window 2" in message
    assert "steps 8-11" in message and "chunk 7: read failed" in message
    assert notes == [message]  # readers in worker processes fail at once


def test_restore_and_setup_are_named_too() -> None:
    ex, _ = _executor()
    with pytest.raises(ExchangeError, match="rank 1 of 4: restore of epoch 5"):
        ex.guarded(5, RESTORE, lambda: (_ for _ in ()).throw(OSError("disk full")))
    assert "before window 0" in str(ex.failure(2, None, ValueError("x")))
    comm_error = ExchangeError("rank 1 of 4: exchange of epoch 2, window 0 (...) failed: gone")
    assert ex.failure(2, 0, comm_error) is comm_error  # the Comm's own, named already
