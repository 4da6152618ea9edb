"""CLI subcommand `tierfeed simulate`."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from tierfeed.errors import ConfigError
from tierfeed.plan.plan import Plan, PlanSpec
from tierfeed.plan.shape import DatasetShape
from tierfeed.plan.simulate import as_dict, simulate
from tierfeed.units import human, parse_size

__all__ = ["register"]


def _size(text: str) -> int:
    """An argparse type: a bad size is a usage error (exit 2), in parse_size's words."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shape(args: argparse.Namespace) -> DatasetShape:
    n = args.samples
    mean: int = args.sample_bytes
    rng = np.random.default_rng(args.seed)
    sizes = rng.lognormal(np.log(mean) - args.sigma**2 / 2, args.sigma, size=n).astype(np.int64)
    per_chunk = max(1, args.chunk_size // max(1, mean))
    chunk = np.arange(n, dtype=np.int64) // per_chunk
    return DatasetShape(chunk, np.maximum(sizes, 1))


def _run(args: argparse.Namespace) -> int:
    shape = _shape(args)
    plan = Plan(shape, PlanSpec.parse(args.plan, seed=args.seed))
    rows = simulate(shape, plan, args.ranks, args.epochs, args.sample_ranks)
    if args.json:
        print(json.dumps(as_dict(rows), indent=1))
        return 0
    total = int(shape.sample_bytes.sum())
    print(
        f"{shape.num_samples:,} samples, {human(total)}, {shape.num_chunks:,} chunks, "
        f"{args.ranks:,} ranks, plan {plan.spec} (computed on {min(args.sample_ranks, args.ranks)} "
        "ranks, totals extrapolated)"
    )
    print(
        f"{'epoch':>5} {'origin/rank':>12} {'origin total':>13} {'exchange/rank':>14} "
        f"{'exch. total':>12} {'cache/rank':>11} {'plan s':>7} {'plan mem':>9}"
    )
    for r in rows:
        print(
            f"{r.epoch:>5} {human(r.origin_mean):>12} {human(r.totals['origin']):>13} "
            f"{human(r.exchange_mean):>14} {human(r.totals['exchange']):>12} "
            f"{human(r.cache_max):>11} {r.plan_seconds_max:>7.3f} {human(r.plan_peak_bytes):>9}"
        )
    return 0


def register(sub: Any) -> None:
    """Add `tierfeed simulate`."""
    p = sub.add_parser(
        "simulate",
        help="origin, exchange and cache bytes per epoch of a plan",
        description="Compute a sampling plan on a synthetic dataset of lognormal sample sizes "
        "and print, per epoch, the bytes each rank reads from the origin, exchanges with peers "
        "and keeps in its cache. Nothing is read or written.",
    )
    p.add_argument("--samples", type=int, required=True, help="number of samples in the dataset")
    p.add_argument(
        "--sample-bytes",
        type=_size,
        default="110KB",
        help="mean sample size, lognormal (default 110KB)",
    )
    p.add_argument(
        "--sigma", type=float, default=0.6, help="lognormal shape of sizes (default 0.6)"
    )
    p.add_argument(
        "--chunk-size", type=_size, default="64MiB", help="target chunk size (default 64MiB)"
    )
    p.add_argument("--ranks", type=int, required=True, help="number of ranks in the job")
    p.add_argument(
        "--plan",
        default="global",
        help="sampling plan: global, local, partial:Q, chunkwise:K, or a combination such as "
        "partial:0.1,chunkwise:4 (default global)",
    )
    # The old name of --plan, hidden: still read, and silent so that an error stays one line.
    p.add_argument("--policy", dest="plan", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=3, help="epochs to simulate (default 3)")
    p.add_argument(
        "--sample-ranks",
        type=int,
        default=16,
        help="ranks actually computed; totals are extrapolated to --ranks (default 16)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the plan and the sizes (default 0)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=_run)
