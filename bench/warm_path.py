"""The warm path alone: samples/s of tierfeed's Loader when every chunk is in the local disk tier,
beside the local limit (reading the same cached chunk files sequentially, page cache warm), in
the same run, with the CPU time per sample of each.

Issue 16's goal is a warm epoch at >= 80% of that limit. Packs random samples (no decoding: the
sample's length and label are what is handed over, as in bench/compare.py), fills the tier with
one epoch, then times ``--epochs`` warm ones. Run it under py-spy for the profile:

    .venv/bin/python bench/warm_path.py [--samples 4000] [--kb 64] [--workers 2] [--epochs 3]
    .venv/bin/py-spy record --subprocesses -o warm.svg -- .venv/bin/python bench/warm_path.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from bench.peers.common import random_tree  # noqa: E402
from tierfeed.format.pack import PackOptions, pack  # noqa: E402
from tierfeed.loader import PrefetchOptions  # noqa: E402
from tierfeed.storage.store import Sample  # noqa: E402
from tierfeed.torch import Dataset, Loader, TierConfig  # noqa: E402


def length_and_label(sample: Sample) -> tuple[int, int]:
    return len(sample.fields["bin"]), sample.label


def cpu_s() -> float:
    """CPU seconds of this process and of its live children (the DataLoader workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == os.getpid():  # ppid; then utime, stime at 11 and 12
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def local_limit(cache: Path, samples: int) -> tuple[float, float]:
    """Samples/s and CPU s per sample of reading the cached chunk files in 8 MiB reads."""
    files = sorted(p for p in cache.glob("*.tar"))
    started, cpu = time.perf_counter(), cpu_s()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 * 2**20):
                pass
    wall = time.perf_counter() - started
    return samples / wall, (cpu_s() - cpu) / samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--kb", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument(
        "--threads-only", action="store_true",
        help="PrefetchOptions(inline_local=False): every read on the reader threads",
    )  # fmt: skip
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        random_tree(base / "raw", args.samples, args.kb * 1000, classes=20)
        store = base / "store"
        pack(base / "raw", store, PackOptions(chunk_size=64 * 2**20, progress=False))
        cache = base / "cache"
        tiers = TierConfig(disk_dir=str(cache))  # room for the whole store
        prefetch = PrefetchOptions(inline_local=not args.threads_only)
        ds = Dataset(
            store, "global", batch_size=args.batch, decode=length_and_label, tiers=tiers,
            prefetch=prefetch,
        )  # fmt: skip
        rows = epochs(ds, args.workers, args.epochs)
        limits = [local_limit(cache, args.samples) for _ in range(3)]
    rate = statistics.median(r for r, _ in rows)
    limit = statistics.median(r for r, _ in limits)
    print(json.dumps({
        "samples": args.samples, "kb": args.kb, "workers": args.workers,
        "inline_local": not args.threads_only,
        "warm_samples_per_s": [round(r) for r, _ in rows],
        "warm_cpu_us_per_sample": [round(c * 1e6, 1) for _, c in rows],
        "local_limit_samples_per_s": [round(r) for r, _ in limits],
        "local_cpu_us_per_sample": [round(c * 1e6, 1) for _, c in limits],
        "warm_share_of_limit": round(rate / limit, 3),
    }))  # fmt: skip


def epochs(ds: Dataset, workers: int, count: int) -> list[tuple[float, float]]:
    """Samples/s and CPU s per sample of ``count`` epochs after one that fills the tier."""
    out = []
    with Loader(ds, num_workers=workers) as loader:
        for epoch in range(count + 1):
            loader.set_epoch(epoch)
            started, cpu = time.perf_counter(), cpu_s()
            n = sum(len(b[0]) for b in loader)
            wall = time.perf_counter() - started
            if epoch:  # the first fills the tier (or finds it filled)
                out.append((n / wall, (cpu_s() - cpu) / n))
    return out


if __name__ == "__main__":
    main()
