"""`tierfeed simulate` with time: a job's epochs in seconds, from the origin, the node and the
loader's own costs, and the smallest cache and the node counts that keep the model fed.

The model, per node and epoch (every figure comes in as an argument; nothing here does I/O):

- **Bytes.** A global plan's node reads every chunk its samples lie in; a local or partial
  plan's node holds its partition (1/N of the store). What the node's cache holds is copied
  in whole pieces in the first epoch and read locally after; what it cannot hold is read from
  the origin sample by sample, every epoch. A partial plan also exchanges Q of its partition
  with peers each epoch after the first, over the NIC.
- **Origin.** A request costs the origin's latency (a lognormal's mean) plus its bytes over a
  request's bandwidth; the fetch keeps ``streams`` requests in flight (the tuner's most); the
  origin's total bandwidth is shared by the nodes, each node's by its NIC. Pieces are sized
  as `tierfeed.storage.tuning` sizes them. The tail: a stalled piece is hedged after three
  times a piece's time, so a stall costs the epoch that long, spread over the streams.
- **Node.** The loader spends CPU per sample served (warm) and per byte copied from the
  origin (cold), and in a cold epoch its start's CPU too, over the node's cores, and no
  faster than its ranks' measured rate; local bytes beyond what the page cache holds (half
  the RAM) are read at the disk's bandwidth; a POSIX origin's bytes read again in a later
  epoch come from that page cache too while it has room beside the cache tier's (its client
  keeps the files open, as tierfeed does).
- **Epoch.** These run overlapped: an epoch takes the longest of origin, exchange, local
  reads, CPU and the model's own steps, after its start; a cold epoch's copies begin once the
  index is read, while the workers start, so it takes that longest part from then, and never
  less than its first batch. The accelerators wait when an I/O part is the longest.
- **First batch.** The start, the index (two requests), then the batch's samples: read
  directly from a POSIX origin (``heads``), or, from an object store, once nearly every piece
  of the share has landed (the copies of every chunk go in the order of need, and a global
  shuffle's first batches need a piece of nearly every chunk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.latency import LatencyModel

__all__ = [
    "Costs",
    "EpochTime",
    "Job",
    "Node",
    "Origin",
    "epoch_times",
    "fed_nodes",
    "first_fetch_s",
    "least_cache",
]

MIN_PIECE, MAX_PIECE, PIECE_S = 512 * 1024, 16 * 2**20, 0.1  # as storage.tuning sizes pieces
HEDGE_FACTOR, HEDGE_MIN_S = 3.0, 0.05  # a piece is hedged past this many times its time
_ORIGIN_EXTRA = ("stream_mbps", "streams", "heads")
IO_PARTS = ("origin", "exchange", "local")


@dataclass(frozen=True)
class Origin:
    """Where the store lies, as its requests see it.

    Attributes:
        latency_s: median time to first byte of one request (seconds).
        sigma: lognormal shape of that time.
        stream_bps: bytes/s one request gets (0: no limit but the total).
        total_bps: bytes/s of the whole origin, shared by every node (0: no limit).
        streams: requests in flight a node keeps.
        tail_prob: the share of requests that stall.
        stall_s: how long a stall lasts.
        heads: the first batch reads its samples directly (a POSIX origin), not whole pieces.
    """

    latency_s: float = 0.001
    sigma: float = 0.0
    stream_bps: float = 0.0
    total_bps: float = 0.0
    streams: int = 16
    tail_prob: float = 0.0
    stall_s: float = 0.0
    heads: bool = True

    @classmethod
    def parse(cls, spec: str, base: Origin | None = None) -> Origin:
        """A slowfs latency spec (`tierfeed.latency.LatencyModel.parse`: a preset such as
        ``nfs``, or ``median_ms=..,bandwidth_mbps=..``, the bandwidth being the origin's
        total), with ``stream_mbps=``, ``streams=`` and ``heads=0|1`` beside it. Fields a
        ``NAME=VALUE`` spec does not name are ``base``'s (a calibration's), else the defaults."""
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        named = {p.partition("=")[0].strip() for p in parts}
        extra = {}
        for part in parts:
            name, _, value = part.partition("=")
            if name.strip() in _ORIGIN_EXTRA:
                try:
                    extra[name.strip()] = float(value)
                except ValueError:
                    raise ConfigError(f"origin spec {part!r}: {value!r} is not a number") from None
        m = LatencyModel.parse(",".join(p for p in parts if p.partition("=")[0] not in extra))
        if extra.get("streams", 1) < 1:
            raise ConfigError(f"origin spec {spec!r}: streams must be >= 1")
        given: dict[str, tuple[str, Any]] = {
            "median_ms": ("latency_s", m.median_ms / 1e3),
            "sigma": ("sigma", m.sigma),
            "bandwidth_mbps": ("total_bps", m.bandwidth_mbps * 1e6),
            "tail_prob": ("tail_prob", m.tail_prob),
            "stall_ms": ("stall_s", m.stall_ms / 1e3),
            "stream_mbps": ("stream_bps", extra.get("stream_mbps", 0.0) * 1e6),
            "streams": ("streams", int(extra.get("streams", cls.streams))),
            "heads": ("heads", bool(extra.get("heads", 1))),
        }
        preset = len(parts) == 1 and "=" not in parts[0]
        start = cls() if preset or base is None else base
        return replace(start, **{f: v for k, (f, v) in given.items() if preset or k in named})

    def request_s(self, nbytes: float) -> float:
        """Mean seconds of one request of ``nbytes``."""
        mean_latency = self.latency_s * math.exp(self.sigma**2 / 2)
        return mean_latency + (nbytes / self.stream_bps if self.stream_bps else 0.0)

    def piece(self) -> int:
        """The piece size a fetch settles on: a tenth of a second of a request's bytes."""
        if not self.stream_bps:
            return MAX_PIECE
        return int(min(MAX_PIECE, max(MIN_PIECE, self.stream_bps * PIECE_S)))


@dataclass(frozen=True)
class Node:
    """One machine of the job.

    Attributes:
        cores: CPU cores the loader's processes share.
        ram_bytes: memory; half of it is taken as page cache for local reads.
        disk_bps: bytes/s the local disk reads.
        nic_bps: bytes/s the network link carries each way (0: no limit).
        ranks: ranks (processes) on the node.
        cache_bytes: the cache tier's room on the node (None: room for what it reads).
    """

    cores: int = 2
    ram_bytes: int = 24 * 2**30
    disk_bps: float = 1e9
    nic_bps: float = 0.0
    ranks: int = 1
    cache_bytes: int | None = None


@dataclass(frozen=True)
class Costs:
    """The loader's own costs on a node, measured (``tierfeed simulate --calibrate``).

    Attributes:
        start_s: from a Loader's start to its first batch, less that batch's own reads.
        start_cores: the cores one rank's start keeps busy: ranks that start together on a
            node take longer when together they want more than it has.
        start_ranks: the ranks per node ``start_s`` was measured with.
        warm_start_s: from a later epoch's start to its first batch of local data.
        cpu_per_sample_s: CPU seconds a warm sample costs, all of a rank's processes.
        cpu_per_byte_s: CPU seconds each byte copied from the origin adds.
        rank_rate: samples/s one rank reaches when nothing else is short (0: no such limit).
    """

    start_s: float = 0.5
    start_cores: float = 1.0
    start_ranks: int = 1
    warm_start_s: float = 0.05
    cpu_per_sample_s: float = 1e-4
    cpu_per_byte_s: float = 0.0
    rank_rate: float = 0.0


@dataclass(frozen=True)
class Job:
    """What is read, by whom, and how fast the model consumes it.

    Attributes:
        samples: samples in the store.
        store_bytes: bytes of its chunks.
        chunks: number of chunks.
        nodes: nodes in the job.
        plan: ``global``, ``local`` or ``partial``.
        q: the share a partial plan exchanges each epoch.
        epochs: epochs to time.
        batch_size: samples per batch.
        step_s: seconds the model takes per batch (0: as fast as the loader serves).
    """

    samples: int
    store_bytes: int
    chunks: int
    nodes: int = 1
    plan: str = "global"
    q: float = 0.0
    epochs: int = 2
    batch_size: int = 64
    step_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.samples, self.store_bytes, self.chunks, self.nodes, self.batch_size) < 1:
            raise ConfigError(f"a job needs samples, bytes, chunks, nodes and a batch: {self}")
        if self.plan not in ("global", "local", "partial"):
            raise ConfigError(f"simulate times global, local and partial plans, not {self.plan}")


@dataclass
class EpochTime:
    """One epoch of one node, in seconds.

    Attributes:
        epoch: its number.
        seconds: the epoch's time, start included.
        first_batch_s: when its first batch comes.
        parts: seconds of each part on its own (origin, exchange, local, cpu, model).
        bound: the longest part.
        io_bound: an I/O part (origin, exchange, local) is the longest: the model waits.
        origin_bytes: bytes the node reads from the origin.
    """

    epoch: int
    seconds: float
    first_batch_s: float
    parts: dict[str, float] = field(default_factory=dict)
    bound: str = ""
    io_bound: bool = False
    origin_bytes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _node_bytes(job: Job, node: Node) -> tuple[float, float, float]:
    """(sample bytes the node reads an epoch, chunk bytes they lie in, of those what its cache
    holds)."""
    share = job.store_bytes / job.nodes
    touched = share
    if job.plan == "global":  # a chunk is read if any of its samples is the node's
        per_chunk = job.samples / job.chunks
        touched = job.store_bytes * (1 - (1 - 1 / job.nodes) ** per_chunk)
    room = touched if node.cache_bytes is None else min(float(node.cache_bytes), touched)
    return share, touched, room


def _rate_cap(origin: Origin, node: Node, job: Job) -> float:
    """Bytes/s one node may take from the origin: its share of the total, and its link."""
    limits = [x for x in (origin.total_bps / job.nodes, node.nic_bps) if x > 0]
    return min(limits, default=math.inf)


def _origin_s(origin: Origin, node: Node, job: Job, copies: float, misses: float) -> float:
    """Seconds to copy ``copies`` bytes in pieces and read ``misses`` bytes sample by sample."""
    cap, piece, mean = _rate_cap(origin, node, job), origin.piece(), job.store_bytes / job.samples
    piece_rate = min(cap, origin.streams * piece / origin.request_s(piece))
    sample_rate = min(cap, origin.streams * mean / origin.request_s(mean))
    requests = copies / piece + misses / mean
    hedge = max(HEDGE_MIN_S, HEDGE_FACTOR * origin.request_s(piece))
    tail = requests * origin.tail_prob * min(origin.stall_s, hedge) / origin.streams
    return copies / piece_rate + misses / sample_rate + tail


def _start_s(node: Node, costs: Costs) -> float:
    """A cold epoch's start: longer when the node's ranks together want more cores than it has."""

    def crowd(ranks: int) -> float:
        return max(1.0, ranks * costs.start_cores / node.cores)

    return costs.start_s * crowd(node.ranks) / crowd(costs.start_ranks)


def _start_cpu_s(node: Node, costs: Costs) -> float:
    """The node's CPU-seconds in a cold epoch's start (every rank's workers starting, their
    first reads): not overlapped with the copies where the CPU is what bounds the epoch."""
    return node.ranks * costs.start_cores * _start_s(node, costs)


def _index_s(origin: Origin) -> float:
    """Reading a store's index: two requests."""
    return 2 * origin.request_s(4096)


def first_fetch_s(origin: Origin, node: Node, job: Job) -> float:
    """What a cold epoch's first batch reads after the start: the index, then its samples
    (``heads``), or from an object store the share's pieces (see below)."""
    index = _index_s(origin)
    if origin.heads:
        mean = job.store_bytes / job.samples
        return index + math.ceil(job.batch_size / origin.streams) * origin.request_s(mean)
    # From an object store the copies of every chunk the shuffle touches go first, in the
    # order of need, and a global shuffle's first batches need a piece of nearly every one:
    # the first batch comes once nearly the whole share has landed.
    return index + _origin_s(origin, node, job, _node_bytes(job, node)[2], 0.0)


def _first_batch_s(origin: Origin, node: Node, job: Job, costs: Costs) -> float:
    """The first batch of a cold epoch: the start, then `first_fetch_s`."""
    return _start_s(node, costs) + first_fetch_s(origin, node, job)


def _parts(
    origin: Origin, node: Node, costs: Costs, job: Job, epoch: int
) -> tuple[dict[str, float], float]:
    """Seconds of each part of one node's epoch, each on its own; the origin's bytes."""
    share, touched, room = _node_bytes(job, node)
    samples = job.samples / job.nodes
    misses = share * (1 - room / max(touched, 1.0))
    copies = room if epoch == 0 else 0.0
    if origin.heads and epoch > 0:  # a file system client's page cache keeps what it read:
        spare = max(0.0, node.ram_bytes / 2 - room)  # of the chunks outside the tier, this share
        misses *= 1 - min(1.0, spare / max(touched - room, 1.0))
    exchange = job.q * share if job.plan == "partial" and epoch > 0 else 0.0
    beyond_ram = max(0.0, room - node.ram_bytes / 2) / max(room, 1.0)
    cpu = samples * costs.cpu_per_sample_s / node.cores
    if epoch == 0:
        cpu += _start_cpu_s(node, costs) / node.cores
    if costs.rank_rate:
        cpu = max(cpu, samples / (node.ranks * costs.rank_rate))
    parts = {
        "origin": _origin_s(origin, node, job, copies, misses),
        "exchange": exchange / node.nic_bps if node.nic_bps else 0.0,
        "local": (share - misses) * beyond_ram / node.disk_bps,
        "cpu": cpu + (copies + misses) * costs.cpu_per_byte_s / node.cores,
        "model": math.ceil(samples / node.ranks / job.batch_size) * job.step_s,
    }
    return parts, copies + misses


def _epoch(origin: Origin, node: Node, costs: Costs, job: Job, epoch: int) -> EpochTime:
    parts, origin_bytes = _parts(origin, node, costs, job, epoch)
    bound = max(parts, key=lambda k: parts[k])
    if epoch == 0:  # the copies begin once the index is read, while the workers start
        first = _first_batch_s(origin, node, job, costs)
        seconds = max(first, _index_s(origin) + parts[bound])
    else:
        first = costs.warm_start_s
        seconds = first + parts[bound]
    io_bound = bound in IO_PARTS and parts[bound] > 0
    return EpochTime(epoch, seconds, min(first, seconds), parts, bound, io_bound, origin_bytes)


def epoch_times(origin: Origin, node: Node, costs: Costs, job: Job) -> list[EpochTime]:
    """Each epoch of ``job`` on one of its nodes (all nodes alike)."""
    return [_epoch(origin, node, costs, job, e) for e in range(job.epochs)]


def _warm(origin: Origin, node: Node, costs: Costs, job: Job) -> EpochTime:
    """A warm epoch (the first epoch when only one is run)."""
    return _epoch(origin, node, costs, job, min(1, job.epochs - 1))


def _waits(origin: Origin, node: Node, costs: Costs, job: Job) -> bool:
    """Whether the model waits on I/O in a warm epoch."""
    return _warm(origin, node, costs, job).io_bound


def least_cache(origin: Origin, node: Node, costs: Costs, job: Job) -> float | None:
    """The smallest cache per node (bytes) at which warm epochs do not wait on I/O: 0 when
    none is needed, None when no cache is enough (the disk, the link or the exchange is)."""
    _, touched, _ = _node_bytes(job, replace(node, cache_bytes=None))
    if _waits(origin, replace(node, cache_bytes=int(touched)), costs, job):
        return None
    lo, hi = 0.0, touched
    if not _waits(origin, replace(node, cache_bytes=0), costs, job):
        return 0.0
    while hi - lo > max(touched / 1000, 1 << 20):
        mid = (lo + hi) / 2
        if _waits(origin, replace(node, cache_bytes=int(mid)), costs, job):
            lo = mid
        else:
            hi = mid
    return hi


def fed_nodes(
    origin: Origin, node: Node, costs: Costs, job: Job, counts: list[int]
) -> dict[int, EpochTime]:
    """The warm epoch at each node count in ``counts`` (ranks per node and cache per node as
    ``node`` says): where its `EpochTime.io_bound` is False, the model does not wait."""
    return {n: _warm(origin, node, costs, replace(job, nodes=n)) for n in counts}
