"""Benchmarks of the plans: one rank's plan at 10M samples x 1,024 ranks, and shuffle quality.

Usage:
    python bench/plans.py cost            # time and peak memory of one rank's plan
    python bench/plans.py quality         # batch class entropy and displacement per policy
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc

import numpy as np

from tierfeed.plan import DatasetShape, Plan, PlanSpec
from tierfeed.plan.quality import batch_class_entropy, displacement


def cost(samples: int, ranks: int) -> list[dict[str, object]]:
    shape = DatasetShape.uniform(samples, 500)  # 20,000 chunks of 500 samples
    rows = []
    for spec in ("global", "global,chunkwise:8", "local", "partial:0.3", "partial:0.3,chunkwise:8"):
        for epoch in (0, 10):
            times, peaks = [], []
            for _ in range(3):
                plan = Plan(shape, PlanSpec.parse(spec, seed=1))  # fresh: no cached bounds
                tracemalloc.start()
                t0 = time.perf_counter()
                order = plan.order(epoch, 17, ranks)
                shape.sample_chunk[order]  # the chunk lookup a reader does next
                times.append(time.perf_counter() - t0)
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
            rows.append(
                {
                    "plan": spec,
                    "epoch": epoch,
                    "seconds_median": round(statistics.median(times), 4),
                    "peak_MiB": round(max(peaks) / 2**20, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def quality(samples: int, classes: int, per_chunk: int, ranks: int, batch: int) -> None:
    labels = np.arange(samples) * classes // samples  # class-sorted layout
    shape = DatasetShape(
        np.arange(samples) // per_chunk, np.full(samples, 1000, dtype=np.int64), labels
    )
    uniform = np.random.default_rng(0).permutation(samples)[: samples // ranks]
    base_h = batch_class_entropy(uniform, labels, batch)
    print(json.dumps({"uniform_entropy_bits": round(base_h, 3)}))
    for spec in ("global", "global,chunkwise:4", "global,chunkwise:32", "local", "partial:0.1",
                 "partial:0.3", "partial:1.0", "partial:0.3,chunkwise:4"):  # fmt: skip
        plan = Plan(shape, PlanSpec.parse(spec, seed=1))
        for epoch in (1, 5):
            orders = [plan.order(epoch, r, ranks) for r in range(ranks)]
            h = statistics.mean(batch_class_entropy(o, labels, batch) for o in orders)
            d = statistics.mean(displacement(o, samples) for o in orders)
            print(json.dumps({"plan": spec, "epoch": epoch, "entropy_bits": round(h, 3),
                              "entropy_vs_uniform": round(h / base_h, 3),
                              "displacement": round(d, 3)}), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--samples", type=int, default=10_000_000)
    c.add_argument("--ranks", type=int, default=1024)
    q = sub.add_parser("quality")
    q.add_argument("--samples", type=int, default=256_000)
    q.add_argument("--classes", type=int, default=1000)
    q.add_argument("--per-chunk", type=int, default=256)
    q.add_argument("--ranks", type=int, default=16)
    q.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if args.what == "cost":
        cost(args.samples, args.ranks)
    else:
        quality(args.samples, args.classes, args.per_chunk, args.ranks, args.batch)


if __name__ == "__main__":
    main()
