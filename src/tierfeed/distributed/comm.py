"""Byte exchanges between ranks over torch.distributed, with timeouts and errors that name where.

Sample bytes travel on a gloo group of their own: training may use NCCL for gradients, and a
background thread's collectives must never interleave with the training loop's on one group.
torch is imported in the methods that use a group: `stage` without one and `tierfeed simulate`
import this module and never load torch.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Sequence
from typing import Literal

import numpy as np

from tierfeed.config import world_for
from tierfeed.errors import ConfigError, ExchangeError
from tierfeed.world import World

__all__ = ["Comm"]


class Comm:
    """One rank's end of a gloo group for sample bytes.

    Creating a Comm is itself a collective: every rank of the default group must create its
    Comms in the same order (as ``torch.distributed.new_group`` requires).

    Args:
        timeout_s: how long any collective on this group may wait for a peer before it fails
            (a peer that died fails it sooner: its socket closes).
    """

    def __init__(self, timeout_s: float = 120.0) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError(
                "torch.distributed is not initialized: call init_process_group first "
                "(torchrun sets the environment for it)"
            )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.timeout_s = timeout_s
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    def _fail(self, what: str, exc: BaseException) -> ExchangeError:
        return ExchangeError(
            f"rank {self.rank} of {self.world_size}: {what} failed: {exc}. A peer rank died, "
            f"stalled past {self.timeout_s:g} s or left the job; check its log, then restart "
            "every rank from the last checkpoint (the loader's state_dict resumes exactly)"
        )

    def all_to_all(
        self, sends: Sequence[bytes | memoryview], recv_sizes: Sequence[int], what: str
    ) -> list[memoryview]:
        """Send ``sends[d]`` to each rank d and receive ``recv_sizes[s]`` bytes from each rank s.

        Both sides know the sizes ahead (they follow from the schedule and the index), so one
        collective moves everything.

        Raises:
            ExchangeError: a peer died or timed out; names this rank and ``what``.
        """
        import torch
        import torch.distributed as dist

        send_sizes = [len(b) for b in sends]
        out = torch.empty(int(sum(recv_sizes)), dtype=torch.uint8)
        payload = b"".join(bytes(b) for b in sends)
        src = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if payload
            else torch.empty(0, dtype=torch.uint8)
        )
        try:
            dist.all_to_all_single(out, src, list(recv_sizes), send_sizes, group=self.group)
        except (RuntimeError, ValueError) as exc:
            raise self._fail(what, exc) from exc
        view = memoryview(out.numpy().data)
        starts = np.concatenate([[0], np.cumsum(recv_sizes)]).astype(np.int64)
        return [view[int(starts[s]) : int(starts[s + 1])] for s in range(self.world_size)]

    def world(self) -> World:
        """This group's rank and size as a World (ranks per node from torchrun's variables)."""
        return world_for(self.rank, self.world_size)

    def _reduce(self, values: Sequence[float], op: Literal["SUM", "MAX"], what: str) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64)
        try:
            reduce_op = dist.ReduceOp.SUM if op == "SUM" else dist.ReduceOp.MAX
            dist.all_reduce(t, op=reduce_op, group=self.group)
        except (RuntimeError, ValueError) as exc:
            raise self._fail(what, exc) from exc
        return [float(v) for v in t.tolist()]

    def sum(self, values: Sequence[float], what: str) -> list[float]:
        """Element-wise sum of ``values`` over all ranks."""
        return self._reduce(values, "SUM", what)

    def max(self, values: Sequence[float], what: str) -> list[float]:
        """Element-wise maximum of ``values`` over all ranks."""
        return self._reduce(values, "MAX", what)

    def barrier(self, what: str) -> None:
        """Wait for every rank (with this group's timeout)."""
        self.sum([0.0], what)

    def close(self) -> None:
        """Destroy the group; idempotent."""
        import torch.distributed as dist

        if self.group is not None and dist.is_initialized():
            with contextlib.suppress(RuntimeError, ValueError):
                dist.destroy_process_group(self.group)
        self.group = None

    def __enter__(self) -> Comm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
