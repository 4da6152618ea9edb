"""CLI subcommand `tierfeed stage`: one process (no torch), or every rank of a torchrun/Slurm job
(torch.distributed)."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import TYPE_CHECKING, Any

from tierfeed.errors import INSTALL_TORCH, ConfigError, ExchangeError

if TYPE_CHECKING:
    from tierfeed.distributed.comm import Comm
    from tierfeed.world import World

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from tierfeed.config import world_from_env
    from tierfeed.distributed.staging import stage

    world = world_from_env()
    comm, own_group = _join(world, args.timeout) if world.world_size > 1 else (None, False)
    try:
        report = stage(args.store, args.to, args.plan, world, comm, progress=not args.quiet)
    finally:
        if comm is not None:
            comm.close()
        if own_group:
            import torch.distributed as dist

            dist.destroy_process_group()
    if world.rank == 0:
        print(json.dumps(report.to_dict()) if args.json else report.summary())
    return 0


def _join(world: World, timeout: float) -> tuple[Comm, bool]:
    """This rank's byte group (torch is needed from here on only), and whether this call
    created the default process group (then the caller destroys it)."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise ConfigError(
            f"stage on {world.world_size} ranks needs PyTorch's torch.distributed ({exc}); "
            f"{INSTALL_TORCH}"
        ) from None

    from tierfeed.config import gloo_on_loopback_if_local
    from tierfeed.distributed.comm import Comm

    own_group = False
    if not dist.is_initialized():
        gloo_on_loopback_if_local()
        try:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
        except (RuntimeError, ValueError) as exc:  # no rendezvous: MASTER_ADDR/PORT wrong
            raise ExchangeError(
                f"rank {world.rank}: cannot join the process group of {world.world_size} "
                f"ranks ({' '.join(str(exc).split())}); check MASTER_ADDR, MASTER_PORT, "
                "RANK and WORLD_SIZE"
            ) from None
        own_group = True
    return Comm(timeout_s=timeout), own_group


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
