"""Rank bodies for the distributed tests (module level: spawned processes import them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from tierfeed.distributed import Comm, ExchangeOptions, Namespace, stage
from tierfeed.loader import PrefetchOptions
from tierfeed.storage.store import Sample


def decode(s: Sample) -> torch.Tensor:
    return torch.tensor(int(s.fields["txt"].split()[0]))


def stage_twice(rank: int, world: int, store: str, to: str, plan: str) -> dict[str, Any]:
    """Stage, then stage again (resumes: nothing copied)."""
    comm = Comm(timeout_s=30)
    first = stage(store, to, plan, comm=comm, progress=False)
    second = stage(store, to, plan, comm=comm, progress=False)
    local = Path(first.local_dir)
    chunks = sorted(p.name for p in (local / "chunks").iterdir() if not p.name.startswith("."))
    parts = sorted(p.name for p in (local / "parts" / f"rank{rank}").glob("*.idx"))
    comm.close()
    return {"first": first.to_dict(), "second": second.to_dict(), "chunks": chunks, "parts": parts}


def train(
    rank: int, world: int, store: str, to: str, plan: str, epochs: int, workers: int, hide: str
) -> dict[str, Any]:
    """Stage, hide the origin, then read ``epochs`` epochs over the namespace."""
    from tierfeed.torch import Loader, job_dataset

    comm = Comm(timeout_s=30)
    report = stage(store, to, plan, comm=comm, progress=False)
    comm.barrier("staged")
    if rank == 0 and hide:
        os.rename(store, hide)  # from here on nothing may read the origin
    comm.barrier("origin hidden")
    options = ExchangeOptions(window=16, ahead=2, timeout_s=30)
    seen, held = [], []
    with Namespace(comm, report.local_dir, plan, options=options) as ns:
        ds = job_dataset(
            ns, batch_size=4, decode=decode, prefetch=PrefetchOptions(window=8, threads=4)
        )
        loader = Loader(ds, num_workers=workers)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            seen.append([int(v) for batch in loader for v in batch])
            held.append(ns.exchanger.counters.max_held)
        stats = ns.exchanger.stats()
        partitions = [ns.plan.order(e, rank, world).tolist() for e in range(epochs)]
    comm.close()
    return {"seen": seen, "stats": stats, "held": held, "planned": partitions}


def die_midway(rank: int, world: int, store: str, to: str, plan: str) -> dict[str, Any]:
    """Rank 1 dies after its first batch; the others must fail fast with a clear error."""
    import time

    from tierfeed.torch import Loader, job_dataset

    comm = Comm(timeout_s=20)
    report = stage(store, to, plan, comm=comm, progress=False)
    options = ExchangeOptions(window=8, ahead=1, timeout_s=20)
    ns = Namespace(comm, report.local_dir, plan, options=options)
    ds = job_dataset(ns, batch_size=4, decode=decode, prefetch=PrefetchOptions(window=4, threads=2))
    started = time.monotonic()
    try:
        for i, _ in enumerate(Loader(ds, num_workers=0)):
            if rank == 1 and i == 0:
                os._exit(17)
        return {"error": None, "seconds": time.monotonic() - started}
    except Exception as exc:  # the test inspects it
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - started}


def pls_loop(rank: int, world: int, store: str, to: str, q: float) -> dict[str, Any]:
    """A training loop written against the PLS scheduler's calls."""
    from tierfeed.distributed.pls import Scheduler

    comm = Comm(timeout_s=30)
    report = stage(store, to, f"partial:{q}", comm=comm, progress=False)
    sched = Scheduler(report.local_dir, batch_size=4, fraction=q, comm=comm,
                      options=ExchangeOptions(window=8, timeout_s=30))  # fmt: skip
    seen = []
    for epoch in range(3):
        order = sched.scheduling(epoch)
        got = []
        for step in range(sched.steps):
            ids = order[step * 4 : (step + 1) * 4]
            got += [int(sched.store.read_sample(int(i)).fields["txt"]) for i in ids]
            sched.communicate()
        sched.synchronize()
        seen.append(got)
    sent = sched.namespace.exchanger.counters.samples_sent
    sched.clean_local_storage()
    left = [p.name for p in (Path(report.local_dir) / "chunks").iterdir()]
    left += [p.name for p in (Path(report.local_dir) / "parts" / f"rank{rank}").glob("*")]
    comm.close()
    return {"seen": seen, "sent": sent, "left": left}


def crash_mid_epoch(rank: int, world: int, store: str, to: str, plan: str) -> dict[str, Any]:
    """Read epochs 0 and 1, then half of epoch 2; return the state as a crashing job would
    have checkpointed it (nothing is closed)."""
    from tierfeed.torch import Loader, job_dataset

    comm = Comm(timeout_s=30)
    report = stage(store, to, plan, comm=comm, progress=False)
    ns = Namespace(comm, report.local_dir, plan, options=ExchangeOptions(window=8, timeout_s=30))
    loader = Loader(job_dataset(ns, batch_size=4, decode=decode), num_workers=0)
    for _ in range(2):
        for _ in loader:
            pass
    seen: list[int] = []
    for i, batch in enumerate(loader):
        seen += [int(v) for v in batch]
        if i == 5:
            break
    return {"seen": seen, "state": loader.state_dict()}


def resume_after_crash(
    rank: int, world: int, store: str, to: str, plan: str, states: list[dict[str, Any]]
) -> dict[str, Any]:
    """A restarted job: stage again, restore the epoch's partitions, resume the loader."""
    from tierfeed.torch import Loader, job_dataset

    comm = Comm(timeout_s=30)
    report = stage(store, to, plan, comm=comm, progress=False)
    ns = Namespace(comm, report.local_dir, plan, options=ExchangeOptions(window=8, timeout_s=30))
    state = states[rank]
    ns.exchanger.restore(int(state["epoch"]))
    loader = Loader(job_dataset(ns, batch_size=4, decode=decode), num_workers=0)
    loader.load_state_dict(state)
    rest = [int(v) for batch in loader for v in batch]
    after = [int(v) for batch in loader for v in batch]
    ns.close()
    comm.close()
    return {"rest": rest, "next": after, "recopied": report.chunks_copied}


def train_with_ram(
    rank: int, world: int, store: str, to: str, plan: str, epochs: int, workers: int
) -> dict[str, Any]:
    """Stage, then read ``epochs`` epochs over the namespace through a RAM tier."""
    from tierfeed.loader import TierConfig
    from tierfeed.torch import Loader, job_dataset

    comm = Comm(timeout_s=30)
    report = stage(store, to, plan, comm=comm, progress=False)
    options = ExchangeOptions(window=16, ahead=2, timeout_s=30)
    tiers = TierConfig(ram_bytes=2**24, policy="fill-top", threads=2)
    seen, stats = [], []
    with Namespace(comm, report.local_dir, plan, options=options, tiers=tiers) as ns:
        loader = Loader(job_dataset(ns, batch_size=4, decode=decode), num_workers=workers)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            seen.append([int(v) for batch in loader for v in batch])
            assert loader.last_epoch is not None
            stats.append(loader.last_epoch["tiers"])
        loader.close()
        planned = [ns.plan.order(e, rank, world).tolist() for e in range(epochs)]
        local = int(ns.holdings.local_to(rank).sum())
    comm.close()
    return {"seen": seen, "tiers": stats, "planned": planned, "local_chunks": local}


def read_then_gather(rank: int, world: int, store: str, batches: int) -> dict[str, Any]:
    """Read ``batches`` batches of epoch 0 (the world from torch.distributed), then gather
    every rank's loader state, as a job checkpointing before a resize would."""
    from tierfeed.torch import Dataset, Loader

    loader = Loader(Dataset(store, "global", batch_size=4, decode=decode), num_workers=0)
    seen = [int(v) for _, batch in zip(range(batches), loader, strict=False) for v in batch]
    states = loader.gather_state_dict()
    loader.close()
    return {"seen": seen, "states": states}
