"""Side by side: tierfeed, MosaicML Streaming, LitData, WebDataset and a per-file loader, on the
same generated JPEGs, through the same slowed file system, in one run.

Usage (in the benchmark environment, `make bench-env`):
    .venv-bench/bin/python bench/compare.py [--images 4000] [--median-kb 64] [--epochs 3]
        [--configs nfs:full,nfs:half,heavy-tail:full] [--out bench-out/compare]

A user-sized store (issue 45: 20,000 JPEGs of ~106 KB, 2.1 GB, 32 chunks of 64 MiB) on a busy
shared file system (`stalls`: 2 s on one operation in 10,000, 150 ms on one open in 100):
    .venv-bench/bin/python bench/compare.py --images 20000 --median-kb 101 --epochs 2 \
        --configs stalls:full

Steps: generate an ImageFolder tree of real JPEGs (lognormal sizes, ImageNet's shape scaled by
``--median-kb``); convert it with each system's own tool (timed); mount the converted datasets
with `tierfeed slowfs` under a latency model; run each system's loader in a fresh process for
``--epochs`` epochs with the same workers, batch size and local cache budget (``full``: room
for everything; ``half``: half the raw dataset's bytes); add the physical limits (sequential
reads of tierfeed's chunk files through slowfs, and from local disk; the origin's own limit:
N threads of 8 MiB ranged reads of the same files through slowfs, the best N). Results: JSON
lines per epoch, a markdown table and a plot under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.peers.common import origin_counters  # noqa: E402
from tierfeed.latency import LatencyModel  # noqa: E402
from tierfeed.slowfs import SlowFS  # noqa: E402
from tierfeed.synth import SynthSpec, make_imagefolder  # noqa: E402

# system -> (runner, converted directory name; None: reads the raw tree)
SYSTEMS: dict[str, tuple[str, str | None]] = {
    "per-file": ("run_perfile.py", None),
    "tierfeed": ("run_tierfeed.py", "tierfeed"),
    "streaming": ("run_streaming.py", "mds"),
    "litdata": ("run_litdata.py", "litdata"),
    "webdataset": ("run_wds.py", "wds"),
}


def last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise ValueError(f"no JSON line in output:\n{text[-2000:]}")


def convert_all(raw: Path, origin: Path, systems: list[str]) -> dict[str, Any]:
    """Each system's own conversion of the raw tree (timed by the runner); one kept from an
    earlier run (``--data``) is reused, with the figures of its conversion."""
    out = {}
    for system in systems:
        runner, name = SYSTEMS[system]
        if name is None:
            continue
        kept = origin / f"{name}.converted.json"
        if kept.exists():
            out[system] = json.loads(kept.read_text())
            continue
        argv = [sys.executable, str(HERE / "peers" / runner), "convert"]
        argv += ["--src", str(raw), "--out", str(origin / name)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"{system} convert failed:\n{done.stderr[-3000:]}")
        out[system] = last_json(done.stdout)
        kept.write_text(json.dumps(out[system]))
        print(json.dumps(out[system]), flush=True)
    return out


def read_run(system: str, data: str, origin: str, work: Path, budget: int,
             args: argparse.Namespace, tag: str,
             env: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One system, one configuration, in a fresh process with an empty cache: its dataset at
    ``data`` (under a slowfs mount, or a URL), the origin's counters at ``origin`` (the mount,
    or a slowed S3 proxy's URL)."""
    runner, _ = SYSTEMS[system]
    cache = work / "cache" / f"{system}-{tag}"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    out = work / "rows" / f"{system}-{tag}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(HERE / "peers" / runner), "read",
            "--data", data, "--slowfs", origin, "--cache", str(cache),
            "--cache-bytes", str(budget), "--epochs", str(args.epochs),
            "--workers", str(args.workers), "--batch", str(args.batch),
            "--out", str(out)]  # fmt: skip
    environment = None if env is None else dict(os.environ, **env, TIERFEED_CACHE=str(cache))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.run_timeout,
                          env=environment)  # fmt: skip
    if done.returncode != 0:
        print(f"{system} {tag}: failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return [{"system": system, "config": tag, "failed": done.stderr[-500:]}]
    rows = [dict(json.loads(line), config=tag) for line in out.read_text().splitlines()]
    shutil.rmtree(cache, ignore_errors=True)
    return rows


def sequential(paths: list[Path], samples: int, label: str, mnt: Path | None) -> dict[str, Any]:
    """Read ``paths`` front to back in 8 MiB blocks: the physical limit of those bytes."""
    before = origin_counters(mnt) if mnt else None
    started = time.perf_counter()
    total = 0
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while block := f.read(8 * 2**20):
                total += len(block)
    seconds = time.perf_counter() - started
    row = {"system": label, "samples_per_s": round(samples / seconds, 1),
           "MB_per_s": round(total / seconds / 1e6, 1), "seconds": round(seconds, 3)}  # fmt: skip
    if mnt and before:
        after = origin_counters(mnt)
        row.update({f"origin_{k}": after[k] - before[k] for k in after})
    return row


def parallel(
    paths: list[Path], samples: int, mnt: Path, widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
) -> dict[str, Any]:
    """The origin's own limit for these bytes: N threads reading them in 8 MiB ranged reads
    (every file opened anew per probe, so the mount's page cache does not serve them), for
    each N in ``widths``; the row of the best N, with every probe's MB/s."""
    block = 8 * 2**20
    work = [(p, off) for p in paths for off in range(0, p.stat().st_size, block)]
    probes: dict[int, float] = {}
    best: dict[str, Any] = {}
    for n in widths:
        todo = queue.SimpleQueue[tuple[Path, int]]()
        for item in work:
            todo.put(item)
        before = origin_counters(mnt)
        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            total = sum(pool.map(_drain, [todo] * n, [block] * n))
        seconds = time.perf_counter() - started
        probes[n] = round(total / seconds / 1e6, 1)
        if not best or probes[n] > best["MB_per_s"]:
            after = origin_counters(mnt)
            best = {"system": f"origin limit ({n} parallel 8 MiB reads)",
                    "samples_per_s": round(samples / seconds, 1), "MB_per_s": probes[n],
                    "seconds": round(seconds, 3),
                    **{f"origin_{k}": after[k] - before[k] for k in after}}  # fmt: skip
    return dict(best, probes_MB_per_s=probes)


def _drain(todo: queue.SimpleQueue[tuple[Path, int]], block: int) -> int:
    """Read blocks off ``todo`` until it is empty; bytes read."""
    total = 0
    files: dict[Path, int] = {}
    try:
        while True:
            try:
                path, offset = todo.get_nowait()
            except queue.Empty:
                return total
            fd = files.get(path)
            if fd is None:
                fd = files[path] = os.open(path, os.O_RDONLY)
            total += len(os.pread(fd, block, offset))
    finally:
        for fd in files.values():
            os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--median-kb", type=float, default=64.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--configs", default="nfs:full,nfs:half,heavy-tail:full")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--run-timeout", type=float, default=900)
    p.add_argument("--out", type=Path, default=Path("bench-out/compare"))
    p.add_argument(
        "--work", type=Path, default=None, help="scratch directory (default: a temp dir)"
    )
    p.add_argument(
        "--data", type=Path, default=None,
        help="keep the generated tree and the conversions here, and reuse them when present "
        "(runs of the same --images and --median-kb)",
    )  # fmt: skip
    args = p.parse_args()
    systems = args.systems.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        run(Path(tmp), systems, args)


def run(work: Path, systems: list[str], args: argparse.Namespace) -> None:
    origin = args.data or work / "origin"
    raw = origin / "raw"
    median = int(args.median_kb * 1000)
    spec = SynthSpec(classes=20, per_class=args.images // 20, median_bytes=median, sigma=0.6,
                     jpeg=True, seed=1)  # fmt: skip
    made = origin / "raw.json"
    kept = json.loads(made.read_text()) if made.exists() else {}
    if kept.get("spec") == repr(spec):
        raw_bytes = kept["bytes"]
    else:
        shutil.rmtree(origin, ignore_errors=True)
        raw_bytes = make_imagefolder(raw, spec)
        made.write_text(json.dumps({"spec": repr(spec), "bytes": raw_bytes}))
    samples = spec.classes * spec.per_class
    converted = convert_all(raw, origin, systems)
    result: dict[str, Any] = {
        "images": samples, "raw_bytes": raw_bytes, "epochs": args.epochs,
        "workers": args.workers, "batch": args.batch, "convert": converted,
        "machine": {"cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}, "rows": [],
        "limits": [],
    }  # fmt: skip
    chunks = sorted((origin / "tierfeed" / "chunks").glob("*.tar"))
    for config in args.configs.split(","):
        latency, cache = config.split(":")
        budget = raw_bytes * 4 if cache == "full" else raw_bytes // 2
        mnt = work / f"mnt-{latency}"
        mnt.mkdir(exist_ok=True)
        with SlowFS(origin, mnt, LatencyModel.parse(latency)):
            at_origin = [mnt / "tierfeed" / "chunks" / c.name for c in chunks]
            limit = sequential(at_origin, samples, "physical limit (origin, sequential)", mnt)
            result["limits"].append(dict(limit, config=config))
            result["limits"].append(dict(parallel(at_origin, samples, mnt), config=config))
            for system in systems:
                if system == "per-file" and cache == "half":
                    continue  # no cache of its own: the same as full
                data = str(mnt / (SYSTEMS[system][1] or "raw"))
                since = _slowfs(mnt)["uptime_s"]
                rows = read_run(system, data, str(mnt), work, budget, args, config)
                stalls = [s for s in _slowfs(mnt)["stalls"] if s["at_s"] >= since]
                for row in rows:  # the origin's stalls came in the cold epoch: it alone reads
                    row["origin_stalls_s"] = (
                        [s["seconds"] for s in stalls] if row["epoch"] == 0 else []
                    )
                result["rows"] += rows
    sequential(chunks, samples, "warm-up", None)
    local = sequential(chunks, samples, "physical limit (local disk, sequential)", None)
    result["limits"].append(dict(local, config="local"))
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    table = render(result)
    (args.out / "table.md").write_text(table)
    print(table)
    plot(result, args.out / "compare.png")


def _slowfs(mnt: Path) -> dict[str, Any]:
    """The slowfs mount's live counters: its uptime and its latest stalls (when, how long)."""
    stats: dict[str, Any] = json.loads((mnt / ".slowfs/stats.json").read_bytes())
    return stats


def render(result: dict[str, Any]) -> str:
    """Markdown: per configuration and system, cold (epoch 1) and warm (median of the rest)."""
    lines = ["| config | system | epoch 1 samples/s | warm samples/s | p50 / p99 / p99.99 / max "
             "wait ms (epoch 1) | first batch ms; after it, p99 / max wait ms | origin opens / "
             "stats / reads / MB (epoch 1) | origin MB warm | peak RSS MB (main / worker) "
             "| cache MB |", "|" + "---|" * 10]  # fmt: skip
    for config in dict.fromkeys(r["config"] for r in result["rows"]):
        for system in dict.fromkeys(r["system"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["config"] == config and r["system"] == system]
            if not rows:
                continue
            if "failed" in rows[0]:
                lines.append(f"| {config} | {system} | failed | | | | | | | |")
                continue
            cold, warm = rows[0], rows[1:] or rows
            warm_sps = statistics.median(r["samples_per_s"] for r in warm)
            warm_mb = statistics.median(r["origin_bytes_read"] for r in warm) / 1e6
            lines.append(
                f"| {config} | {system} | {cold['samples_per_s']:,.0f} | {warm_sps:,.0f} | "
                f"{cold['wait_p50_ms']:.1f} / {cold['wait_p99_ms']:.1f} / "
                f"{cold['wait_p9999_ms']:.0f} / {cold['wait_max_ms']:.0f} | "
                f"{cold['first_batch_ms']:.0f}; {cold['wait_p99_after_first_ms']:.0f} / "
                f"{cold['wait_max_after_first_ms']:.0f} | "
                f"{cold['origin_opens']:,} / {cold['origin_stats']:,} / {cold['origin_reads']:,} / "
                f"{cold['origin_bytes_read'] / 1e6:,.0f} | {warm_mb:,.1f} | "
                f"{max(r['peak_rss_mb'] for r in rows):,.0f} / "
                f"{max(r['peak_rss_children_mb'] for r in rows):,.0f} | "
                f"{rows[-1]['cache_bytes'] / 1e6:,.0f} |"
            )
    for limit in result["limits"]:
        lines.append(f"| {limit['config']} | {limit['system']} | {limit['samples_per_s']:,.0f} "
                     f"({limit['MB_per_s']:,.0f} MB/s) | | | | | | | |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Samples/s per epoch for every system, one panel per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in result["rows"]))
    colors = {s: f"C{i}" for i, s in enumerate(SYSTEMS)}  # one colour per system in every panel
    fig, axes = plt.subplots(1, len(configs), figsize=(5 * len(configs), 4), squeeze=False)
    for ax, config in zip(axes[0], configs, strict=True):
        for system in dict.fromkeys(r["system"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["config"] == config and r["system"] == system
                    and "failed" not in r]  # fmt: skip
            if rows:
                ax.plot([r["epoch"] + 1 for r in rows], [r["samples_per_s"] for r in rows],
                        marker="o", label=system, color=colors.get(system))  # fmt: skip
        ax.set_title(config)
        ax.set_xlabel("epoch")
        ax.set_ylabel("samples/s")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
