"""DevicePrefetcher: the order of copies, events, waits and record_stream, checked with fake
streams on the CPU; exact resume through it; and, on a CUDA device, the real thing."""

from __future__ import annotations

import contextlib
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tierfeed.errors import ConfigError
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, DevicePrefetcher, Loader

Pair = namedtuple("Pair", ["x", "y"])


class FakeStreams:
    """StreamOps that log every call: ``log`` is the order things happened in."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.active = "main"
        self.events = 0

    def side_stream(self, device: torch.device) -> Any:
        return "side"

    def current_stream(self, device: torch.device) -> Any:
        return self.active

    @contextlib.contextmanager
    def using(self, stream: Any) -> Iterator[None]:
        before, self.active = self.active, stream
        self.log.append(("enter", stream))
        try:
            yield
        finally:
            self.active = before
            self.log.append(("leave", stream))

    def record_event(self, stream: Any) -> Any:
        self.events += 1
        self.log.append(("record", stream, self.events))
        return self.events

    def wait_event(self, stream: Any, event: Any) -> None:
        self.log.append(("wait", stream, event))

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        self.log.append(("record_stream", int(tensor.flatten()[0]), stream))

    def pin(self, data: Any) -> Any:
        self.log.append(("pin",))
        return data


def batches(n: int) -> list[Any]:
    return [
        {"a": torch.full((2,), 10 * i), "pair": Pair(torch.full((1,), 10 * i + 1), f"k{i}")}
        for i in range(n)
    ]


def test_each_batch_waits_for_its_own_copy_and_is_marked_for_the_consumer() -> None:
    ops = FakeStreams()
    out = []
    for i, batch in enumerate(DevicePrefetcher(batches(4), "cpu", depth=2, ops=ops)):
        out.append(batch)
        ops.log.append(("used", i))
    assert [int(b["a"][0]) for b in out] == [0, 10, 20, 30]
    assert [b["pair"].y for b in out] == ["k0", "k1", "k2", "k3"]  # non-tensors untouched
    assert isinstance(out[0]["pair"], Pair)
    log = ops.log
    for i in range(4):
        event = i + 1  # batch i's copy recorded event i + 1, on the side stream
        recorded = log.index(("record", "side", event))
        waited = log.index(("wait", "main", event))
        used = log.index(("used", i))
        assert log[recorded - 1] != ("leave", "side")  # recorded inside the side stream
        assert recorded < waited < used  # the consumer's stream waits before the step
        marks = [e for e in log[waited:used] if e[0] == "record_stream"]
        assert sorted(m[1] for m in marks) == [10 * i, 10 * i + 1]
        assert all(m[2] == "main" for m in marks)  # marked for the consumer's stream
        assert not any(e == ("wait", "main", event) for e in log[:waited])


def test_the_next_copy_is_queued_before_the_step_and_depth_bounds_it() -> None:
    ops = FakeStreams()
    it = iter(DevicePrefetcher(batches(5), "cpu", depth=2, ops=ops))
    next(it)
    # batch 0 handed out: batches 1 and 2 are copying (depth 2), 3 is not asked for yet
    assert [e[2] for e in ops.log if e[0] == "record"] == [1, 2, 3]
    next(it)
    assert [e[2] for e in ops.log if e[0] == "record"] == [1, 2, 3, 4]
    assert sum(1 for e in ops.log if e[0] == "pin") == 4


def test_on_device_runs_on_the_side_stream_after_the_copy() -> None:
    ops = FakeStreams()
    seen: list[str] = []

    def decode(batch: Any) -> Any:
        seen.append(ops.active)
        return {**batch, "decoded": batch["a"] + 1}

    out = list(DevicePrefetcher(batches(2), "cpu", depth=1, ops=ops, on_device=decode))
    assert seen == ["side", "side"]
    assert [int(b["decoded"][0]) for b in out] == [1, 11]


def test_on_cpu_batches_pass_through() -> None:
    data = batches(3)
    out = list(DevicePrefetcher(data, "cpu"))
    assert all(o["a"] is d["a"] for o, d in zip(out, data, strict=True))


def test_refusals() -> None:
    with pytest.raises(ConfigError, match="depth"):
        DevicePrefetcher([], "cpu", depth=0)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            DevicePrefetcher([], "cuda")


def number(sample: Sample) -> int:
    return int(sample.fields["txt"])


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_is_where_the_handed_out_batches_end(store_dir: Path, workers: int) -> None:
    """Batches copied ahead are not delivered yet: a resume from the prefetcher's state
    delivers them again, and every sample once."""
    ds = Dataset(store_dir, plan="global", batch_size=8, decode=number)
    with Loader(ds, num_workers=workers) as loader:
        pre = DevicePrefetcher(loader, "cpu", depth=2, ops=FakeStreams())
        assert len(pre) == len(loader)
        seen: list[int] = []
        for i, batch in enumerate(pre):
            seen += batch.tolist()
            if i == 3:
                state = pre.state_dict()
                break
    ds2 = Dataset(store_dir, plan="global", batch_size=8, decode=number)
    with Loader(ds2, num_workers=workers) as loader2:
        pre2 = DevicePrefetcher(loader2, "cpu", depth=2, ops=FakeStreams())
        pre2.load_state_dict(state)
        rest = [x for batch in pre2 for x in batch.tolist()]
    assert sorted(seen + rest) == list(range(120))


def test_a_state_is_made_only_when_asked_for(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader's state costs O(samples of the rank): the prefetcher marks each batch it
    copies ahead (`Loader.mark`) and makes a state only when `state_dict` is called (that it
    is where the handed-out batches end: `test_state_dict_is_where_the_handed_out_batches_end`)."""
    ds = Dataset(store_dir, plan="global", batch_size=8, decode=number)
    made: list[dict[str, Any]] = []
    real = Loader.state_dict

    def counted(self: Loader, mark: Any = None) -> dict[str, Any]:
        made.append(real(self, mark))
        return made[-1]

    monkeypatch.setattr(Loader, "state_dict", counted)
    with Loader(ds, num_workers=0) as loader:
        pre = DevicePrefetcher(loader, "cpu", depth=2, ops=FakeStreams())
        for handed, _ in enumerate(pre, 1):
            if handed == 5:
                break
        assert made == []  # seven batches taken from the loader, no state made
        state = pre.state_dict()
    assert len(made) == 1 and state == made[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_batches_arrive_on_the_device_intact(store_dir: Path) -> None:
    ds = Dataset(store_dir, plan="global", batch_size=8, decode=number)
    with Loader(ds, num_workers=2) as loader:
        got = []
        for batch in DevicePrefetcher(loader, "cuda", depth=2):
            assert batch.device.type == "cuda"
            got += (batch * 2).tolist()  # used on the current stream at once
    assert sorted(got) == [2 * i for i in range(120)]
