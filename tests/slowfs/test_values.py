"""Plain values of slowfs: counters JSON and deltas, options, latency specs, the mount table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierfeed.errors import ConfigError
from tierfeed.fuse.process import _unescape, is_mounted, is_stale_mount
from tierfeed.latency import LatencyModel
from tierfeed.slowfs import SlowFS, SlowFSOptions, SlowFSStats, latency_spec


def test_stats_json_round_trip_and_delta() -> None:
    a = SlowFSStats(opens=3, bytes_read=10, delay_s=0.5, max_delay_s=0.2)
    b = SlowFSStats(opens=5, bytes_read=30, delay_s=0.75, max_delay_s=0.3)
    assert SlowFSStats.from_json(f'{{"counters": {a.to_dict()}}}'.replace("'", '"')) == a
    assert b - a == SlowFSStats(opens=2, bytes_read=20, delay_s=0.25, max_delay_s=0.3)
    assert (b - a).ops == 2
    with pytest.raises(ConfigError):
        SlowFSStats.from_json("[1]")
    with pytest.raises(ConfigError):
        SlowFSStats.from_json('{"opens": "many"}')


@pytest.mark.parametrize("spec", ["none", "nfs", "heavy-tail", "median_ms=0.1,sigma=2,seed=9"])
def test_latency_spec_round_trips(spec: str) -> None:
    model = LatencyModel.parse(spec)
    assert LatencyModel.parse(latency_spec(model)) == model


def test_options_validate_and_reach_the_command_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        SlowFSOptions(cache="all")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        SlowFSOptions(attr_timeout=-1)
    options = SlowFSOptions(cache="direct", threads=4, shared_bandwidth=False, allow_other=True)
    argv = SlowFS(tmp_path, tmp_path / "m", options=options, stats_file=tmp_path / "s").argv()
    joined = " ".join(argv)
    for part in ("--cache direct", "--threads 4", "--per-request-bandwidth", "--allow-other"):
        assert part in joined
    assert argv[-2:] == ["--stats-file", str(tmp_path / "s")]


def test_mount_table_helpers() -> None:
    assert _unescape(r"/tmp/a\040b\134c") == "/tmp/a b\\c"
    assert is_mounted("/proc")
    assert not is_mounted("/proc/self")
    assert not is_stale_mount("/proc")
