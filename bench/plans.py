"""Benchmarks of the plans: one rank's plan at 10M samples x 1,024 ranks, shuffle quality,
and the padding of partition plans.

Usage:
    python bench/plans.py cost            # time and peak memory of one rank's plan
    python bench/plans.py quality         # batch class entropy and displacement per policy
    python bench/plans.py padding         # rank sizes and padding of local/partial plans
    python bench/plans.py fetch           # one rank's fetch schedule: its own side vs every order
    python bench/plans.py index --samples 10000000 30000000   # a rank's plan over a real index
    python bench/plans.py partial --samples 2300000000        # partial(q) by epoch, any N
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tierfeed.plan import DatasetShape, Plan, PlanSpec
from tierfeed.plan.quality import batch_class_entropy, displacement


def timed(run: Callable[[], object], runs: int = 3) -> tuple[float, int]:
    """The median time of ``runs`` calls, then the peak memory of one more call under
    tracemalloc (which slows numpy's allocations several times: never timed under it)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    try:
        run()
        return statistics.median(times), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def cost(samples: int, ranks: int) -> list[dict[str, object]]:
    shape = DatasetShape.uniform(samples, 500)  # 20,000 chunks of 500 samples
    rows = []
    for spec in ("global", "global,chunkwise:8", "local", "partial:0.3", "partial:0.3,chunkwise:8"):
        for epoch in (0, 10):

            def run(spec: str = spec, epoch: int = epoch) -> None:
                plan = Plan(shape, PlanSpec.parse(spec, seed=1))  # fresh: no cached bounds
                order = plan.order(epoch, 17, ranks)
                shape.sample_chunk[order]  # the chunk lookup a reader does next

            seconds, peak = timed(run)
            rows.append(
                {
                    "plan": spec,
                    "epoch": epoch,
                    "seconds_median": round(seconds, 4),
                    "peak_MiB": round(peak / 2**20, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


class _ChunkColumn:
    """sample // per_chunk computed where it is read: a chunk column of any length without
    its memory (a partial plan without windows reads only its length and its own samples)."""

    dtype = np.dtype(np.int64)

    def __init__(self, samples: int, per_chunk: int) -> None:
        self.samples, self.per_chunk = samples, per_chunk

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        return np.asarray(index, dtype=np.int64) // self.per_chunk


def partial_by_epoch(samples: int, ranks: int, q: float, epochs: list[int]) -> None:
    """One rank's partial(q) order at each epoch, in a fresh Plan each time (median of 3):
    the cost grows with the epoch (each traced back) and with N/M, not with N or M."""
    shape = DatasetShape(_ChunkColumn(samples, 580), ordered=True)  # type: ignore[arg-type]
    spec = PlanSpec("partial", q=q, seed=1)
    for epoch in epochs:
        seconds, peak = timed(lambda epoch=epoch: Plan(shape, spec).order(epoch, 17, ranks))
        print(json.dumps({"samples": samples, "ranks": ranks, "plan": f"partial:{q:g}",
                          "per_rank": -(-samples // ranks), "epoch": epoch,
                          "seconds_median": round(seconds, 4),
                          "peak_MiB": round(peak / 2**20, 1)}), flush=True)  # fmt: skip


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


PADDING_CASES = [  # (samples, samples per chunk, ranks): issue 18's table
    (1_281_167, 580, 2048),  # ImageNet-1k in 64 MiB chunks, at the seeds' scale
    (1_281_167, 580, 256),
    (9_300_000, 570, 2048),
    (601, 20, 4),  # 2 MiB chunks: the test suite's scale
]


def padding() -> list[dict[str, object]]:
    """Per case: the ranks' partition sizes, samples delivered per epoch, padding."""
    rows = []
    for n, per_chunk, ranks in PADDING_CASES:
        shape = DatasetShape.uniform(n, per_chunk)
        for spec in ("local", "partial:0.3"):
            counts = Plan(shape, PlanSpec.parse(spec, seed=1)).counts(0, ranks)
            delivered = max(counts) * ranks
            rows.append({"samples": n, "per_chunk": per_chunk, "ranks": ranks, "plan": spec,
                         "sizes": [min(counts), max(counts)], "delivered": delivered,
                         "padding": delivered - n,
                         "padding_pct": round(100 * (delivered - n) / n, 4)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


def fetch(
    samples: list[int], ranks: int, per_node: int, spec_text: str = "global"
) -> list[dict[str, object]]:
    """One rank's fetch schedule of an epoch (global plan over a staged job): its own side
    (`rank_fetch`: its order and the inverse shuffle of what it staged) against computing every
    rank's order, as the exchanger did before. Median of 3, peak memory by tracemalloc."""
    from tierfeed.distributed.holders import SampleHolders
    from tierfeed.distributed.schedule import rank_fetch
    from tierfeed.world import World

    rows = []
    for n in samples:
        shape = DatasetShape.uniform(n, 500)
        spec = PlanSpec.parse(spec_text, seed=1)
        sizes = np.bincount(shape.sample_chunk) * 110_000
        holdings = SampleHolders.of(shape, sizes, spec, World(0, ranks, 0, per_node))
        # Every order of 16,384 ranks at 100M samples would take minutes: only up to 10M.
        for how in ("own side", "every order") if n <= 10_000_000 else ("own side",):

            def run(
                how: str = how,
                shape: DatasetShape = shape,
                spec: PlanSpec = spec,
                holdings: SampleHolders = holdings,
            ) -> None:
                plan = Plan(shape, spec)
                if how == "own side":
                    rank_fetch(plan, holdings, 1, 17, ranks, 256)
                else:
                    for r in range(ranks):
                        plan.order(1, r, ranks)

            seconds, peak = timed(run, runs=3 if how == "own side" else 1)
            rows.append({"samples": n, "ranks": ranks, "per_node": per_node, "how": how,
                         "plan": spec_text, "seconds_median": round(seconds, 4),
                         "peak_MiB": round(peak / 2**20, 2)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


_RANK_PLAN_CHILD = """
import json, sys, time, tracemalloc
from tierfeed.format.index import Index
from tierfeed.loader.compose import plan_for

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

path, spec, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
index = Index(path)  # stamped already: O(1)
before = rss()
t0 = time.perf_counter()
plan = plan_for(index, spec)
made = time.perf_counter() - t0
out = {}
for epoch in (0, 10):  # timed, then traced on a fresh plan (tracemalloc slows numpy)
    t1 = time.perf_counter()
    order = plan.order(epoch, 17, ranks)
    plan.shape.sample_chunk[order]  # the chunk lookup a reader does next
    took = time.perf_counter() - t1
    tracemalloc.start()
    plan_for(index, spec).order(epoch, 17, ranks)
    out[epoch] = (took, tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
print(json.dumps({"plan_for_s": made, "epoch0_s": out[0][0], "epoch10_s": out[10][0],
                  "peak_bytes": max(out[0][1], out[10][1]), "rss_growth": rss() - before,
                  "order_len": len(order)}))
"""


def rank_plan(samples: list[int], ranks: int, workdir: Path) -> list[dict[str, object]]:
    """One rank's plan over a synthetic index of each size, in a fresh process (the index
    opened and stamped first): plan_for's time, the plan's time and peak memory, and how
    much the process's resident memory grew (the index's pages it touched included)."""
    from tierfeed.format.synthindex import synthetic_index

    env = dict(os.environ, TIERFEED_CACHE=str(workdir / "cache"))
    rows = []
    for n in samples:
        path = workdir / f"index-{n}.tfi"
        synthetic_index(path, n)
        stamp = f"from tierfeed.format.index import Index; Index({str(path)!r})"
        subprocess.run([sys.executable, "-c", stamp], check=True, env=env)  # checked, stamped
        for spec in ("global", "global,chunkwise:8", "local", "partial:0.3"):
            runs = []
            for _ in range(3):
                done = subprocess.run(
                    [sys.executable, "-c", _RANK_PLAN_CHILD, str(path), spec, str(ranks)],
                    capture_output=True, text=True, check=True, env=env,
                )  # fmt: skip
                runs.append(json.loads(done.stdout))
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows.append({"samples": n, "ranks": ranks, "plan": spec,
                         "plan_for_s": round(med["plan_for_s"], 4),
                         "epoch0_s": round(med["epoch0_s"], 4),
                         "epoch10_s": round(med["epoch10_s"], 4),
                         "peak_MiB": round(med["peak_bytes"] / 2**20, 2),
                         "rss_growth_MiB": round(med["rss_growth"] / 2**20, 1),
                         "order_len": int(med["order_len"])})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        path.unlink()
    return rows


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
    sub.add_parser("padding")
    f = sub.add_parser("fetch")
    f.add_argument("--samples", type=int, nargs="+", default=[10_000_000, 100_000_000])
    f.add_argument("--ranks", type=int, default=16384)
    f.add_argument("--per-node", type=int, default=8)
    f.add_argument("--plan", default="global")
    pe = sub.add_parser("partial")
    pe.add_argument("--samples", type=int, default=2_300_000_000)
    pe.add_argument("--ranks", type=int, default=16384)
    pe.add_argument("--q", type=float, default=0.3)
    pe.add_argument("--epochs", type=int, nargs="+", default=[0, 1, 10, 100])
    ix = sub.add_parser("index")
    ix.add_argument("--samples", type=int, nargs="+", default=[10_000_000])
    ix.add_argument("--ranks", type=int, default=16384)
    ix.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.what == "index":
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            rank_plan(args.samples, args.ranks, Path(tmp))
    elif args.what == "partial":
        partial_by_epoch(args.samples, args.ranks, args.q, args.epochs)
    elif args.what == "padding":
        padding()
    elif args.what == "fetch":
        fetch(args.samples, args.ranks, args.per_node, args.plan)
    elif args.what == "cost":
        cost(args.samples, args.ranks)
    else:
        quality(args.samples, args.classes, args.per_chunk, args.ranks, args.batch)


if __name__ == "__main__":
    main()
