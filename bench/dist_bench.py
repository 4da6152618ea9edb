"""Four ranks on loopback over a slowed origin: epoch time of partial(q), global over the
exchange, and global straight from the origin.

Usage:
    python bench/dist_bench.py [--samples 12000] [--latency nfs] [--epochs 3] [--runs 3]
                               [--step-ms 30]

One store (random payloads, class-sorted) sits on `tierfeed slowfs`. For each condition, 4
spawned gloo ranks (2 pretend nodes of 2 ranks) stage the store into node directories, then
read `--epochs` epochs with `tierfeed.torch.Loader` (1 worker each, batch 32, the payload
decoded to its length: this measures the data path, not JPEG decoding), sleeping
`--step-ms` per batch for the training step a GPU would take (0: a loader-bound job). The condition
`global-from-origin` skips stage-in and reads the slowed origin each epoch. Origin bytes come
from slowfs's counters, read by rank 0 around the training epochs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.multiprocessing as mp

from tierfeed.format.pack import PackOptions, pack
from tierfeed.latency import LatencyModel
from tierfeed.slowfs import SlowFS
from tierfeed.slowfs.stats import STATS_PATH, SlowFSStats

CONDITIONS = ["partial:0", "partial:0.1", "partial:0.3", "global", "global-from-origin"]
RANKS = 4


def make_source(root: Path, samples: int, seed: int = 0) -> None:
    """Class-sorted random payloads, lognormal sizes around 24 KB."""
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(np.log(24_000), 0.5, samples).astype(int)
    for i, size in enumerate(sizes):
        path = root / f"c{i * 10 // samples:02d}" / f"s{i:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.bytes(int(size)))


def origin_bytes(slow: Path) -> int:
    return SlowFSStats.from_json((slow / STATS_PATH.lstrip("/")).read_bytes()).bytes_read


def rank_main(
    rank: int, port: int, cond: str, slow: str, work: str, epochs: int, step_s: float, out: str
) -> None:
    import torch
    import torch.distributed as dist

    from tierfeed.distributed import Comm, Namespace, stage
    from tierfeed.torch import Dataset, Loader, job_dataset

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                      RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_WORLD_SIZE="2",
                      LOCAL_RANK=str(rank % 2))  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    comm = Comm(timeout_s=300)
    store = Path(slow) / "store"

    def decode(s: Any) -> torch.Tensor:
        return torch.tensor(len(s.fields["bin"]))

    row: dict[str, Any] = {"condition": cond, "rank": rank}
    t0 = time.perf_counter()
    ns = None
    if cond == "global-from-origin":
        ds = Dataset(store, "global", batch_size=32, decode=decode)
    else:
        report = stage(store, os.path.join(work, cond, "node{node}"), cond, comm=comm,
                       progress=False)  # fmt: skip
        ns = Namespace(comm, report.local_dir, cond)
        ds = job_dataset(ns, batch_size=32, decode=decode)
    row["stage_s"] = time.perf_counter() - t0
    comm.barrier("staged")
    before = origin_bytes(Path(slow))
    loader = Loader(ds, num_workers=1)
    row["epoch_s"] = []
    for epoch in range(epochs):
        comm.barrier(f"epoch {epoch}")
        t = time.perf_counter()
        n = 0
        for batch in loader:
            n += len(batch)
            time.sleep(step_s)  # the training step (a GPU's time; the CPU is free meanwhile)
        row["epoch_s"].append(time.perf_counter() - t)
        row["samples"] = n
    loader.close()
    comm.barrier("done")
    row["origin_bytes_training"] = origin_bytes(Path(slow)) - before
    if ns is not None:
        row["exchange"] = ns.exchanger.stats()
        ns.close()
    Path(out).write_text(json.dumps(row))
    comm.close()
    dist.destroy_process_group()


def run_spawned(target: Any, args: list[tuple[Any, ...]], name: str) -> None:
    """One spawned process per argument tuple (a rank each); wait (15 min at most) and
    stop the benchmark if any rank failed."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(900)
        if p.is_alive():
            p.kill()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"{name}: ranks exited {[p.exitcode for p in procs]}")


def free_port() -> int:
    """A free TCP port on loopback for the job's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_condition(
    cond: str, slow: Path, work: Path, epochs: int, step_s: float
) -> list[dict[str, Any]]:
    port = free_port()
    outs = [work / f"{cond}.rank{r}.json" for r in range(RANKS)]
    args = [
        (r, port, cond, str(slow), str(work), epochs, step_s, str(outs[r])) for r in range(RANKS)
    ]
    run_spawned(rank_main, args, cond)
    return [json.loads(o.read_text()) for o in outs]


def summarize(cond: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Epoch time = the slowest rank's; epochs after the first (warm) separately."""
    epochs = [max(r["epoch_s"][e] for r in rows) for e in range(len(rows[0]["epoch_s"]))]
    sent = [r.get("exchange", {}).get("bytes_sent", 0) for r in rows]
    return {
        "condition": cond,
        "stage_s": round(max(r["stage_s"] for r in rows), 2),
        "epoch_s": [round(e, 2) for e in epochs],
        "warm_epoch_s": round(statistics.median(epochs[1:] or epochs), 3),
        "samples_per_epoch": sum(r["samples"] for r in rows),
        "exchange_MB_per_rank": round(statistics.mean(sent) / 1e6, 1),
        "origin_MB_training": round(rows[0]["origin_bytes_training"] / 1e6, 1),
        "max_held": max(r.get("exchange", {}).get("max_held", 0) for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--step-ms", type=float, default=30.0, help="training step per batch")
    parser.add_argument("--latency", default="nfs")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="bench-out/dist.json")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONDITIONS}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        make_source(base / "raw", args.samples)
        (base / "origin").mkdir()
        pack(base / "raw", base / "origin" / "store",
             PackOptions(chunk_size=2 * 2**20, progress=False))  # fmt: skip
        slow = base / "slow"
        slow.mkdir()
        with SlowFS(base / "origin", slow, LatencyModel.parse(args.latency)):
            for run in range(args.runs):  # conditions interleaved: noise hits all alike
                for cond in CONDITIONS:
                    work = base / f"run{run}"
                    work.mkdir(exist_ok=True)
                    row = summarize(
                        cond, run_condition(cond, slow, work, args.epochs, args.step_ms / 1e3)
                    )
                    results[cond].append(row)
                    print(json.dumps(row), flush=True)
    table = []
    base_warm = statistics.median(r["warm_epoch_s"] for r in results["partial:0"])
    for cond, rows in results.items():
        warm = statistics.median(r["warm_epoch_s"] for r in rows)
        table.append({"condition": cond, "warm_epoch_s_median": warm,
                      "vs_partial0": round(warm / base_warm, 3),
                      "stage_s_median": statistics.median(r["stage_s"] for r in rows),
                      "exchange_MB_per_rank": rows[0]["exchange_MB_per_rank"],
                      "origin_MB_training": rows[0]["origin_MB_training"],
                      "max_held": rows[0]["max_held"]})  # fmt: skip
        print(json.dumps(table[-1]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": results, "table": table}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
