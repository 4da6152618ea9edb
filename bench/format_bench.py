"""Benchmarks of the format: pack throughput against `tar -cf`, index open time and memory.

Usage:
    python bench/format_bench.py pack --files 10000 --runs 3
    python bench/format_bench.py index --samples 1000000 10000000
    python bench/format_bench.py at-once --samples 30000000 --procs 4 [--code OLD/src]
    python bench/format_bench.py setup --samples 1000000 10000000 [--code OLD/src]
    python bench/format_bench.py rows --samples 10000000 --runs 3 --code OLD/src

Both tools read the same page-cached tree and write to the same disk; runs alternate
(tar, pack, tar, pack, ...) so the machine's noise hits both alike, and medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.synth import SynthSpec, make_imagefolder

_OPEN_CHILD = """
import json, os, sys, time, resource
import numpy as np

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

from tierfeed.format.index import Index
before = rss()
t0 = time.perf_counter()
ix = Index(sys.argv[1], recheck=sys.argv[2] == "recheck", lazy=sys.argv[2] == "lazy")
opened = time.perf_counter() - t0
after_open = rss()
assert ix.checked == (sys.argv[2] != "lazy")
rng = np.random.default_rng(0)
rows_s = batch_us = store_s = 0.0
if sys.argv[2] == "lazy":  # what checking rows on use costs: a rank's epoch, one batch
    from tierfeed.storage import PosixDriver, TierStack
    from tierfeed.storage.store import Store
    t3 = time.perf_counter()  # what a DataLoader worker sets up over it: a store, tiers
    stack = TierStack(ix.chunks(), PosixDriver(ix.path.parent, read_only=True))
    Store(ix, stack)
    store_s = time.perf_counter() - t3
    rank = rng.integers(0, ix.num_samples, size=140_381)  # 2.3 billion / 16,384 ranks
    t3 = time.perf_counter()
    ix.check_samples(rank)
    rows_s = time.perf_counter() - t3
    batches = [rng.integers(0, ix.num_samples, size=32) for _ in range(200)]
    t3 = time.perf_counter()
    for batch in batches:
        ix.check_samples(batch)
    batch_us = (time.perf_counter() - t3) / len(batches) * 1e6
t1 = time.perf_counter()
for i in rng.integers(0, ix.num_samples, size=10000).tolist():
    ix.key(i); ix.member_offset[ix.members(i).start]
lookup_us = (time.perf_counter() - t1) / 10000 * 1e6
t2 = time.perf_counter()
for i in rng.integers(0, ix.num_samples, size=1000).tolist():
    assert ix.find_sample(ix.key(i)) == i
path_us = (time.perf_counter() - t2) / 1000 * 1e6
after_lookups = rss()
peak = 0
if sys.argv[2] == "recheck":  # what the checks allocate, in one more open (not timed)
    import tracemalloc
    tracemalloc.start()
    Index(sys.argv[1], recheck=True).close()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
print(json.dumps(dict(open_s=opened, open_rss=after_open - before,
      lookups_rss=after_lookups - before, lookup_us=lookup_us, path_lookup_us=path_us,
      check_peak=peak, rank_rows_s=rows_s, batch_rows_us=batch_us, store_s=store_s)))
"""


def bench_pack(files: int, runs: int, workdir: Path) -> dict[str, object]:
    src = workdir / "src"
    spec = SynthSpec(classes=100, per_class=files // 100, seed=3)
    total = make_imagefolder(src, spec)
    # Warm the page cache for both tools alike.
    subprocess.run(["tar", "-cf", "/dev/null", "-C", str(src), "."], check=True)
    tar_s, pack_s = [], []
    for _ in range(runs):
        out = workdir / "out.tar"
        t0 = time.perf_counter()
        subprocess.run(["tar", "-cf", str(out), "-C", str(src), "."], check=True)
        os.sync()
        tar_s.append(time.perf_counter() - t0)
        out.unlink()
        dst = workdir / "store"
        t0 = time.perf_counter()
        pack(src, dst, PackOptions(progress=False))
        os.sync()
        pack_s.append(time.perf_counter() - t0)
        shutil.rmtree(dst)
    mb = total / 1e6
    tar_mbps = mb / statistics.median(tar_s)
    pack_mbps = mb / statistics.median(pack_s)
    return {
        "files": spec.classes * spec.per_class,
        "bytes": total,
        "runs": runs,
        "tar_s": tar_s,
        "pack_s": pack_s,
        "tar_MBps_median": round(tar_mbps, 1),
        "pack_MBps_median": round(pack_mbps, 1),
        "pack_over_tar": round(pack_mbps / tar_mbps, 3),
    }


def bench_index(samples: int, workdir: Path) -> dict[str, object]:
    from tierfeed.format.synthindex import synthetic_index

    path = workdir / f"index-{samples}.tfi"
    t0 = time.perf_counter()
    synthetic_index(path, samples)
    build_s = time.perf_counter() - t0
    path.read_bytes()  # warm the page cache for every run alike
    env = dict(os.environ, TIERFEED_CACHE=str(workdir / f"cache-{samples}"))
    results: dict[str, list[dict[str, float]]] = {"lazy": [], "recheck": [], "stamped": []}
    # Checked on use (no stamp yet), checked in full (and stamped), then with the stamp.
    for mode in results:
        for _ in range(3):
            done = subprocess.run(
                [sys.executable, "-c", _OPEN_CHILD, str(path), mode],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            results[mode].append(json.loads(done.stdout))
    size = path.stat().st_size
    with Index(path) as ix:
        keys = int(ix.sample_key_offset[-1])
        arrays = sum(n for name, (_, n) in ix.header["sections"].items() if name != "keys")
    path.unlink()
    full = {k: statistics.median(r[k] for r in results["recheck"]) for k in results["recheck"][0]}
    med = {k: statistics.median(r[k] for r in results["stamped"]) for k in results["stamped"][0]}
    lazy = {k: statistics.median(r[k] for r in results["lazy"]) for k in results["lazy"][0]}
    return {
        "samples": samples,
        "build_s": round(build_s, 1),
        "file_bytes_per_sample": round(size / samples, 1),
        "arrays_bytes_per_sample": round(arrays / samples, 1),
        "key_bytes_per_sample": round(keys / samples, 1),
        "open_checked_s_median": round(full["open_s"], 4),
        "open_checked_peak_MiB": round(full["check_peak"] / 2**20, 1),
        "open_stamped_s_median": round(med["open_s"], 5),
        "open_checked_on_use_s_median": round(lazy["open_s"], 5),
        "checked_on_use_rank_rows_s_median": round(lazy["rank_rows_s"], 4),
        "checked_on_use_batch_of_32_us_median": round(lazy["batch_rows_us"], 1),
        "checked_on_use_lookup_by_id_us": round(lazy["lookup_us"], 2),
        "checked_on_use_store_and_tier_stack_s_median": round(lazy["store_s"], 5),
        "open_rss_bytes_per_sample": round(med["open_rss"] / samples, 3),
        "rss_after_10k_lookups_bytes_per_sample": round(med["lookups_rss"] / samples, 3),
        "lookup_by_id_us": round(med["lookup_us"], 2),
        "lookup_by_key_us": round(med["path_lookup_us"], 1),
    }


_AT_ONCE_CHILD = """
import json, sys, time
from tierfeed.format.index import Index
start = float(sys.argv[2])
while time.time() < start:  # every process opens at the same moment, as a node's ranks do
    time.sleep(0.0005)
with Index(sys.argv[1]) as ix:
    print(json.dumps([time.time() - start, getattr(ix, "checked_here", None)]))
"""


_SETUP_CHILD = """
import json, sys, time
from tierfeed.format.index import Index
from tierfeed.storage import PosixDriver, TierStack
from tierfeed.storage.store import Store
t0 = time.perf_counter()
try:
    ix = Index(sys.argv[1], lazy=True)
except TypeError:  # code from before indexes were checked on use
    ix = Index(sys.argv[1])
opened = time.perf_counter() - t0
t1 = time.perf_counter()
stack = TierStack(ix.chunks(), PosixDriver(ix.path.parent, read_only=True))
Store(ix, stack)
print(json.dumps(dict(open_s=opened, setup_s=time.perf_counter() - t1)))
"""


def bench_setup(samples: int, runs: int, code: str | None, workdir: Path) -> None:
    """What a DataLoader worker pays to start over a large index it has not seen: open the
    index (the host's stamp removed before each run), then its Store and TierStack. A fresh
    process each run; ``code``: another src directory (e.g. ``git archive`` of an old commit)."""
    from tierfeed.format.synthindex import synthetic_index

    path = workdir / f"index-{samples}.tfi"
    synthetic_index(path, samples)
    path.read_bytes()
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code, env.get("PYTHONPATH")]))
    rows = []
    for run in range(runs):
        env["TIERFEED_CACHE"] = str(workdir / f"setup-cache-{run}")  # no stamp: a first open
        done = subprocess.run(
            [sys.executable, "-c", _SETUP_CHILD, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        rows.append(json.loads(done.stdout))
    print(json.dumps({"samples": samples, "code": code or ".", "runs": rows,
                      "open_s_median": round(statistics.median(r["open_s"] for r in rows), 4),
                      "setup_s_median": round(statistics.median(r["setup_s"] for r in rows), 4),
                      }))  # fmt: skip


_ROWS_CHILD = """
import json, sys, time
import numpy as np
from tierfeed.format.index import Index
rng = np.random.default_rng(int(sys.argv[2]))
t0 = time.perf_counter()
ix = Index(sys.argv[1], lazy=True)
assert not ix.checked
i = int(rng.integers(0, ix.num_samples))
ix.check_samples([i])  # what a read of sample i takes of the index: its rows, key, chunk
ix.key(i), ix.members(i), ix.chunk(int(ix.sample_chunk[i]))
first = time.perf_counter() - t0
rank = rng.integers(0, ix.num_samples, size=140_381)  # 2.3 billion / 16,384 ranks
t1 = time.perf_counter()
ix.check_samples(rank)
print(json.dumps(dict(first_s=first, epoch_s=time.perf_counter() - t1)))
"""


def bench_rows(samples: int, runs: int, old: str, workdir: Path) -> None:
    """What checking rows on use costs, before and after a change: each code writes its own
    index of ``samples`` (its format), then fresh processes, alternating old and new, open it
    lazily (no stamp) and time the first random sample's rows (open included) and one rank's
    epoch of rows (140,381 random ids, checked at once)."""
    codes = {"old": old, "new": str(Path(__file__).resolve().parents[1] / "src")}
    paths = {}
    for name, code in codes.items():
        env = {**os.environ, "PYTHONPATH": code}
        paths[name] = workdir / f"rows-{name}-{samples}.tfi"
        subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from "
             "tierfeed.format.synthindex import synthetic_index; "
             "synthetic_index(Path(sys.argv[1]), int(sys.argv[2]))",
             str(paths[name]), str(samples)],
            check=True, env=env,
        )  # fmt: skip
        paths[name].read_bytes()  # in the page cache for both alike
    rows: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for run in range(runs):
        for name, code in codes.items():
            env = {**os.environ, "PYTHONPATH": code, "TIERFEED_CACHE": str(workdir / f"c{run}")}
            done = subprocess.run(
                [sys.executable, "-c", _ROWS_CHILD, str(paths[name]), str(run)],
                capture_output=True, text=True, check=True, env=env,
            )  # fmt: skip
            rows[name].append(json.loads(done.stdout))
    out: dict[str, object] = {"samples": samples, "runs": runs, "old": old}
    for name in codes:
        for what in ("first_s", "epoch_s"):
            values = [r[what] for r in rows[name]]
            out[f"{name}_{what}"] = [round(v * 1000, 3) for v in values]
            out[f"{name}_{what}_median_ms"] = round(statistics.median(values) * 1000, 3)
    for what in ("first_s", "epoch_s"):
        ratio = out[f"new_{what}_median_ms"] / out[f"old_{what}_median_ms"]  # type: ignore[operator]
        out[f"{what}_new_over_old"] = round(ratio, 3)
    print(json.dumps(out))


def bench_at_once(samples: int, procs: int, runs: int, code: str | None, workdir: Path) -> None:
    """``procs`` processes open one unstamped index at the same moment (a fresh cache each
    run): when the last of them has it open, and how many ran the O(N) checks (None: code
    that does not say). ``code``: a src directory to run instead of this one's."""
    from tierfeed.format.synthindex import synthetic_index

    path = workdir / f"index-{samples}.tfi"
    synthetic_index(path, samples)
    path.read_bytes()  # warm the page cache for every run alike
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code
    lasts = []
    for run in range(runs):
        env["TIERFEED_CACHE"] = str(workdir / f"cache-{run}")
        start = time.time() + 3.0
        children = [
            subprocess.Popen([sys.executable, "-c", _AT_ONCE_CHILD, str(path), str(start)],
                             stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(procs)
        ]  # fmt: skip
        rows = [json.loads(c.communicate()[0]) for c in children]
        lasts.append(max(r[0] for r in rows))
        print(json.dumps({"samples": samples, "procs": procs, "code": code or ".",
                          "last_open_s": round(lasts[-1], 3),
                          "checked": [r[1] for r in rows]}), flush=True)  # fmt: skip
    print(json.dumps({"samples": samples, "procs": procs, "code": code or ".",
                      "last_open_s_median": round(statistics.median(lasts), 3)}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--files", type=int, default=10000)
    p.add_argument("--runs", type=int, default=3)
    i = sub.add_parser("index")
    i.add_argument("--samples", type=int, nargs="+", default=[1_000_000])
    a = sub.add_parser("at-once")  # a node's ranks opening one unstamped index together
    a.add_argument("--samples", type=int, default=30_000_000)
    a.add_argument("--procs", type=int, default=4)
    a.add_argument("--runs", type=int, default=3)
    a.add_argument("--code", default=None, help="a src directory to run instead of this one's")
    w = sub.add_parser("setup")  # a worker's start over an index it has not seen
    w.add_argument("--samples", type=int, nargs="+", default=[10_000_000])
    w.add_argument("--runs", type=int, default=3)
    w.add_argument("--code", default=None, help="a src directory to run instead of this one's")
    r = sub.add_parser("rows")  # checking rows on use, before and after a change
    r.add_argument("--samples", type=int, nargs="+", default=[10_000_000])
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--code", required=True, help="the src directory of the code before")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        if args.what == "pack":
            print(json.dumps(bench_pack(args.files, args.runs, Path(tmp)), indent=1))
        elif args.what == "setup":
            for n in args.samples:
                bench_setup(n, args.runs, args.code, Path(tmp))
        elif args.what == "rows":
            for n in args.samples:
                bench_rows(n, args.runs, args.code, Path(tmp))
        elif args.what == "at-once":
            bench_at_once(args.samples, args.procs, args.runs, args.code, Path(tmp))
        else:
            for n in args.samples:
                print(json.dumps(bench_index(n, Path(tmp)), indent=1), flush=True)


if __name__ == "__main__":
    main()
