"""One cold epoch of `make demo`'s tierfeed loader, with the counters behind its origin bytes.

Mounts the demo's origin (``demo-data/origin``, made by a `make demo` run: 3,000 JPEGs packed
in 32 MiB chunks) with slowfs under the demo's latency model, and reads one epoch with the
demo's loader (`tierfeed.demo._tierfeed_loader`: global plan, RAM and disk tiers, hedged reads,
2 workers) from an empty cache, without the demo's per-file half. Prints one JSON line per run:
samples/s, slowfs's origin reads and bytes, tierfeed's origin reads of samples (beside the
copies), the fetch counters (pieces, reads served from copies in flight, reads that gave up
waiting) and the deadline guard's (late, hedged). To compare two versions of the code, run it
with ``PYTHONPATH=<other>/src`` interleaved with the current code.

Usage:
    python bench/demo_epoch.py --runs 3
    PYTHONPATH=/tmp/old/src python bench/demo_epoch.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path


def one_epoch(origin: Path, latency: str, workers: int) -> dict[str, object]:
    from tierfeed.demo import _tierfeed_loader
    from tierfeed.latency import LatencyModel
    from tierfeed.slowfs import SlowFS

    scratch = Path(tempfile.mkdtemp(prefix="demo-epoch-"))
    try:
        mnt = scratch / "mnt"
        mnt.mkdir()
        with SlowFS(origin, mnt, LatencyModel.parse(latency)) as fs:
            loader = _tierfeed_loader(mnt / "store", scratch / "cache", workers)
            with loader:
                fs.reset()
                started = time.perf_counter()
                samples = sum(len(images) for images, _ in loader)
                seconds = time.perf_counter() - started
                stats = fs.stats()
                epoch = loader.last_epoch or {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tiers, fetch = epoch.get("tiers", {}), epoch.get("tiers", {}).get("fetch", {})
    keep = ("pieces", "piece_kib", "served", "gave_up", "hedges")
    return {
        "samples_per_s": round(samples / seconds, 1),
        "slowfs_reads": stats.reads,
        "slowfs_mb": round(stats.bytes_read / 1e6, 1),
        "sample_reads_at_origin": tiers.get("origin", {}).get("hits"),
        "fetch": {k: fetch.get(k) for k in keep},
        "guard": epoch.get("guard"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="demo-data", help="the demo's work directory")
    p.add_argument("--latency", default="heavy-tail", help="slowfs latency model")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=1)
    args = p.parse_args()
    origin = Path(args.work).absolute() / "origin"
    if not (origin / "store" / "index.tfi").exists():
        raise SystemExit(f"demo_epoch.py: error: no demo store under {origin}; run `make demo`")
    for _ in range(args.runs):
        print(json.dumps(one_epoch(origin, args.latency, args.workers)), flush=True)


if __name__ == "__main__":
    main()
