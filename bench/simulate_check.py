"""`tierfeed simulate STORE` against real runs: per rank and epoch, origin, exchange, held and
cache bytes, measured in a staged job and computed from the store's index.

Usage:
    python bench/simulate_check.py [--samples 6000] [--epochs 3] [--out bench-out/simcheck.json]
    python bench/simulate_check.py --table bench-out/simcheck.json   # the table of a run

One store (random payloads of lognormal sizes around 24 KB, class-sorted, 2 MiB chunks, as
`bench/dist_bench.py` makes). For each world (2 ranks on 2 pretend nodes; 4 ranks on 2 nodes of
2) and plan (local, partial:0.3, global), spawned gloo ranks stage the store into node
directories, then read ``--epochs`` epochs through `Namespace` with a disk cache tier per rank
(room for everything) and `tierfeed.torch.Loader` (1 worker, batch 32). Measured per rank and
epoch: origin bytes (`StageReport.rank_bytes_copied`, in epoch 0), exchange bytes sent and
received (the exchanger's counters, after `finish()` settles the epoch's moves), the most
sample bytes held at once (`max_held_bytes`, so far), and the chunk bytes in the rank's cache
tier once it is quiet. `tierfeed.distributed.traffic.job_traffic` computes the same from the
index; the script prints measured / simulated for each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from dist_bench import free_port, make_source, run_spawned
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack

PLANS = ["local", "partial:0.3", "global"]
WORLDS = [2, 4]
WINDOW = 64
METRICS = ["origin", "sent", "received", "held", "cache"]


def per_node(world: int) -> int:
    return 1 if world <= 2 else 2


def cache_bytes(cache: Path) -> int:
    """Bytes of the chunks placed in a disk tier's directory (its visible files; landing
    copies and locks are hidden), once they stop changing (<= 10 s)."""
    last, same, deadline = -1, 0, time.monotonic() + 10
    while time.monotonic() < deadline:
        now = sum(p.stat().st_size for p in cache.glob("*.tar") if p.is_file())
        same = same + 1 if now == last else 0
        if same >= 3:
            break
        last = now
        time.sleep(0.2)
    return last


def rank_main(
    rank: int, world: int, port: int, plan: str, store: str, work: str, epochs: int, out: str
) -> None:
    import torch
    import torch.distributed as dist

    from tierfeed.distributed import Comm, ExchangeOptions, Namespace, stage
    from tierfeed.loader.compose import TierConfig
    from tierfeed.torch import Loader, job_dataset

    node = per_node(world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(node),
                      LOCAL_RANK=str(rank % node))  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    comm = Comm(timeout_s=300)
    report = stage(store, os.path.join(work, "node{node}"), plan, comm=comm, progress=False)
    cache = Path(work) / f"cache{rank}"
    tiers = TierConfig(disk_dir=str(cache))  # room for the whole store
    options = ExchangeOptions(window=WINDOW, timeout_s=300)
    rows: list[dict[str, Any]] = []
    with Namespace(comm, report.local_dir, plan, options=options, tiers=tiers) as ns:
        loader = Loader(job_dataset(ns, batch_size=32, decode=lambda s: 0), num_workers=1)
        sent = received = 0
        for epoch in range(epochs):
            comm.barrier(f"epoch {epoch}")
            for _ in loader:
                pass
            ns.exchanger.finish()  # the epoch's last moves, settled
            stats = ns.exchanger.stats()
            rows.append({
                "epoch": epoch, "rank": rank,
                "origin": report.rank_bytes_copied if epoch == 0 else 0,
                "sent": stats["bytes_sent"] - sent, "received": stats["bytes_received"] - received,
                "held": stats["max_held_bytes"], "cache": cache_bytes(cache),
            })  # fmt: skip
            sent, received = stats["bytes_sent"], stats["bytes_received"]
        loader.close()
    Path(out).write_text(json.dumps(rows))
    comm.close()
    dist.destroy_process_group()


def run_job(plan: str, world: int, store: Path, work: Path, epochs: int) -> list[dict[str, Any]]:
    port = free_port()
    work.mkdir(parents=True)
    outs = [work / f"rank{r}.json" for r in range(world)]
    args = [
        (r, world, port, plan, str(store), str(work), epochs, str(o)) for r, o in enumerate(outs)
    ]
    run_spawned(rank_main, args, f"{plan} x{world}")
    return sorted((row for o in outs for row in json.loads(o.read_text())),
                  key=lambda r: (r["epoch"], r["rank"]))  # fmt: skip


def simulated(plan: str, world: int, store: Path, epochs: int) -> list[dict[str, Any]]:
    from tierfeed.distributed.traffic import job_traffic

    with Index(store) as ix:
        rows = [r.to_dict() for r in job_traffic(ix, plan, world, per_node(world), epochs, WINDOW)]
    held: dict[int, int] = {}
    for row in rows:  # measured: the most held so far
        held[row["rank"]] = row["held"] = max(held.get(row["rank"], 0), row["held"])
    return rows


def compare(measured: list[dict[str, Any]], sim: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: the ratios measured / simulated over ranks and epochs (both 0: 1.0)."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        ratios = []
        for m, s in zip(measured, sim, strict=True):
            assert (m["epoch"], m["rank"]) == (s["epoch"], s["rank"])
            if m[metric] == s[metric] == 0:
                ratios.append(1.0)
            else:
                ratios.append(m[metric] / s[metric] if s[metric] else float("inf"))
        out[metric] = {"min": round(min(ratios), 4), "max": round(max(ratios), 4),
                       "within_10pct": all(0.9 <= r <= 1.1 for r in ratios)}  # fmt: skip
    return out


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per plan and world, job totals (MB) per metric, measured and simulated, and
    the per-rank-and-epoch ratios' range."""
    lines = [
        "| plan | ranks | origin MB | sent MB, epochs | held MB, most | cache MB, end "
        "| measured / simulated, every rank and epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results:
        meas, sim = row["measured"], row["simulated"]
        epochs = sorted({r["epoch"] for r in meas})

        def mb(rows: list[dict[str, Any]], metric: str, epoch: int | None = None) -> float:
            return sum(r[metric] for r in rows if epoch is None or r["epoch"] == epoch) / 1e6

        def most(rows: list[dict[str, Any]], metric: str) -> float:
            return max(r[metric] for r in rows) / 1e6

        sent = ", ".join(f"{mb(meas, 'sent', e):.1f}" for e in epochs)
        sim_sent = ", ".join(f"{mb(sim, 'sent', e):.1f}" for e in epochs)
        last = epochs[-1]
        ratios = row["ratios"]
        spread = "; ".join(f"{k} {v['min']:.3f}-{v['max']:.3f}" for k, v in ratios.items())
        lines.append(
            f"| {row['plan']} | {row['world']} | {mb(meas, 'origin'):.1f} / "
            f"{mb(sim, 'origin'):.1f} | {sent} / {sim_sent} | {most(meas, 'held'):.1f} / "
            f"{most(sim, 'held'):.1f} | {mb(meas, 'cache', last):.1f} / "
            f"{mb(sim, 'cache', last):.1f} | {spread} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default="bench-out/simcheck.json")
    parser.add_argument("--table", metavar="JSON", help="only print the table of an earlier run")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        make_source(base / "raw", args.samples)
        store = base / "store"
        pack(base / "raw", store, PackOptions(chunk_size=2 * 2**20, progress=False))
        for world in WORLDS:
            for plan in PLANS:
                work = base / f"{plan.replace(':', '')}-x{world}"
                measured = run_job(plan, world, store, work, args.epochs)
                sim = simulated(plan, world, store, args.epochs)
                row = {"plan": plan, "world": world, "ratios": compare(measured, sim),
                       "measured": measured, "simulated": sim}  # fmt: skip
                results.append(row)
                print(json.dumps({"plan": plan, "world": world, **row["ratios"]}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    sys.exit(main())
