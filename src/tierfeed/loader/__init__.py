"""The composer (no torch): opening a store with its tiers, its plan, and loading on the plan
(read-ahead window, deadline guard with deferral and hedging)."""

from tierfeed.loader.batching import batch_count, worker_slice
from tierfeed.loader.compose import StoreOpener, TierConfig, open_store, plan_for
from tierfeed.loader.decode import DecodeError, decode_sample
from tierfeed.loader.latency import DeadlineOptions, LatencyTracker
from tierfeed.loader.stream import GuardedStream, PrefetchOptions, StreamCounters, StreamState

__all__ = [
    "DeadlineOptions",
    "DecodeError",
    "GuardedStream",
    "LatencyTracker",
    "PrefetchOptions",
    "StoreOpener",
    "StreamCounters",
    "StreamState",
    "TierConfig",
    "batch_count",
    "decode_sample",
    "open_store",
    "plan_for",
    "worker_slice",
]
