"""`tierfeed report`: draw a run's throughput, batch-wait CDF and tier hit rates (matplotlib)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tierfeed.telemetry.histogram import LatencyHistogram
from tierfeed.telemetry.run import read_records

__all__ = ["draw_report"]


def _label(rec: dict[str, Any]) -> str:
    name = rec.get("system")
    return f"{name} e{rec['epoch']}" if name else f"epoch {rec['epoch']}"


def draw_report(runs: list[str | os.PathLike[str]], out: str | os.PathLike[str]) -> Path:
    """Draw every epoch record of ``runs`` into one PNG with three panels; returns its path.

    A record may carry ``system`` (to compare loaders) and ``tiers``: {tier: {hits, misses}}.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r for path in runs for r in read_records(path) if r.get("type") == "epoch"]
    fig, (ax_tp, ax_cdf, ax_hit) = plt.subplots(1, 3, figsize=(16, 4.8))
    labels = [_label(r) for r in epochs]
    ax_tp.bar(range(len(epochs)), [r["samples_per_s"] for r in epochs], color="tab:blue")
    ax_tp.set_xticks(range(len(epochs)), labels, rotation=45, ha="right", fontsize=8)
    ax_tp.set_ylabel("samples/s")
    ax_tp.set_title("Throughput per epoch")
    for rec, label in zip(epochs, labels, strict=True):
        hist = LatencyHistogram.from_dict(rec["batch_wait_hist"])
        x, y = hist.cdf()
        if x:
            ax_cdf.step([max(v, 1e-6) for v in x], y, where="post", label=label)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("batch wait (s, log)")
    ax_cdf.set_ylabel("fraction of batches")
    ax_cdf.set_title("Batch-wait CDF")
    ax_cdf.grid(True, which="both", alpha=0.3)
    if epochs:
        ax_cdf.legend(fontsize=7)
    tiers = sorted({t for r in epochs for t in r.get("tiers", {})})
    bottom = [0.0] * len(epochs)
    for tier in tiers:
        rates = []
        for r in epochs:
            t = r.get("tiers", {}).get(tier, {})
            reads = sum(r.get("tiers", {}).get(n, {}).get("hits", 0) for n in tiers)
            rates.append(t.get("hits", 0) / reads if reads else 0.0)
        ax_hit.bar(range(len(epochs)), rates, bottom=bottom, label=tier)
        bottom = [b + v for b, v in zip(bottom, rates, strict=True)]
    ax_hit.set_xticks(range(len(epochs)), labels, rotation=45, ha="right", fontsize=8)
    ax_hit.set_ylim(0, 1)
    ax_hit.set_ylabel("share of reads served")
    ax_hit.set_title("Reads served by tier")
    if tiers:
        ax_hit.legend(fontsize=8)
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
