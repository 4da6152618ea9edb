"""A training loop for test_torchrun_elastic, run by torchrun's workers (a script: no `tests`
import): read an epoch with tierfeed, log every batch's sample ids, checkpoint every rank's
loader state, and resume from the last checkpoint when torchrun restarts the workers.

Usage: elastic_train.py STORE RUN_DIR --every K --pace S

After each checkpoint a worker waits while RUN_DIR/gate exists (at most GATE_S): the test
holds the job there while it takes a node away or adds one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tierfeed.storage.store import Sample
from tierfeed.torch import Dataset, Loader

GATE_S = 120.0


def decode(s: Sample) -> torch.Tensor:
    return torch.tensor(int(s.fields["txt"].split()[0]))


def append(log: Path, record: dict[str, Any]) -> None:
    """One JSON line, on disk before the next batch: a SIGKILL loses nothing written."""
    with log.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_atomically(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def wait_at_gate(gate: Path) -> None:
    deadline = time.monotonic() + GATE_S
    while gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} still there after {GATE_S:.0f} s")
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("run_dir")
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--pace", type=float, default=0.05)
    args = ap.parse_args()
    run = Path(args.run_dir)
    node = os.environ["TEST_NODE"]  # set per agent by the test: which "node" this worker is on
    (run / "pids").mkdir(exist_ok=True)
    write_atomically(run / "pids" / f"{node}.json", {"pid": os.getpid()})
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    generation = [uuid.uuid4().hex[:8] if rank == 0 else None]
    dist.broadcast_object_list(generation, src=0)  # one name for this rendezvous's workers
    gen = generation[0]
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = run / "logs" / f"{gen}-rank{rank}.jsonl"
    log.parent.mkdir(exist_ok=True)
    (run / "ckpts").mkdir(exist_ok=True)
    ckpt_path = run / "ckpt.json"

    loader = Loader(Dataset(args.store, "global", batch_size=4, decode=decode), num_workers=0)
    ckpt = json.loads(ckpt_path.read_text()) if ckpt_path.exists() else None
    dist.barrier()  # every rank has read the same checkpoint before rank 0 may write the next
    if ckpt is not None:
        loader.load_state_dict(ckpt["states"])  # every old rank's state: any world resumes
    loaded = None if ckpt is None else ckpt["seq"]
    delivered: list[int] = [] if ckpt is None else ckpt["delivered"]
    append(
        log,
        {
            "event": "start",
            "gen": gen,
            "restart": restart,
            "world": world,
            "rank": rank,
            "node": node,
            "loaded": loaded,
            "loaded_gen": None if ckpt is None else ckpt["gen"],
        },
    )
    seq = 0 if loaded is None else loaded
    mine: list[int] = []  # this rank's ids since the last checkpoint
    for step, batch in enumerate(loader, 1):
        ids = [int(v) for v in batch]
        mine += ids
        append(log, {"event": "batch", "gen": gen, "restart": restart, "world": world, "ids": ids})
        time.sleep(args.pace)
        if step % args.every == 0:
            states = loader.gather_state_dict()  # a collective: every rank at this batch
            news: list[Any] = [None] * world
            dist.all_gather_object(news, mine)
            delivered += [i for ids in news for i in ids]
            mine = []
            seq += 1
            if rank == 0:
                record = {
                    "seq": seq,
                    "gen": gen,
                    "world": world,
                    "states": states,
                    "delivered": delivered,
                }
                write_atomically(run / "ckpts" / f"{seq}-{gen}.json", record)  # for the test
                write_atomically(ckpt_path, record)
            dist.barrier()  # the checkpoint is on disk before anyone goes on
            append(log, {"event": "ckpt", "gen": gen, "seq": seq})
            wait_at_gate(run / "gate")
    append(log, {"event": "done", "gen": gen, "world": world})
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
