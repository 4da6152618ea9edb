"""CPU seconds per `dist_bench` condition, to compare two trees on a loaded machine.

Wall-clock epoch times on a shared 2-core machine swing by a third from run to run; the CPU
the job's rank processes use (user + system, children reaped) does not. Runs the conditions
of `bench/dist_bench.py` (4 ranks, slowfs origin, no training step) from the tierfeed tree
given, e.g. an older checkout:

    git worktree add /tmp/wt-old <rev>
    .venv/bin/python bench/dist_cpu.py --tree /tmp/wt-old partial:0 partial:0.1
    .venv/bin/python bench/dist_cpu.py --tree . partial:0 partial:0.1

Prints one JSON line per condition: CPU seconds of all ranks, wall seconds, epoch times.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=".", help="the tierfeed checkout to run (its src/)")
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("conditions", nargs="+", help="dist_bench conditions")
    args = parser.parse_args()
    tree = Path(args.tree).absolute()
    sys.path[:0] = [str(tree / "src"), str(tree)]
    from bench import dist_bench as db
    from tierfeed.format.pack import PackOptions, pack
    from tierfeed.slowfs import SlowFS

    try:
        from tierfeed.latency import LatencyModel
    except ImportError:  # a tree from before latency.py became a leaf
        from tierfeed.storage.latency import LatencyModel  # type: ignore[no-redef]

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        db.make_source(base / "raw", args.samples)
        (base / "origin").mkdir()
        options = PackOptions(chunk_size=2 * 2**20, progress=False)
        pack(base / "raw", base / "origin" / "store", options)
        slow = base / "slow"
        slow.mkdir()
        with SlowFS(base / "origin", slow, LatencyModel.parse("nfs")):
            for cond in args.conditions:
                work = base / "work"
                work.mkdir(exist_ok=True)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                rows = db.run_condition(cond, slow, work, 3, 0.0)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                row = {
                    "tree": str(tree),
                    "condition": cond,
                    "cpu_s": round(cpu, 1),
                    "wall_s": round(time.perf_counter() - started, 1),
                    "epoch_s": db.summarize(cond, rows)["epoch_s"],
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
