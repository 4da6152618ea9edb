"""What a small batch costs to cross from a worker process: torch's shared memory against the
bytes inside the pickle (`tierfeed.torch.handover`).

A forked worker puts ``--batches`` batches of two int64 tensors of ``--values`` values on a
multiprocessing queue, as a DataLoader worker does; the parent takes them off (and, by value,
makes tensors of them again). Prints microseconds per batch for each way, ``--runs`` times.

Usage:
    python bench/handover_pickle.py [--batches 2000] [--values 64] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import time
from multiprocessing.synchronize import Event
from typing import Any

import torch
import torch.multiprocessing as mp

from tierfeed.torch.handover import restore, ship


def worker(q: Any, done: Event, by_value: bool, batches: int, values: int) -> None:
    torch.set_num_threads(1)
    for i in range(batches):
        batch = (torch.arange(values), torch.arange(values), {"position": i})
        q.put(ship(batch) if by_value else batch)
    q.put(None)
    done.wait(60)  # torch's descriptors are served from here until the parent has them


def one(by_value: bool, batches: int, values: int) -> float:
    """Microseconds per batch, the first batch (start-up) left out."""
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=worker, args=(q, done, by_value, batches, values))
    p.start()
    try:
        q.get(timeout=60)
        started, n = time.perf_counter(), 0
        while (batch := q.get(timeout=60)) is not None:
            if by_value:
                restore(batch)
            n += 1
        return (time.perf_counter() - started) / n * 1e6
    finally:
        done.set()
        p.join(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--values", type=int, default=64)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    for _ in range(args.runs):
        for by_value in (False, True):
            us = one(by_value, args.batches, args.values)
            way = "by value" if by_value else "shared memory"
            print(json.dumps({"way": way, "us_per_batch": round(us, 1)}), flush=True)


if __name__ == "__main__":
    main()
