"""`DevicePrefetcher`: batches on the device one or two steps ahead of the training step.

Each batch a loader yields is pinned (page-locked) and copied to the device on a side CUDA
stream while the step before it runs on the training stream; an event recorded after the copy
is what the training stream waits on before the batch is handed out (so the step never reads a
half-copied batch, and never waits on the copy of a later one), and every tensor of the batch
is marked as used by the training stream (``record_stream``) so that the caching allocator
does not hand its memory to the side stream's next copy while the step still reads it. An
``on_device`` function (a `DeviceJpegDecoder`) runs on the side stream after the copy, so a
device decode overlaps the step too.

On the CPU it passes batches through (``on_device`` applied): the same training loop runs on
both. The streams and events are reached through a `StreamOps`, so the ordering is tested on
the CPU with fakes that record it.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from tierfeed.errors import ConfigError
from tierfeed.torch.handover import map_leaves, pin

__all__ = ["CudaStreams", "DevicePrefetcher", "StreamOps", "tensors_of"]


class StreamOps(Protocol):
    """The stream operations the prefetcher uses (`CudaStreams` on CUDA; fakes in tests)."""

    def side_stream(self, device: torch.device) -> Any: ...
    def current_stream(self, device: torch.device) -> Any: ...
    def using(self, stream: Any) -> contextlib.AbstractContextManager[Any]: ...
    def record_event(self, stream: Any) -> Any: ...
    def wait_event(self, stream: Any, event: Any) -> None: ...
    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None: ...
    def pin(self, data: Any) -> Any: ...


class CudaStreams:
    """`StreamOps` of torch.cuda."""

    def side_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def using(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        if tensor.device.type == "cuda":
            tensor.record_stream(stream)

    def pin(self, data: Any) -> Any:
        return pin(data)


def tensors_of(data: Any) -> list[torch.Tensor]:
    """The tensors in ``data``'s plain containers (tuple, namedtuple, list, dict)."""
    found: list[torch.Tensor] = []
    map_leaves(data, lambda x: found.append(x) if isinstance(x, torch.Tensor) else None)
    return found


class DevicePrefetcher:
    """Iterate ``loader``'s batches with their tensors already on ``device``.

    Tensors inside tuples, namedtuples, lists and dicts are moved; anything else (keys, a
    `JpegBatch` for ``on_device``) passes unchanged. ``len``, ``set_epoch``, ``state_dict`` and
    ``load_state_dict`` are the loader's; ``state_dict`` says where the batches handed out so
    far end (not the ones copied ahead), so a resume repeats none and skips none.

    Args:
        loader: a `tierfeed.torch.Loader` (or any iterable of batches).
        device: where the batches go: ``"cuda"``, ``"cuda:1"``; on ``"cpu"`` they pass
            through.
        depth: batches copied ahead of the one the step uses (1 or 2 is enough).
        on_device: applied to each batch after its copy, on the copying stream (e.g. a
            `DeviceJpegDecoder`).
        ops: the stream operations (default: torch.cuda's, on a CUDA device).

    Raises:
        ConfigError: ``depth < 1``, or a CUDA device where CUDA is not available.
    """

    def __init__(
        self,
        loader: Any,
        device: str | torch.device = "cuda",
        depth: int = 2,
        on_device: Callable[[Any], Any] | None = None,
        ops: StreamOps | None = None,
    ) -> None:
        if depth < 1:
            raise ConfigError(f"DevicePrefetcher(depth={depth}): give 1 or more")
        self.loader, self.device, self.depth = loader, torch.device(device), depth
        self.on_device = on_device
        if ops is None and self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(
                    f"DevicePrefetcher(device={str(self.device)!r}): CUDA is not available "
                    "here; give device='cpu' to pass batches through"
                )
            ops = CudaStreams()
        self.ops = ops
        # The loader's state after the last batch handed out, made when asked for (a state costs
        # O(samples of the rank): not one a batch).
        self._state: Callable[[], dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def set_epoch(self, epoch: int) -> None:
        """The loader's `set_epoch`."""
        self._state = None
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the batches handed out so far."""
        return self._state() if self._state is not None else dict(self.loader.state_dict())

    def load_state_dict(self, state: Any) -> None:
        """The loader's `load_state_dict`."""
        self._state = None
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """The loader's ``close`` (when it has one)."""
        close = getattr(self.loader, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _snapshot(self) -> Callable[[], dict[str, Any]] | None:
        """The loader's state as it stands now, to be made when asked for: from a cheap `mark`
        where the loader has one (a `tierfeed.torch.Loader`), else taken now."""
        mark = getattr(self.loader, "mark", None)
        if callable(mark):
            where = mark()
            return lambda: dict(self.loader.state_dict(where))
        state = getattr(self.loader, "state_dict", None)
        if not callable(state):
            return None
        taken = dict(state())
        return lambda: taken

    def __iter__(self) -> Iterator[Any]:
        self._state = None
        source = iter(self.loader)
        try:
            if self.ops is None:
                yield from self._passed(source)
            else:
                yield from self._ahead(source, self.ops)
        finally:
            self._state = None
            close = getattr(source, "close", None)
            if callable(close):
                close()  # left early: the loader's epoch is left early too

    def _passed(self, source: Iterator[Any]) -> Iterator[Any]:
        """CPU (or a device without streams): each batch moved (and decoded) in turn."""
        for data in source:
            self._state = self._snapshot()
            moved = map_leaves(data, lambda x: _moved(x, self.device, False))
            yield self.on_device(moved) if self.on_device is not None else moved

    def _ahead(self, source: Iterator[Any], ops: StreamOps) -> Iterator[Any]:
        """Keep ``depth`` batches copying on the side stream; hand each out once the training
        stream waits for its copy, and after the next one's copy is queued."""
        side = ops.side_stream(self.device)
        queued: deque[tuple[Any, Any, Callable[[], dict[str, Any]] | None]] = deque()

        def fill() -> None:
            while len(queued) < self.depth:
                data = next(source, _END)
                if data is _END:
                    return
                state = self._snapshot()
                host = ops.pin(data)
                with ops.using(side):
                    moved = map_leaves(host, lambda x: _moved(x, self.device, True))
                    if self.on_device is not None:
                        moved = self.on_device(moved)
                    queued.append((moved, ops.record_event(side), state))

        fill()
        while queued:
            data, copied, state = queued.popleft()
            current = ops.current_stream(self.device)
            ops.wait_event(current, copied)
            for tensor in tensors_of(data):
                ops.record_stream(tensor, current)
            fill()
            self._state = state
            yield data


_END = object()


def _moved(x: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=non_blocking)
    return x
