"""Writers take the labels users have (issue 46, item 8): a numpy scalar, a 0-d array or tensor
and a bool are stored as the Python number they hold and read back as it (a bool in ``cls`` as
1 or 0); `optimize` runs a function of a program read from stdin or given by ``python -c``; a
worker that cannot load ``fn``, or is killed, says why."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tierfeed import Writer, open_store, optimize
from tierfeed.errors import ConfigError, PackError
from tierfeed.format import workerstart
from tierfeed.format.layout import INDEX_NAME
from tierfeed.torch import Dataset, Loader, MapDataset

pytestmark = pytest.mark.timeout(120)

# name (the sample's key) -> (field, a factory of the value, what decode="auto" reads back)
CASES: dict[str, tuple[str, Callable[[], Any], Any]] = {
    "cls-np-int64": ("cls", lambda: np.int64(3), 3),
    "cls-np-uint8": ("cls", lambda: np.uint8(7), 7),
    "cls-np-0d-array": ("cls", lambda: np.array(4), 4),
    "cls-torch-0d": ("cls", lambda: torch.tensor(3), 3),
    "cls-bool": ("cls", lambda: True, 1),
    "cls-np-bool": ("cls", lambda: np.bool_(False), 0),
    "cls-torch-bool": ("cls", lambda: torch.tensor(True), 1),
    "cls2-np-int32": ("cls2", lambda: np.int32(2), 2),
    "txt-np-float32": ("txt", lambda: np.float32(0.5), "0.5"),
    "txt-np-float32-inexact": ("txt", lambda: np.float32(0.1), "0.10000000149011612"),
    "txt-np-float64": ("txt", lambda: np.float64(0.1), "0.1"),  # a float, whose repr is numpy's
    "txt-torch-float": ("txt", lambda: torch.tensor(0.25), "0.25"),
    "txt-np-int16": ("txt", lambda: np.int16(-2), "-2"),
    "txt-bool": ("txt", lambda: True, "True"),
    "json-np-int64": ("json", lambda: np.int64(3), 3),
    "json-np-float32": ("json", lambda: np.float32(0.5), 0.5),
    "json-np-bool": ("json", lambda: np.bool_(True), True),
    "json-torch-0d": ("json", lambda: torch.tensor(5), 5),
    "json-nested": (
        "json",
        lambda: {"n": np.int64(2), "ok": np.bool_(False), "x": [torch.tensor(1.5)]},
        {"n": 2, "ok": False, "x": [1.5]},
    ),
    "npy-np-float32": ("npy", lambda: np.float32(0.5), np.array(0.5, np.float32)),
}
NAMES = sorted(CASES)


def case_sample(i: int) -> dict[str, Any]:
    """Module level: optimize's spawned workers import it."""
    field, make, _ = CASES[NAMES[i]]
    return {"__key__": NAMES[i], field: make()}


def check(name: str, fields: dict[str, Any]) -> None:
    """``fields`` (decoded) hold case ``name``'s value as a user expects it back."""
    field, _, want = CASES[name]
    got = fields[field]
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == ()
        assert got == want
    else:
        assert got == want and type(got) is type(want), (name, got)
    assert fields["__label__"] == (want if field in ("cls", "cls2") else -1)


@pytest.mark.parametrize("name", NAMES)
def test_a_writer_stores_the_number_and_reads_it_back(tmp_path: Path, name: str) -> None:
    with Writer(tmp_path / "st") as w:
        w.write(case_sample(NAMES.index(name)))
    check(name, MapDataset(tmp_path / "st", decode="auto")[0])


def test_optimize_stores_them_too_read_through_a_dataset(tmp_path: Path) -> None:
    optimize(case_sample, list(range(len(NAMES))), tmp_path / "st", workers=2)
    ds = Dataset(tmp_path / "st", batch_size=len(NAMES), decode="auto")
    with Loader(ds) as loader:
        (batch,) = list(loader)
    for j, key in enumerate(batch["__key__"]):
        fields = {name: values[j] for name, values in batch.items()}
        fields["__label__"] = int(fields["__label__"])
        check(key, fields)
    assert sorted(batch["__key__"]) == NAMES


def test_arrays_with_dims_and_floats_are_still_no_label(tmp_path: Path) -> None:
    """Refused as before, the message now saying which numbers a cls field takes."""
    for value in (np.float32(1.0), torch.tensor(1.5), np.array([3]), torch.tensor([3])):
        says = f"'cls' is a {type(value).__name__}; .* int or bool .*numpy and 0-d torch"
        with pytest.raises(PackError, match=says), Writer(tmp_path / "st", overwrite=True) as w:
            w.write({"__key__": "k", "cls": value})


SCRIPT = """
import functools, sys
import numpy as np
import tierfeed
from tierfeed.errors import TierfeedError

def make(i, scale):
    return {"__key__": f"k{i:03d}", "cls": np.int64(i % 3), "txt": str(i * scale)}

try:
    report = tierfeed.optimize(functools.partial(make, scale=2), list(range(10)), sys.argv[-1])
except TierfeedError as exc:
    sys.exit(str(exc))
print("samples", report.samples)
"""


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_optimize_runs_a_function_of_a_program_of_no_file(tmp_path: Path, how: str) -> None:
    """Spawned workers can import neither ``<stdin>`` nor a ``-c`` program's functions."""
    dst = tmp_path / "st"
    args = ["-", str(dst)] if how == "stdin" else ["-c", SCRIPT, str(dst)]
    done = subprocess.run(
        [sys.executable, *args],
        input=SCRIPT if how == "stdin" else None,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=100,
    )
    assert "Traceback" not in done.stderr and "died" not in done.stderr, done.stderr
    if sys.platform == "darwin" or "fork" not in mp.get_all_start_methods():
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
        assert "worker processes cannot import" in done.stderr and not dst.exists()
        return
    assert done.returncode == 0 and done.stdout.strip() == "samples 10", done.stderr
    with open_store(dst) as store:
        assert [store.read_sample(i).label for i in range(10)] == [i % 3 for i in range(10)]
        assert store.read_sample(7).fields["txt"] == b"14"


def test_where_fork_is_not_used_it_fails_at_once_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "__file__", "<stdin>", raising=False)
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(ConfigError) as caught:
        optimize(case_sample, [0, 1], tmp_path / "st", workers=1)
    message = str(caught.value)
    assert "\n" not in message and "'<stdin>'" in message and "tierfeed.Writer" in message
    assert not (tmp_path / "st").exists()


def refuse_to_load() -> Any:
    raise RuntimeError("this fn loads in no worker")


class LoadsNowhere:
    """Pickles in the parent; unpickling it in a worker raises."""

    def __call__(self, i: int) -> dict[str, Any]:
        return {"txt": "x"}

    def __reduce__(self) -> tuple[Callable[[], Any], tuple[()]]:
        return refuse_to_load, ()


def killed_at_three(i: int) -> dict[str, Any]:
    if i == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"__key__": f"k{i}", "txt": "x"}


def test_a_worker_says_why_it_could_not_load_fn_or_what_killed_it(tmp_path: Path) -> None:
    with pytest.raises(PackError, match=r"cannot load fn \(RuntimeError: this fn loads in no"):
        optimize(LoadsNowhere(), [1, 2], tmp_path / "a", workers=1)
    with pytest.raises(PackError, match=r"worker 0 died \(exit code -9, killed by SIGKILL"):
        optimize(killed_at_three, list(range(8)), tmp_path / "b", workers=2)
    assert not (tmp_path / "a" / INDEX_NAME).exists()


def test_a_partial_of_a_main_function_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a notebook gives: ``fn`` itself from a module, what it holds from __main__."""
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.delattr(main, "__file__", raising=False)
    monkeypatch.setattr(case_sample, "__module__", "__main__")
    monkeypatch.setattr(sys, "platform", "linux")  # where fork is used
    fn = functools.partial(len, [case_sample])
    assert workerstart.start_method(fn, "spawn") == "fork"
    assert workerstart.start_method(len, "spawn") == "spawn"
