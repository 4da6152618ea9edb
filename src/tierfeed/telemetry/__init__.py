"""Counters, latency histograms, run records and report plots."""

from tierfeed.telemetry.counters import GAUGES, Counters, combine, since
from tierfeed.telemetry.histogram import LatencyHistogram
from tierfeed.telemetry.run import EpochMeter, RunRecorder, batch_len, read_records

__all__ = [
    "GAUGES",
    "Counters",
    "EpochMeter",
    "LatencyHistogram",
    "RunRecorder",
    "batch_len",
    "combine",
    "read_records",
    "since",
]
