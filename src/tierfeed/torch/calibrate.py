"""`tierfeed simulate --calibrate`: a short probe of a store's real origin and of this node's
loader, the figures `tierfeed.plan.timing` models a job from.

Run as ``python -m tierfeed.torch.calibrate STORE [--workers W] [--batch-size B] [--ranks R]``;
it prints one JSON object: ``origin`` and ``costs`` (the fields of `tierfeed.plan.timing.Origin` and
`Costs`) and ``probe`` (what was measured). `tierfeed simulate` runs it in a process of its
own, with a bound, so that neither torch nor the probe's workers live in the simulating one.

The origin, through the store's own driver (a directory or a URL): single requests of a few
KiB at random offsets (latency: median and lognormal shape), pieces one at a time (a
request's bandwidth), then pieces from 4, 8 and 16 threads at once (the most the origin gave
is taken as its total). Every request reads bytes no earlier one read, so no cache answers.
The loader (`tierfeed.torch.loaderprobe`): the node's R ranks at once, each a Loader with the
job's workers, over the store's first chunks, a cold epoch into one empty disk tier, then warm
ones: the start, the node's CPU a sample costs warm and what each copied byte adds, and the
rate a rank reaches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import numpy as np

from tierfeed.errors import ConfigError, TierfeedError
from tierfeed.format.index import Index
from tierfeed.loader.location import StoreLocation
from tierfeed.plan.timing import Costs, Job, Node, Origin, first_fetch_s
from tierfeed.storage.driver import Driver
from tierfeed.torch.loaderprobe import node_figures, run_ranks

__all__ = ["calibrate"]

SMALL = 4096  # a latency probe's request
PIECE = 4 * 2**20  # a bandwidth probe's request
SPAN = 2**20  # small probes lie this far apart: no readahead of one serves the next
STREAMS = (4, 8, 16)  # threads of the parallel probes
LOADER_SAMPLES = 8000  # samples the loader's probe reads (whole first chunks, at least one)
LOADER_S = 240.0  # the loader's probe ends within this


class _Offsets:
    """Ranges of the store's chunks that no earlier probe read, spread over the chunks."""

    def __init__(self, index: Index, seed: int = 0) -> None:
        sizes = np.asarray(index.chunk_size, dtype=np.int64)
        self._names = [index.chunk_name(c) for c in range(index.num_chunks)]
        self._sizes = sizes
        self._next = np.zeros(len(sizes), dtype=np.int64)  # the chunk's unread bytes start here
        self._small = np.zeros(len(sizes), dtype=np.int64)  # bytes kept at its end for probes
        self._rng = np.random.default_rng(seed)

    def take(self, length: int) -> tuple[str, int, int]:
        """(chunk name, offset, length): unread bytes at the start of a chunk with room."""
        room = self._sizes - self._next - self._small
        fits = np.flatnonzero(room >= length)
        chunk = int(self._rng.choice(fits)) if len(fits) else int(np.argmax(self._sizes))
        offset = int(self._next[chunk]) if len(fits) else 0
        length = min(length, int(self._sizes[chunk]))
        self._next[chunk] = offset + length
        return self._names[chunk], offset, length

    def take_small(self, length: int) -> tuple[str, int, int]:
        """A few bytes from the end of a chunk, a readahead's span from any other read."""
        room = self._sizes - self._next - self._small
        chunk = int(self._rng.choice(np.flatnonzero(room == room.max())))
        self._small[chunk] += max(length, SPAN)
        offset = max(0, int(self._sizes[chunk] - self._small[chunk]))
        return self._names[chunk], offset, min(length, int(self._sizes[chunk]) - offset)


def _timed(driver: Driver, where: tuple[str, int, int]) -> float:
    started = time.perf_counter()
    got = driver.read_range(*where)
    if len(got) != where[2]:
        raise ConfigError(f"{where[0]}: the origin gave {len(got)} of {where[2]} bytes asked")
    return time.perf_counter() - started


def probe_origin(driver: Driver, index: Index, rounds: int = 24) -> dict[str, float]:
    """The origin's latency (median, shape), a request's bandwidth and the most it gave."""
    ranges = _Offsets(index)
    small = [_timed(driver, ranges.take_small(SMALL)) for _ in range(rounds)]
    latency = statistics.median(small)
    sigma = float(np.std(np.log(np.maximum(small, 1e-6))))
    one = statistics.median(_timed(driver, ranges.take(PIECE)) for _ in range(3))
    stream = PIECE / (one - latency) if one > 1.5 * latency else 0.0
    best = PIECE / one
    for n in STREAMS:
        work = [ranges.take(PIECE) for _ in range(n)]
        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda w: _timed(driver, w), work))
        best = max(best, sum(w[2] for w in work) / (time.perf_counter() - started))
    return {"latency_s": latency, "sigma": sigma, "stream_bps": stream, "total_bps": best}


def _first_samples(index: Index, least: int) -> tuple[np.ndarray[Any, np.dtype[np.int64]], int]:
    """The samples of the store's first chunks, at least ``least`` (or all), and how many
    chunks they fill."""
    chunk = np.asarray(index.sample_chunk)
    upto = int(chunk[min(least, len(chunk)) - 1])
    return np.flatnonzero(chunk <= upto).astype(np.int64), upto + 1


def costs_of(node: dict[str, float], origin: Origin, probed: Job, ranks: int) -> Costs:
    """The loader's costs from the node's figures (`loaderprobe.node_figures`) over the
    ``probed`` samples: the node's CPU per warm sample and per copied byte (past the start),
    the start (the last rank's cold first batch less its own reads, as the model reads them:
    `first_fetch_s`), the warm rate of a rank."""
    fetch = first_fetch_s(origin, Node(ranks=ranks), probed)
    mean_bytes = probed.store_bytes / probed.samples
    warm = node["warm_steady_cpu_s"] / max(node["warm_steady_samples"], 1.0)
    cold = node["cold_steady_cpu_s"] / max(node["cold_steady_samples"], 1.0)
    return Costs(
        start_s=max(0.0, node["cold_first_s"] - fetch),
        start_cores=node["cold_first_cpu_s"] / max(node["cold_first_s"], 1e-6) / ranks,
        start_ranks=ranks,
        warm_start_s=node["warm_first_s"],
        cpu_per_sample_s=warm,
        cpu_per_byte_s=max(0.0, cold - warm) / mean_bytes,
        rank_rate=node["warm_steady_samples"] / max(node["warm_steady_s"], 1e-6) / ranks,
    )


def calibrate(
    store: str,
    workers: int = 2,
    batch_size: int = 64,
    ranks: int = 1,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The origin and the loader's costs, probed: ``{"origin", "costs", "probe"}``."""
    location = StoreLocation.of(store)
    say = say or (lambda _: None)
    with location.open_index() as index, location.chunk_origin(index) as driver:
        say(f"probing the origin of {store} ...")
        origin = probe_origin(driver, index)
        ids, chunks = _first_samples(index, LOADER_SAMPLES)  # the chunks the probe copies
        nbytes = int(np.asarray(index.chunk_size, dtype=np.int64)[:chunks].sum())
    say(f"probing this node's loader: {ranks} rank(s), {len(ids)} samples ...")
    go, marks = run_ranks(store, ids, ranks, workers, batch_size, LOADER_S)
    node = node_figures(go, marks)
    modelled = Origin(
        latency_s=origin["latency_s"],
        sigma=origin["sigma"],
        stream_bps=origin["stream_bps"],
        total_bps=origin["total_bps"],
        heads=not location.remote,
    )
    probed = Job(samples=len(ids), store_bytes=nbytes, chunks=chunks, batch_size=batch_size)
    costs = costs_of(node, modelled, probed, ranks)
    probe = {**origin, **node, "samples": float(len(ids)), "bytes": float(nbytes)}
    return {"origin": asdict(modelled), "costs": asdict(costs), "probe": probe}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tierfeed simulate --calibrate", description=__doc__)
    p.add_argument("store")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--ranks", type=int, default=1, help="ranks on the node, probed together")
    args = p.parse_args(argv)
    try:
        out = calibrate(
            args.store,
            args.workers,
            args.batch_size,
            args.ranks,
            lambda s: print(s, file=sys.stderr),
        )
    except TierfeedError as exc:
        print(f"tierfeed simulate: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
