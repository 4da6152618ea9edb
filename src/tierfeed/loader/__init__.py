"""Loading on the plan: read-ahead window, deadline guard with deferral and hedging (no torch)."""

from tierfeed.loader.latency import DeadlineOptions, LatencyTracker
from tierfeed.loader.stream import GuardedStream, PrefetchOptions, StreamCounters, StreamState

__all__ = [
    "DeadlineOptions",
    "GuardedStream",
    "LatencyTracker",
    "PrefetchOptions",
    "StreamCounters",
    "StreamState",
]
