"""Histogram percentiles against numpy, run records, and the report PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierfeed.cli import main
from tierfeed.telemetry import EpochMeter, LatencyHistogram, RunRecorder, read_records


@settings(max_examples=100)
@given(
    st.lists(st.floats(1e-6, 50.0), min_size=1, max_size=400),
    st.sampled_from([0.5, 0.9, 0.99, 0.999]),
)
def test_quantiles_within_one_bucket_of_numpy(values: list[float], q: float) -> None:
    h = LatencyHistogram()
    h.add_many(values)
    exact = float(np.quantile(values, q, method="inverted_cdf"))
    got = h.quantile(q)
    assert exact * 0.999 <= got <= exact * 10 ** (1 / 40) * 1.001  # bucket width ~6%
    assert h.max_s == max(values) and h.total == len(values)


def test_merge_and_round_trip() -> None:
    a, b = LatencyHistogram(), LatencyHistogram()
    a.add_many([0.001] * 99)
    b.add(2.0)
    a.merge(b)
    back = LatencyHistogram.from_dict(a.to_dict())
    assert back.summary() == a.summary()
    assert back.quantile(0.5) == pytest.approx(0.001, rel=0.07)
    assert back.quantile(0.9999) == 2.0 and back.max_s == 2.0


def test_recorder_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run.jsonl"
    with RunRecorder(run, {"system": "tierfeed"}) as rec:
        for epoch in range(2):
            meter = EpochMeter(epoch)
            for i in range(100):
                meter.batch(32, 0.0005 if i % 50 else 0.2)
            meter.extra = {
                "system": "tierfeed",
                "tiers": {"ram": {"hits": 70}, "origin": {"hits": 30}},
            }
            rec.write(meter.record())
    with open(run, "a") as fh:
        fh.write('{"type": "epoch", "torn')  # a killed run's last line
    records = read_records(run)
    assert [r["type"] for r in records] == ["run", "epoch", "epoch"]
    assert records[1]["samples"] == 3200 and records[1]["stall_s"] == pytest.approx(0.4)
    out = tmp_path / "report.png"
    assert main(["report", str(run), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "tierfeed epoch 1" in capsys.readouterr().out


@given(st.lists(st.floats(min_value=0, max_value=10, allow_nan=False), max_size=50))
def test_meter_names_the_slowest_batches(waits: list[float]) -> None:
    meter = EpochMeter(0)
    for w in waits:
        meter.batch(1, w)
    slowest = meter.record()["slowest"]
    expected = sorted(enumerate(waits), key=lambda bw: bw[1], reverse=True)[: EpochMeter.SLOWEST]
    assert [s["wait_s"] for s in slowest] == [w for _, w in expected]
    assert all(waits[s["batch"]] == s["wait_s"] for s in slowest)
