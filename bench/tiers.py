"""Placement policies compared: origin bytes and hit rate over 3 epochs of a shuffled plan.

Usage:
    python bench/tiers.py [--chunks 200] [--per-chunk 100] [--epochs 3]

Reads follow a real plan (global shuffle, and global chunk-wise in windows of 8). Each read of
a sample whose chunk is not cached costs its bytes from the origin; if the policy places the
chunk, its whole copy costs the chunk's bytes. The policies are tierfeed's own placement
classes (the TierStack's), driven synchronously: a copy lands before the next read.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from tierfeed.plan import DatasetShape, Plan, PlanSpec
from tierfeed.storage.placement import Clairvoyant, make_policy


def run(shape: DatasetShape, spec: str, policy_name: str, fraction: float, epochs: int) -> dict:
    plan = Plan(shape, PlanSpec.parse(spec, seed=1))
    orders = [plan.order(e, 0, 1) for e in range(epochs)]
    chunk_bytes = np.bincount(shape.sample_chunk, weights=shape.sample_bytes).astype(np.int64)
    quota = int(fraction * chunk_bytes.sum())
    policy = make_policy(policy_name)
    if isinstance(policy, Clairvoyant):
        reads = np.concatenate([shape.sample_chunk[o] for o in orders])  # one per read
        policy.set_future(reads, read_bytes=float(shape.sample_bytes.mean()))
    cached: dict[int, int] = {}
    rows = []
    for e, order in enumerate(orders):
        origin = hits = 0
        for s in order.tolist():
            c = int(shape.sample_chunk[s])
            policy.accessed(c)
            if c in cached:
                hits += 1
                continue
            origin += int(shape.sample_bytes[s])
            ok, victims = policy.choose(cached, c, int(chunk_bytes[c]), quota)
            for v in victims:
                del cached[v]
            if ok:
                cached[c] = int(chunk_bytes[c])
                origin += int(chunk_bytes[c])
        rows.append({"epoch": e, "origin_GB": round(origin / 1e9, 3),
                     "hit_rate": round(hits / len(order), 3)})  # fmt: skip
    total = round(sum(r["origin_GB"] for r in rows), 3)
    return {"plan": spec, "policy": policy_name, "cache": fraction, "origin_GB_total": total,
            "epochs": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--per-chunk", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    n = args.chunks * args.per_chunk
    sizes = np.random.default_rng(0).lognormal(np.log(110_000), 0.6, n).astype(np.int64)
    shape = DatasetShape(np.arange(n) // args.per_chunk, sizes)
    for spec in ("global", "global,chunkwise:8"):
        for fraction in (0.25, 0.5, 0.75, 1.0):
            for name in ("fill-top", "lru", "clairvoyant"):
                print(json.dumps(run(shape, spec, name, fraction, args.epochs)), flush=True)


if __name__ == "__main__":
    main()
