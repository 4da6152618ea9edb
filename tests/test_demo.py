"""`make demo`'s verdict and its report of the disk space it leaves behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tierfeed.demo import disk_usage, verdict


def _row(system: str, epoch: int, rate: float, opens: int) -> dict[str, Any]:
    return {"system": system, "epoch": epoch, "samples_per_s": rate, "origin": {"opens": opens}}


def test_verdict_is_one_line_per_epoch_from_the_figures() -> None:
    rows = [
        _row("per-file", 1, 141.0, 3000),
        _row("per-file", 2, 162.0, 3000),
        _row("tierfeed", 1, 705.0, 27),
        _row("tierfeed", 2, 1091.0, 0),
    ]
    assert verdict(rows) == [
        "epoch 1: 5.0× the per-file loader (705 against 141 samples/s), "
        "111× fewer origin opens (27 against 3,000)",
        "epoch 2: 6.7× the per-file loader (1,091 against 162 samples/s), "
        "no origin opens (the per-file loader: 3,000)",
    ]


def test_disk_usage_counts_the_files_under_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"x" * 100_000)
    (tmp_path / "link").symlink_to("/usr")  # not followed
    assert 100_000 <= disk_usage(tmp_path) < 200_000
