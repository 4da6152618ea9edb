"""CLI subcommand `tierfeed report`."""

from __future__ import annotations

import argparse
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.telemetry.report import draw_report
from tierfeed.telemetry.run import read_records

__all__ = ["register"]


def _records(path: str) -> list[dict[str, Any]]:
    """The records of a run file; an OSError (missing, unreadable) is one line from the CLI."""
    try:
        return read_records(path)
    except UnicodeDecodeError:
        raise ConfigError(
            f"{path}: not a run file (not text); give a JSON-lines run file written by the "
            "tierfeed loader"
        ) from None


def _run(args: argparse.Namespace) -> int:
    drawn = 0
    for path in args.runs:
        for rec in _records(path):
            if rec.get("type") != "epoch":
                continue
            drawn += 1
            try:
                w = rec["batch_wait"]
                line = (
                    f"{rec.get('system', path)} epoch {rec['epoch']}: "
                    f"{rec['samples_per_s']:,.0f} samples/s, batch wait p50 "
                    f"{w['p50'] * 1e3:.2f} ms p99.99 {w['p99.99'] * 1e3:.1f} ms max "
                    f"{w['max'] * 1e3:.1f} ms, stall {rec['stall_s']:.2f} s"
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(
                    f"{path}: an epoch record lacks or mangles {exc}; give a run file written "
                    "by the tierfeed loader"
                ) from None
            print(line)
    if not drawn:
        raise ConfigError(
            f"no epoch recorded in {', '.join(args.runs)}: a run writes one as each epoch ends "
            "(this one ended before its first, or is still in it); nothing to draw"
        )
    try:
        import matplotlib  # noqa: F401 - only to give a clear message when it is missing
    except ImportError:
        raise ConfigError(
            "report needs matplotlib to draw; install it with `pip install 'tierfeed[report]'`"
        ) from None
    print(f"wrote {draw_report(args.runs, args.output)}")
    return 0


def register(sub: Any) -> None:
    """Add `tierfeed report`."""
    p = sub.add_parser("report", help="plot a run: throughput, batch-wait CDF, tier hit rates")
    p.add_argument("runs", nargs="+", help="run files (JSON lines) written by the loader")
    p.add_argument("-o", "--output", default="report.png", help="PNG to write")
    p.set_defaults(func=_run)
