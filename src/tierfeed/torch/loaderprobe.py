"""The loader half of `tierfeed simulate --calibrate`: the job's ranks of one node read the
store's first chunks through `tierfeed.torch.Loader` at once, a cold epoch into one empty disk
tier and then warm ones, as the job will.

Each rank is a process of its own (``python -m tierfeed.torch.loaderprobe``), told to start
together; each marks, per epoch, when it began, its first batch and its end, with the node's
busy CPU seconds at each (/proc/stat: the kernel's file system client and a local origin's
server count as a cold byte's cost too). `node_figures` makes the node's figures of them: the
first batch of the last rank, and from the first batch on, samples, seconds and CPU seconds
(a global shuffle's cold epoch is not steady: its first batches wait for the copies of nearly
every chunk, its last ones find them landed, so it is taken whole, past its start).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError
from tierfeed.storage.store import Sample

__all__ = ["node_cpu_s", "node_figures", "run_ranks"]

READY_S = 120.0  # a rank opens its store within this
EPOCHS = 3  # a cold epoch, then two warm ones (the faster warm one is kept)


def node_cpu_s() -> float:
    """CPU seconds the whole node has spent busy, every process and the kernel's."""
    with open("/proc/stat", "rb") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _length(sample: Sample) -> int:
    """The probe's decode: nothing but the sample's size (a user's decode is `--decode-ms`)."""
    return sum(len(v) for v in sample.fields.values())


def _mark(n: int) -> dict[str, float]:
    return {"t": time.time(), "cpu": node_cpu_s(), "n": float(n)}


def _epoch(loader: Any) -> dict[str, dict[str, float]]:
    """One epoch's marks: its begin, its first batch, its end."""
    marks = {"begin": _mark(0)}
    n = 0
    for batch in loader:
        n += len(batch)
        if "first" not in marks:
            marks["first"] = _mark(n)
    marks["end"] = _mark(n)
    marks.setdefault("first", marks["end"])
    return marks


def rank_main(argv: list[str] | None = None) -> None:
    """One rank of the probe (run by `run_ranks`)."""
    p = argparse.ArgumentParser()
    for name in ("store", "samples", "cache", "ready", "go", "out"):
        p.add_argument(f"--{name}", required=True)
    for name in ("rank", "world", "workers", "batch-size"):
        p.add_argument(f"--{name}", type=int, required=True)
    a = p.parse_args(argv)
    import torch

    from tierfeed.torch import Dataset, Loader, TierConfig
    from tierfeed.world import World

    torch.set_num_threads(1)
    ids = np.load(a.samples)
    ds = Dataset(
        a.store,
        "global",
        batch_size=a.batch_size,
        decode=_length,
        tiers=TierConfig(disk_dir=a.cache),
        samples=ids,
        world=World(a.rank, a.world, a.rank, a.world),
    )
    with Loader(ds, num_workers=a.workers) as loader:
        Path(a.ready).touch()
        _wait_for([Path(a.go)], "the probe's ranks were not all ready in time")
        epochs = []
        for e in range(EPOCHS):
            epochs.append(_epoch(loader))
            _all_done(Path(a.go).parent, e, a.rank, a.world)
    Path(a.out).write_text(json.dumps(epochs))


def _all_done(scratch: Path, epoch: int, rank: int, ranks: int) -> None:
    """Mark this rank's ``epoch`` done and wait (bounded) until every rank's is: ranks begin
    each epoch together, as a job's ranks do when every step waits for all of them. Begun
    apart, a rank's warm epoch ran beside another's cold end, and the node's warm figures
    counted both (docs/BENCHMARKS.md, "After the crowded-node changes")."""
    (scratch / f"done{epoch}.{rank}").touch()
    marks = [scratch / f"done{epoch}.{r}" for r in range(ranks)]
    _wait_for(marks, f"the probe's ranks did not all end epoch {epoch} in time")


def _wait_for(paths: list[Path], late: str) -> None:
    """Until every one of ``paths`` exists, at most `READY_S`; past it a ConfigError saying
    ``late``."""
    deadline = time.monotonic() + READY_S
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise ConfigError(late)
        time.sleep(0.002)


def _start_rank(
    scratch: Path, store: str, rank: int, ranks: int, workers: int, batch_size: int
) -> subprocess.Popen[bytes]:
    """Rank ``rank``'s process; what it says goes to a file (a pipe nobody reads could fill)."""
    options = {
        "store": store,
        "samples": scratch / "ids.npy",
        "cache": scratch / "cache",
        "ready": scratch / f"ready{rank}",
        "go": scratch / "go",
        "out": scratch / f"out{rank}",
        "rank": rank,
        "world": ranks,
        "workers": workers,
        "batch-size": batch_size,
    }
    argv = [sys.executable, "-m", "tierfeed.torch.loaderprobe"]
    for name, value in options.items():
        argv += [f"--{name}", str(value)]
    with open(scratch / f"err{rank}", "wb") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)


def run_ranks(
    store: str,
    ids: npt.NDArray[np.int64],
    ranks: int,
    workers: int,
    batch_size: int,
    timeout_s: float,
) -> tuple[float, list[list[dict[str, dict[str, float]]]]]:
    """``ranks`` rank processes over the samples ``ids``; the go time and each rank's marks."""
    with tempfile.TemporaryDirectory(prefix="tierfeed-calibrate-") as scratch:
        s = Path(scratch)
        np.save(s / "ids.npy", ids)
        procs = [_start_rank(s, store, r, ranks, workers, batch_size) for r in range(ranks)]
        try:
            deadline = time.monotonic() + timeout_s
            while not all((s / f"ready{r}").exists() for r in range(ranks)):
                _check(s, procs, deadline)
                time.sleep(0.01)
            (s / "go").touch()
            started = time.time()
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                _check(s, procs, deadline)
            return started, [json.loads((s / f"out{r}").read_text()) for r in range(ranks)]
        except subprocess.TimeoutExpired:
            raise ConfigError(f"the probe's ranks did not end in {timeout_s:.0f} s") from None
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def _check(scratch: Path, procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    """A rank that failed, in its last line; past the deadline, a timeout."""
    for rank, proc in enumerate(procs):
        if proc.poll():
            said = (scratch / f"err{rank}").read_text(errors="replace").strip().splitlines()
            raise ConfigError(f"a rank of the probe failed: {(said or ['no message'])[-1]}")
    if time.monotonic() > deadline:
        raise subprocess.TimeoutExpired("probe", 0)


def node_figures(go: float, ranks: list[list[dict[str, dict[str, float]]]]) -> dict[str, float]:
    """The node's figures per epoch (``cold_``, ``warm_``: the faster warm epoch): the last
    rank's first batch from the epoch's begin and the node's CPU until then; and from the
    first rank's first batch to the last rank's end (the epoch past its start), samples,
    seconds and the node's CPU seconds."""
    out: dict[str, float] = {}
    per_epoch = []
    for e in range(len(ranks[0])):
        marks = [r[e] for r in ranks]
        begin = go if e == 0 else max(m["begin"]["t"] for m in marks)
        cpu0 = min(m["begin"]["cpu"] for m in marks)
        first = min(marks, key=lambda m: m["first"]["t"])["first"]
        last_first = max(marks, key=lambda m: m["first"]["t"])["first"]
        end = max(marks, key=lambda m: m["end"]["t"])["end"]
        per_epoch.append(
            {
                "first_s": last_first["t"] - begin,
                "first_cpu_s": last_first["cpu"] - cpu0,
                "s": end["t"] - begin,
                "samples": sum(m["end"]["n"] for m in marks),
                "steady_samples": sum(m["end"]["n"] for m in marks) - first["n"],
                "steady_s": end["t"] - first["t"],
                "steady_cpu_s": end["cpu"] - first["cpu"],
            }
        )
    warm = min(per_epoch[1:], key=lambda f: f["s"]) if len(per_epoch) > 1 else per_epoch[0]
    out.update({f"cold_{k}": v for k, v in per_epoch[0].items()})
    out.update({f"warm_{k}": v for k, v in warm.items()})
    return out


if __name__ == "__main__":
    rank_main()
