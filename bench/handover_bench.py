"""What a ready batch costs to hand over: a bare DataLoader against tierfeed's Loader.

Usage:
    python bench/handover_bench.py [--sharing file_descriptor|file_system] [--epochs 4]

Both read 64-element batches with 2 persistent workers and a 30 ms step per batch, so every
batch is ready when asked for: the wait is the handover from a worker to the training loop
(and, at an epoch's start, whatever the loader does between epochs). tierfeed reads a
5,000-sample store on local disk (no slowfs). Prints, per epoch, the first batch's wait and
the median and maximum of the others.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing
from torch.utils.data import DataLoader, IterableDataset

from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader import PrefetchOptions
from tierfeed.storage.store import Sample
from tierfeed.synth import SynthSpec, make_imagefolder
from tierfeed.torch import Dataset, Loader

STEP_S = 0.03


class Bare(IterableDataset[torch.Tensor]):
    """150 batches of 64 numbers per worker: nothing to read."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(150):
            yield torch.arange(64)


def decode(sample: Sample) -> torch.Tensor:
    return torch.tensor(len(sample.fields["jpg"]))


def epoch_waits(batches: Iterable[Any]) -> dict[str, float]:
    waits = []
    it = iter(batches)
    asked = time.perf_counter()
    for _ in it:
        waits.append(time.perf_counter() - asked)
        time.sleep(STEP_S)  # a training step
        asked = time.perf_counter()
    rest = np.array(waits[1:]) * 1e3
    return {"first_ms": round(waits[0] * 1e3, 2), "p50_ms": round(float(np.median(rest)), 2),
            "max_ms": round(float(rest.max()), 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sharing", default="file_descriptor")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.multiprocessing.set_sharing_strategy(args.sharing)
    bare = DataLoader(Bare(), batch_size=None, num_workers=2, persistent_workers=True,
                      multiprocessing_context="fork")  # fmt: skip
    for epoch in range(args.epochs):
        print(json.dumps({"loader": "bare DataLoader", "sharing": args.sharing, "epoch": epoch,
                          **epoch_waits(bare)}), flush=True)  # fmt: skip
    del bare
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_imagefolder(work / "raw", SynthSpec(classes=10, per_class=500, median_bytes=20_000))
        pack(work / "raw", work / "store", PackOptions(16 * 2**20, progress=False))
        ds = Dataset(work / "store", "global", batch_size=64, decode=decode,
                     prefetch=PrefetchOptions(window=256, threads=32))  # fmt: skip
        with Loader(ds, num_workers=2) as loader:
            for epoch in range(args.epochs):
                loader.set_epoch(epoch)
                print(json.dumps({"loader": "tierfeed Loader", "sharing": args.sharing,
                                  "epoch": epoch, **epoch_waits(loader)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
