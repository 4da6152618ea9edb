"""CLI subcommand `tierfeed simulate`: a plan's traffic on a real store (from its index, every
rank and epoch: `tierfeed.distributed.traffic`) or on synthetic sizes (`tierfeed.plan.simulate`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from tierfeed.distributed.exchanger import ExchangeOptions
from tierfeed.distributed.simulate_time import (
    add_time_arguments,
    check_layout,
    print_times,
    times,
    wants_time,
)
from tierfeed.errors import ConfigError
from tierfeed.plan import Plan, PlanSpec
from tierfeed.plan.shape import DatasetShape
from tierfeed.plan.simulate import as_dict, simulate
from tierfeed.units import human, size_argument

__all__ = ["register"]


def _shape(args: argparse.Namespace) -> tuple[DatasetShape, int]:
    """The synthetic dataset, and its total bytes."""
    n = args.samples
    mean: int = args.sample_bytes
    rng = np.random.default_rng(args.seed)
    sizes = rng.lognormal(np.log(mean) - args.sigma**2 / 2, args.sigma, size=n).astype(np.int64)
    per_chunk = max(1, args.chunk_size // max(1, mean))
    chunk = np.arange(n, dtype=np.int64) // per_chunk
    sizes = np.maximum(sizes, 1)
    return DatasetShape(chunk, sizes), int(sizes.sum())


def _run(args: argparse.Namespace) -> int:
    if args.store is not None:
        return _run_store(args)
    if args.samples is None:
        raise ConfigError("give a STORE, or --samples for a synthetic dataset")
    shape, total = _shape(args)
    plan = Plan(shape, PlanSpec.parse(args.plan, seed=args.seed))
    rows = simulate(shape, plan, args.ranks, args.epochs, args.sample_ranks)
    timed = times(args, shape.num_samples, total, shape.num_chunks) if wants_time(args) else None
    if args.json:
        print(json.dumps(_with_time(as_dict(rows), timed), indent=1))
        return 0
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
    if timed is not None:
        print_times(timed)
    return 0


def _with_time(rows: list[dict[str, Any]], timed: dict[str, Any] | None) -> Any:
    """The rows as today, or, with time asked, ``{"traffic": rows, "time": ...}``."""
    return rows if timed is None else {"traffic": rows, "time": timed}


def _run_store(args: argparse.Namespace) -> int:
    from tierfeed.distributed.traffic import job_traffic
    from tierfeed.loader.location import StoreLocation

    if args.ranks < 1 or args.window < 1:
        raise ConfigError(f"--ranks and --window must be positive: {args.ranks}, {args.window}")
    check_layout(args)
    spec = PlanSpec.parse(args.plan, seed=args.seed)
    with StoreLocation.of(args.store).open_index() as index:
        rows = job_traffic(index, spec, args.ranks, args.ranks_per_node, args.epochs, args.window)
        total = int(np.asarray(index.chunk_size, dtype=np.int64).sum())
        head = f"{index.num_samples:,} samples, {human(total)}, {index.num_chunks:,} chunks"
        shape = (index.num_samples, total, index.num_chunks)
    timed = times(args, *shape) if wants_time(args) else None
    if args.json:
        print(json.dumps(_with_time([r.to_dict() for r in rows], timed), indent=1))
        return 0
    print(
        f"{head}, {args.ranks:,} ranks ({args.ranks_per_node} per node), plan {spec}, "
        f"exchange window {args.window}"
    )
    print(
        f"{'epoch':>5} {'rank':>6} {'origin':>10} {'sent':>10} {'received':>10} "
        f"{'held':>10} {'cache':>10}"
    )
    per_rank = args.ranks <= 16  # more: the mean and the most over ranks
    for epoch in range(args.epochs):
        here = [r for r in rows if r.epoch == epoch]
        lines = [(str(r.rank), r.origin, r.sent, r.received, r.held, r.cache) for r in here]
        if not per_rank:
            cols = np.array([[r.origin, r.sent, r.received, r.held, r.cache] for r in here])
            lines = [("mean", *cols.mean(axis=0)), ("max", *cols.max(axis=0))]
        for name, *values in lines:
            print(f"{epoch:>5} {name:>6} " + " ".join(f"{human(v):>10}" for v in values))
    if timed is not None:
        print_times(timed)
    return 0


def register(sub: Any) -> None:
    """Add `tierfeed simulate`."""
    p = sub.add_parser(
        "simulate",
        help="origin, exchange and cache bytes per epoch of a plan",
        description="Compute a job's sampling plan and print, per epoch, the bytes each rank "
        "reads from the origin, exchanges with peers, holds on local storage and keeps in its "
        "cache. With STORE: the store's own index, the job staged in (the holdings, plans and "
        "exchange schedules the job runs), every rank. Without: a synthetic dataset of "
        "lognormal sample sizes (--samples), a sample of ranks. Only the index is read.",
    )
    _add_dataset_arguments(p)
    _add_job_arguments(p)
    add_time_arguments(p)
    p.set_defaults(func=_run)


def _add_dataset_arguments(p: argparse.ArgumentParser) -> None:
    """What is read: a STORE, or the synthetic dataset's shape."""
    p.add_argument(
        "store", nargs="?", default=None, metavar="STORE", help="a store (directory or URL)"
    )
    p.add_argument("--samples", type=int, help="synthetic: number of samples in the dataset")
    p.add_argument(
        "--sample-bytes",
        type=size_argument,
        default="110KB",
        help="mean sample size, lognormal (default 110KB)",
    )
    p.add_argument(
        "--sigma", type=float, default=0.6, help="lognormal shape of sizes (default 0.6)"
    )
    p.add_argument(
        "--chunk-size",
        type=size_argument,
        default="64MiB",
        help="target chunk size (default 64MiB)",
    )


def _add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The job: ranks, plan, epochs, exchange window, and what is printed."""
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
        "--ranks-per-node", type=int, default=1, help="STORE: ranks per node (default 1)"
    )
    p.add_argument(
        "--window",
        type=int,
        default=ExchangeOptions().window,
        help=f"STORE: exchange window in positions (default {ExchangeOptions().window})",
    )
    p.add_argument(
        "--sample-ranks",
        type=int,
        default=16,
        help="synthetic: ranks computed; totals are extrapolated to --ranks (default 16)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the plan and the sizes (default 0)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
