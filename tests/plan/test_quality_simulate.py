"""Shuffle-quality metrics and `tierfeed simulate`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tierfeed.cli import main
from tierfeed.plan import DatasetShape, Plan, PlanSpec
from tierfeed.plan.quality import batch_class_entropy, displacement
from tierfeed.plan.simulate import simulate


def sorted_shape(n: int = 20_000, classes: int = 100, per_chunk: int = 100) -> DatasetShape:
    labels = np.arange(n) * classes // n  # class-sorted: each chunk holds one class
    chunk = np.arange(n) // per_chunk
    return DatasetShape(chunk, np.full(n, 1000, dtype=np.int64), labels)


def test_metrics_on_known_orders() -> None:
    shape = sorted_shape()
    labels = shape.labels
    assert labels is not None
    assert batch_class_entropy(np.arange(20_000), labels, 64) < 0.5  # store order: 1-2 classes
    uniform = np.random.default_rng(0).permutation(20_000)
    assert batch_class_entropy(uniform, labels, 64) > 5.0  # ~log2(64) minus collisions
    assert displacement(np.arange(20_000), 20_000) == 0.0
    assert displacement(uniform, 20_000) == pytest.approx(1 / 3, abs=0.01)


def test_quality_ranks_the_policies() -> None:
    shape = sorted_shape()
    labels = shape.labels
    assert labels is not None

    def entropy(spec: str, epoch: int = 1) -> float:
        plan = Plan(shape, PlanSpec.parse(spec, seed=1))
        return float(np.mean([batch_class_entropy(plan.order(epoch, r, 8), labels, 32)
                              for r in range(8)]))  # fmt: skip

    local, partial, glob = entropy("local"), entropy("partial:0.3"), entropy("global")
    assert local < partial < glob  # one exchange of 30% in: between the two
    assert entropy("partial:0.3", 4) > 0.99 * glob  # every slot exchanged by then
    assert entropy("global,chunkwise:4") < glob  # windows of 4 one-class chunks: 4 classes


def test_simulate_partial_moves_q_of_the_partition() -> None:
    shape = DatasetShape.uniform(40_000, 100, sample_bytes=1000)
    rows = simulate(shape, Plan(shape, PlanSpec("partial", q=0.25)), 8, 3)
    assert rows[0].origin_mean == pytest.approx(5_000 * 1000)  # stage-in of the partition
    assert rows[1].origin_mean == 0 and rows[1].exchange_mean == pytest.approx(1_250 * 1000)
    glob = simulate(shape, Plan(shape, PlanSpec("global")), 8, 2)
    assert glob[1].origin_mean == pytest.approx(5_000 * 1000) and glob[1].exchange_mean == 0


def test_simulate_cli(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--samples", "50000", "--ranks", "16", "--policy", "partial:0.1"]
    assert main([*argv, "--chunk-size", "4MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and rows[1]["exchange_mean"] > 0
    assert main([*argv, "--chunk-size", "4MiB"]) == 0
    assert "origin/rank" in capsys.readouterr().out
