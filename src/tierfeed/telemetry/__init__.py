"""Counters, latency histograms, run records and report plots."""

from tierfeed.telemetry.histogram import LatencyHistogram
from tierfeed.telemetry.run import EpochMeter, RunRecorder, batch_len, read_records

__all__ = ["EpochMeter", "LatencyHistogram", "RunRecorder", "batch_len", "read_records"]
