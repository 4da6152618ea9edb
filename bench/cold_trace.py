"""The cold epoch's timeline, from the kernel's FUSE events: when the first chunk read goes
out, how fast reads complete, how many are in flight, when batches come.

Runs `bench/cold_path.py`'s epoch (its data under ``--work``, slowfs with ``--latency``, 2
DataLoader workers, batch 64, the global plan, an empty disk tier) in a child process while
ftrace records ``fuse:fuse_request_send``/``fuse_request_end``; the child writes markers
(``trace_marker``) when the Loader starts and as batches come. Needs root and tracefs at
/sys/kernel/tracing. Times are from the start of the iteration.

Usage:
    python bench/cold_trace.py --latency nfs --runs 2
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
TRACE = Path("/sys/kernel/tracing")
_LINE = re.compile(r"\s(\d+\.\d+): (\w+): (.*)")


def child(mnt: Path, cache: Path, workers: int) -> None:
    """One cold epoch with markers at its milestones (run as ``--child``)."""
    import torch

    from bench.peers.run_tierfeed import length_and_label
    from tierfeed.torch import Dataset, Loader, TierConfig

    torch.set_num_threads(1)
    with (TRACE / "trace_marker").open("w", buffering=1) as marker:
        tiers = TierConfig(disk_dir=str(cache))  # room for the whole store
        ds = Dataset(
            str(mnt / "tierfeed"), "global", batch_size=64, decode=length_and_label, tiers=tiers
        )
        with Loader(ds, num_workers=workers) as loader:
            marker.write("TF iter\n")
            for n, _ in enumerate(loader, 1):
                marker.write(f"TF batch {n}\n")
            marker.write("TF end\n")


def _set(name: str, value: str) -> None:
    (TRACE / name).write_text(value)


def traced(mnt: Path, work: Path, workers: int) -> str:
    """The trace of one cold epoch in a fresh process."""
    _set("tracing_on", "0")
    _set("trace", "")
    _set("buffer_size_kb", "65536")
    _set("trace_clock", "mono")
    for event in ("fuse_request_send", "fuse_request_end"):
        _set(f"events/fuse/{event}/enable", "1")
    _set("tracing_on", "1")
    try:
        with tempfile.TemporaryDirectory(dir=work) as cache:
            argv = [sys.executable, __file__, "--workers", str(workers)]
            subprocess.run([*argv, "--child", str(mnt), cache], check=True, timeout=600)
    finally:
        _set("tracing_on", "0")
        _set("events/fuse/enable", "0")
    return (TRACE / "trace").read_text()


def timeline(trace: str) -> dict[str, Any]:
    """Milestones (ms from the start of the iteration) and read completions per 100 ms."""
    marks: dict[str, float] = {}
    sent: dict[str, tuple[float, str]] = {}
    reads: list[tuple[float, float]] = []
    others: collections.Counter[str] = collections.Counter()
    for line in trace.splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        t, event, rest = float(m.group(1)), m.group(2), m.group(3)
        if event == "tracing_mark_write" and rest.strip().startswith("TF "):
            marks[rest.strip()[3:]] = t
        elif event == "fuse_request_send":
            r = re.search(r"req (\d+) opcode \d+ \((\w+)\)", rest)
            if r:
                sent[r.group(1)] = (t, r.group(2))
        elif event == "fuse_request_end":
            r = re.search(r"req (\d+)", rest)
            if r and r.group(1) in sent:
                start, op = sent.pop(r.group(1))
                if op == "FUSE_READ":
                    reads.append((start, t))
                else:
                    others[op] += 1
    t0, end = marks["iter"], marks["end"]
    batches = sorted((int(k.split()[1]), v) for k, v in marks.items() if k.startswith("batch"))

    def ms(t: float) -> float:
        return round((t - t0) * 1e3, 1)

    chunk_reads = [(s, e) for s, e in reads if s >= t0]  # the index's reads come before
    tenth = [
        sum(1 for _, e in chunk_reads if t0 + k / 10 <= e < t0 + (k + 1) / 10)
        for k in range(int((end - t0) * 10) + 1)
    ]
    # A stalled read that a hedge covered ends after the epoch: the bytes landed without it.
    landed = max(e for _, e in chunk_reads if e <= end)
    return {
        "first_read_ms": ms(min(s for s, _ in chunk_reads)),
        "first_batch_ms": ms(batches[0][1]),
        "batch_10_ms": ms(batches[min(9, len(batches) - 1)][1]),
        "last_read_end_ms": ms(landed),  # of those that ended within the epoch
        "end_ms": ms(end),
        "batches": len(batches),
        "batches_after_last_read": sum(1 for _, t in batches if t > landed),
        "reads": len(chunk_reads),
        "reads_ending_after_the_epoch": sum(1 for _, e in chunk_reads if e > end),
        "reads_done_by_first_batch": sum(1 for _, e in chunk_reads if e <= batches[0][1]),
        "reads_done_per_100ms": tenth,
        "other_requests": dict(others),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--latency", default="nfs")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path("bench-out/cold_path"))
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.workers)
        return
    from bench.cold_path import build
    from tierfeed.latency import LatencyModel
    from tierfeed.slowfs import SlowFS

    args.work.mkdir(parents=True, exist_ok=True)
    origin = build(args.work)
    mnt = args.work / f"mnt-trace-{args.latency}"
    mnt.mkdir(exist_ok=True)
    with SlowFS(origin, mnt, LatencyModel.parse(args.latency)):
        for _ in range(args.runs):
            row = timeline(traced(mnt, args.work, args.workers))
            print(json.dumps({"latency": args.latency, **row}), flush=True)
            time.sleep(0.5)


if __name__ == "__main__":
    main()
