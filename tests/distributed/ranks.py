"""Spawn N gloo ranks on 127.0.0.1 for a test: per-test port and paths, a timeout on every join."""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from tests.format.conftest import write_tree
from tierfeed.format.pack import PackOptions, pack


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_store(root: Path, n: int, chunk_size: int = 8192) -> Path:
    """A store of ``n`` class-sorted samples whose payload is their number, ~8 per chunk."""
    files = {f"c{i * 4 // n}/s{i:04d}.txt".encode(): b"%d" % i + b" " * 200 for i in range(n)}
    write_tree(root / "src", files)
    pack(root / "src", root / "store", PackOptions(chunk_size=chunk_size, progress=False))
    return root / "store"


def _entry(
    target: Callable[..., Any], rank: int, world: int, port: int, out: str, *args: Any
) -> None:
    import torch.distributed as dist

    per_node = 1 if world <= 2 else 2  # pretend nodes: one rank each, or two
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(per_node),
        LOCAL_RANK=str(rank % per_node),
    )
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        result = target(rank, world, *args)
        Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_ranks(
    target: Callable[..., Any], world: int, tmp: Path, *args: Any, timeout: float = 100
) -> tuple[list[int | None], list[Any]]:
    """Run ``target(rank, world, *args)`` on ``world`` spawned ranks; their exit codes and
    JSON results (None for a rank that wrote none)."""
    ctx = mp.get_context("spawn")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    outs = [tmp / f"rank{r}.json" for r in range(world)]
    procs = [
        ctx.Process(target=_entry, args=(target, r, world, port, str(outs[r]), *args))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
    for p in procs:
        p.join(max(0.0, (deadline - datetime.datetime.now()).total_seconds()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    results = [json.loads(o.read_text()) if o.exists() else None for o in outs]
    return [p.exitcode for p in procs], results
