"""The deadline guard against a heavy tail: 0.01% of reads stall 2 s; guard on, off, no stalls.

Usage:
    python bench/guard_bench.py [--samples 20000] [--epochs 2] [--workers 2] [--step-ms 0]

A store of random 20 KB samples is served by `tierfeed slowfs` with direct I/O (every read
reaches the latency model): median 0.2 ms per operation, and in the stall runs one operation
in 10,000 stalls 2 s. tierfeed's Loader reads it with the guard off (the plan's exact order),
on (adaptive deadline, late reads deferred and hedged), and on with no stalls at all;
``--step-ms`` sleeps that long per batch, as a training step would (CPU left free).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from tierfeed.format.pack import PackOptions, pack
from tierfeed.latency import LatencyModel
from tierfeed.loader import DeadlineOptions, PrefetchOptions
from tierfeed.slowfs import SlowFS, SlowFSOptions
from tierfeed.storage.store import Sample
from tierfeed.synth import SynthSpec, make_imagefolder
from tierfeed.torch import Dataset, Loader


def decode(sample: Sample) -> torch.Tensor:
    return torch.tensor(len(sample.fields["jpg"]))


def run(
    store: Path, guard: DeadlineOptions, epochs: int, workers: int, name: str, step_s: float
) -> None:
    ds = Dataset(store, "global", batch_size=64, decode=decode,
                 prefetch=PrefetchOptions(window=256, threads=32), deadline=guard)  # fmt: skip
    with Loader(ds, num_workers=workers, system=name) as loader:
        read_epochs(loader, epochs, name, step_s)


def read_epochs(loader: Loader, epochs: int, name: str, step_s: float) -> None:
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            if step_s > 0:
                time.sleep(step_s)  # a training step: the accelerator computes, the CPU is free
        r = loader.last_epoch
        assert r is not None
        w = r["batch_wait"]
        print(json.dumps({"run": name, "epoch": epoch, "seconds": round(r["seconds"], 2),
                          "samples_per_s": round(r["samples_per_s"]),
                          "p50_ms": round(w["p50"] * 1e3, 2), "p99_ms": round(w["p99"] * 1e3, 1),
                          "p99.99_ms": round(w["p99.99"] * 1e3, 1),
                          "max_ms": round(w["max"] * 1e3, 1),
                          "first_batch_ms": round(r["first_batch_s"] * 1e3, 1),
                          "slowest_ms": [[s["batch"], round(s["wait_s"] * 1e3, 1)]
                                         for s in r["slowest"][:3]],
                          "stall_s": round(r["stall_s"], 3), "guard": r["guard"]}),
              flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated step per batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = SynthSpec(classes=20, per_class=args.samples // 20, median_bytes=20_000, sigma=0.3)
        make_imagefolder(work / "raw", spec)
        pack(work / "raw", work / "origin" / "store", PackOptions(16 * 2**20, progress=False))
        calm = LatencyModel(median_ms=0.2, sigma=0.5, seed=1)
        stormy = LatencyModel(median_ms=0.2, sigma=0.5, tail_prob=1e-4, stall_ms=2000, seed=1)
        on = DeadlineOptions(hedge_after_ms=0)
        runs = [("no stalls, guard on", calm, on),
                ("stalls, guard off", stormy, DeadlineOptions(enabled=False)),
                ("stalls, guard on", stormy, on)]  # fmt: skip
        for name, model, guard in runs:
            mnt = work / "mnt"
            mnt.mkdir(exist_ok=True)
            with SlowFS(work / "origin", mnt, model, SlowFSOptions(cache="direct")) as fs:
                run(mnt / "store", guard, args.epochs, args.workers, name, args.step_ms / 1e3)
                print(json.dumps({"run": name, "slowfs_stalls": fs.stats().stalls}), flush=True)


if __name__ == "__main__":
    main()
