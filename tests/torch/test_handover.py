"""Small tensors handed over by value: the same batches, in less time, whatever the collate
returns."""

from __future__ import annotations

import io
import pickle
from collections import namedtuple
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.torch.conftest import N
from tests.torch.test_loader import PermPlan, decode, values
from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader
from tierfeed.torch.handover import BY_VALUE_BYTES, accelerator_available, restore, ship

Pair = namedtuple("Pair", ["x", "y"])


def across(data: Any) -> Any:
    """``data`` shipped, pickled as a DataLoader worker pickles it, unpickled, restored."""
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(ship(data))
    return restore(pickle.loads(buf.getvalue()))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize(
    "data",
    [
        (torch.arange(64), torch.arange(64, dtype=torch.int32)),
        [torch.rand(8, 3), torch.zeros(0), torch.tensor(True)],
        {"image": torch.rand(4, 4).t(), "label": torch.tensor([1, 2]), "key": "a/b"},
        Pair(torch.arange(5, dtype=torch.float16), [torch.arange(3), 7]),
        (np.arange(4), torch.arange(4)),  # a collate's numpy array stays numpy
        torch.rand(BY_VALUE_BYTES // 4 + 1),  # too large: torch's shared memory
        torch.rand(3).to(torch.bfloat16),  # no numpy twin: torch's way
        torch.rand(3, requires_grad=True).detach().requires_grad_(True),
    ],
    ids=["tuple", "list", "dict", "namedtuple", "numpy", "large", "bfloat16", "grad"],
)
def test_a_batch_comes_back_as_it_was_sent(data: Any) -> None:
    back = across(data)
    if isinstance(data, torch.Tensor) and data.requires_grad:
        assert back.requires_grad and torch.equal(back.detach(), data.detach())
    else:
        assert same(data, back)


def test_only_small_cpu_tensors_go_by_value() -> None:
    shipped = ship((torch.arange(4), torch.rand(BY_VALUE_BYTES), np.arange(3), "s"))
    assert type(shipped[0]).__name__ == "_ByValue"
    assert isinstance(shipped[1], torch.Tensor)  # large
    assert isinstance(shipped[2], np.ndarray) and shipped[3] == "s"
    assert isinstance(ship(torch.arange(4), limit=8), torch.Tensor)  # 32 bytes > 8


def test_a_restored_tensor_is_writable_and_its_own() -> None:
    sent = torch.arange(8)
    back = across((sent,))[0]
    back += 1  # a writable tensor of its own, not a view of the sender's
    assert torch.equal(sent, torch.arange(8))


def decode_numpy(sample: Sample) -> tuple[np.ndarray, int]:
    return np.asarray([int(sample.fields["txt"])]), sample.label


def collate_numpy(items: list[tuple[np.ndarray, int]]) -> dict[str, Any]:
    return {
        "x": np.concatenate([x for x, _ in items]),
        "label": torch.tensor([y for _, y in items]),
    }


@pytest.mark.timeout(120)
def test_loader_workers_hand_over_tensors_and_leave_other_types_alone(store_dir: Path) -> None:
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode)
    loader = Loader(ds, num_workers=2)
    batches = list(loader)
    assert sorted(values(batches)) == list(range(N))
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.int64 for x, _ in batches)
    assert all(isinstance(y, torch.Tensor) for _, y in batches)
    loader.close()
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode_numpy, collate=collate_numpy)
    loader = Loader(ds, num_workers=2)
    batches_np = list(loader)
    loader.close()
    assert all(isinstance(b["x"], np.ndarray) for b in batches_np)  # the collate's numpy
    assert all(isinstance(b["label"], torch.Tensor) for b in batches_np)
    assert sorted(int(v) for b in batches_np for v in b["x"]) == list(range(N))


def decode_big(sample: Sample) -> dict[str, Any]:
    """A small tensor (by value), a large one (torch's shared memory), a number."""
    value = int(sample.fields["txt"])
    return {"small": torch.tensor([value]), "big": torch.full((20_000,), value), "n": value}


@pytest.mark.timeout(120)
@pytest.mark.skipif(accelerator_available(), reason="on an accelerator batches are pinned")
def test_pin_memory_without_an_accelerator_warns_and_delivers(store_dir: Path) -> None:
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode)
    with pytest.warns(UserWarning, match="no accelerator"):
        loader = Loader(ds, num_workers=2, pin_memory=True)
    with loader:
        assert sorted(values(list(loader))) == list(range(N))


@pytest.mark.timeout(180)
@pytest.mark.skipif(not accelerator_available(), reason="pinning needs an accelerator")
@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_pins_every_tensor_of_every_batch(store_dir: Path, workers: int) -> None:
    """DataLoader's pin thread saw only the worker's envelope: nothing was ever pinned."""
    ds = Dataset(store_dir, PermPlan(N), batch_size=16, decode=decode_big)
    with Loader(ds, num_workers=workers, pin_memory=True) as loader:
        batches = list(loader)
    assert sorted(int(v) for b in batches for v in b["small"]) == list(range(N))
    for b in batches:
        assert b["small"].is_pinned() and b["big"].is_pinned()
        assert b["big"].shape == (len(b["small"]), 20_000)
        on_gpu = b["big"].to("cuda", non_blocking=True)
        assert int(on_gpu[:, 0].sum()) == int(b["small"].sum())
