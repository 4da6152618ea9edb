"""Medians over several runs of bench/compare.py: the table docs/BENCHMARKS.md quotes.

Usage:
    python bench/compare_summary.py bench-out/compare-run1/results.json ... > table.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def per_run(result: dict[str, Any], config: str, system: str) -> dict[str, Any] | None:
    rows = [r for r in result["rows"] if r["config"] == config and r["system"] == system]
    if not rows:
        return None
    if "failed" in rows[0]:
        return {"failed": rows[0]["failed"]}
    warm = rows[1:] or rows
    return {
        "cold": rows[0]["samples_per_s"],
        # Older results.json files (before issue 35) do not record it.
        "first": rows[0].get("first_batch_ms", float("nan")),
        "warm": statistics.median(r["samples_per_s"] for r in warm),
        "p50": rows[0]["wait_p50_ms"],
        "p9999": rows[0]["wait_p9999_ms"],
        "warm_p50": statistics.median(r["wait_p50_ms"] for r in warm),
        "warm_p9999": max(r["wait_p9999_ms"] for r in warm),
        "opens": rows[0]["origin_opens"],
        "stats": rows[0]["origin_stats"],
        "reads": rows[0]["origin_reads"],
        "mb": rows[0]["origin_bytes_read"] / 1e6,
        "warm_mb": statistics.median(r["origin_bytes_read"] for r in warm) / 1e6,
        "rss": max(r["peak_rss_mb"] for r in rows),
        "rss_worker": max(r["peak_rss_children_mb"] for r in rows),
        "cache_mb": rows[-1]["cache_bytes"] / 1e6,
    }


def cell(values: list[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "–"
    med = fmt.format(statistics.median(values))
    return med + " (" + ", ".join(fmt.format(v) for v in values) + ")" if len(values) > 1 else med


def main(paths: list[str]) -> None:
    results = [json.loads(Path(p).read_text()) for p in paths]
    configs = list(dict.fromkeys(r["config"] for res in results for r in res["rows"]))
    systems = list(dict.fromkeys(r["system"] for res in results for r in res["rows"]))
    print("| config | system | epoch 1 samples/s | epoch 1 first batch ms | warm samples/s "
          "| epoch 1 wait p50 / p99.99 ms "
          "| warm wait p50 / p99.99 ms | origin opens / stats / reads / MB, epoch 1 "
          "| origin MB per warm epoch | peak RSS MB main / worker | cache MB |")  # fmt: skip
    print("|" + "---|" * 11)
    for config in configs:
        for system in systems:
            runs = [x for res in results if (x := per_run(res, config, system)) is not None]
            if not runs:
                continue
            ok = [r for r in runs if "failed" not in r]
            if not ok:
                print(f"| {config} | {system} | failed in {len(runs)} of {len(runs)} runs ||||||||")
                continue
            m = {k: statistics.median(r[k] for r in ok) for k in ok[0]}
            print(
                f"| {config} | {system} | {cell([r['cold'] for r in ok])} | "
                f"{cell([r['first'] for r in ok])} | {cell([r['warm'] for r in ok])} | "
                f"{m['p50']:.1f} / {m['p9999']:,.0f} | "
                f"{m['warm_p50']:.1f} / {m['warm_p9999']:,.0f} | {m['opens']:,.0f} / "
                f"{m['stats']:,.0f} / {m['reads']:,.0f} / {m['mb']:,.0f} | {m['warm_mb']:,.1f} | "
                f"{m['rss']:,.0f} / {m['rss_worker']:,.0f} | {m['cache_mb']:,.0f} |"
            )
    limits: dict[str, list[float]] = {}
    for res in results:
        for lim in res["limits"]:
            limits.setdefault(f"{lim['config']}: {lim['system']}", []).append(lim["samples_per_s"])
    for name, values in limits.items():
        print(f"| {name.split(': ')[0]} | {name.split(': ')[1]} | {cell(values)} ||||||||")
    conv = [res["convert"] for res in results]
    line = ", ".join(
        f"{s} {statistics.median(c[s]['convert_s'] for c in conv):.2f} s" for s in conv[0]
    )
    print(f"\nConversion (median): {line}.")


if __name__ == "__main__":
    main(sys.argv[1:])
