"""CLI subcommand `tierfeed stage`: one process, or every rank of a torchrun/Slurm job."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from tierfeed.errors import INSTALL_TORCH, ConfigError, ExchangeError

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise ConfigError(
            f"stage needs PyTorch's torch.distributed ({exc}); {INSTALL_TORCH}"
        ) from None

    from tierfeed.config import gloo_on_loopback_if_local, world_from_env
    from tierfeed.distributed.comm import Comm
    from tierfeed.distributed.staging import stage

    world = world_from_env()
    comm: Comm | None = None
    own_group = False
    if world.world_size > 1:
        if not dist.is_initialized():
            gloo_on_loopback_if_local()
            try:
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
            except (RuntimeError, ValueError) as exc:  # no rendezvous: MASTER_ADDR/PORT wrong
                raise ExchangeError(
                    f"rank {world.rank}: cannot join the process group of {world.world_size} "
                    f"ranks ({' '.join(str(exc).split())}); check MASTER_ADDR, MASTER_PORT, "
                    "RANK and WORLD_SIZE"
                ) from None
            own_group = True
        comm = Comm(timeout_s=args.timeout)
    try:
        report = stage(args.store, args.to, args.plan, world, comm, progress=not args.quiet)
    finally:
        if comm is not None:
            comm.close()
        if own_group:
            dist.destroy_process_group()
    if world.rank == 0:
        print(json.dumps(report.to_dict()) if args.json else report.summary())
    return 0


def register(sub: Any) -> None:
    """Add `tierfeed stage`."""
    p = sub.add_parser(
        "stage",
        help="copy a store's chunks to node-local storage (every rank a disjoint share)",
        description=(
            "Stage-in: each rank copies a disjoint set of chunks, balanced by bytes, from the "
            "store into its node's local directory; ranks of a node share it, and every chunk "
            "is read from the origin once per job. Verified chunks already present are "
            "skipped, so a stage-in resumes. Run it in one process, or under torchrun/Slurm "
            "(rank and world from the environment)."
        ),
    )
    p.add_argument(
        "store", help="the store at the origin (its directory, or a URL: s3://bucket/ds)"
    )
    p.add_argument(
        "--to",
        required=True,
        help="node-local directory; {node} and {rank} are filled in (e.g. /local/ssd/ds)",
    )
    p.add_argument(
        "--plan",
        default="global",
        help="sampling plan the job reads with: global (default), local or partial:Q; the "
        "partition plans (local, partial:Q) stage each rank's own partition",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds any wait on a peer may take"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
