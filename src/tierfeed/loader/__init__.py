"""Loading on the plan: read-ahead window, deadline guard with deferral and hedging (no torch)."""

from tierfeed.loader.batching import batch_count, worker_slice
from tierfeed.loader.decode import DecodeError, decode_sample
from tierfeed.loader.latency import DeadlineOptions, LatencyTracker
from tierfeed.loader.stream import GuardedStream, PrefetchOptions, StreamCounters, StreamState

__all__ = [
    "DeadlineOptions",
    "DecodeError",
    "GuardedStream",
    "LatencyTracker",
    "PrefetchOptions",
    "StreamCounters",
    "StreamState",
    "batch_count",
    "decode_sample",
    "worker_slice",
]
