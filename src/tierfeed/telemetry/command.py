"""CLI subcommand `tierfeed report`."""

from __future__ import annotations

import argparse
from typing import Any

from tierfeed.telemetry.report import draw_report
from tierfeed.telemetry.run import read_records

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    for path in args.runs:
        for rec in read_records(path):
            if rec.get("type") != "epoch":
                continue
            w = rec["batch_wait"]
            print(
                f"{rec.get('system', path)} epoch {rec['epoch']}: {rec['samples_per_s']:,.0f} "
                f"samples/s, batch wait p50 {w['p50'] * 1e3:.2f} ms p99.99 "
                f"{w['p99.99'] * 1e3:.1f} ms max {w['max'] * 1e3:.1f} ms, "
                f"stall {rec['stall_s']:.2f} s"
            )
    print(f"wrote {draw_report(args.runs, args.output)}")
    return 0


def register(sub: Any) -> None:
    """Add `tierfeed report`."""
    p = sub.add_parser("report", help="plot a run: throughput, batch-wait CDF, tier hit rates")
    p.add_argument("runs", nargs="+", help="run files (JSON lines) written by the loader")
    p.add_argument("-o", "--output", default="report.png", help="PNG to write")
    p.set_defaults(func=_run)
