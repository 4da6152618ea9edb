"""A distributed job over the namespace has tiers like any other: a RAM tier serves epoch 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import workers
from tests.distributed.ranks import make_store, run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.timeout(150)]
N = 192


@pytest.mark.parametrize("plan", ["global", "partial:0.5"])
def test_a_ram_tier_serves_the_namespace_in_epoch_two(tmp_path: Path, plan: str) -> None:
    store = make_store(tmp_path, N)
    to = str(tmp_path / "local" / "node{node}")
    codes, results = run_ranks(workers.train_with_ram, 2, tmp_path, str(store), to, plan, 2, 1)
    assert codes == [0, 0], codes
    for epoch in range(2):
        shares = [set(r["seen"][epoch]) for r in results]  # every sample, tiers or not
        assert sum(len(s) for s in shares) == N and set().union(*shares) == set(range(N))
        for r in results:
            assert sorted(r["seen"][epoch]) == sorted(r["planned"][epoch])
    for r in results:
        assert r["local_chunks"] > 0
        ram = r["tiers"][1]["ram"]
        assert ram["hits"] > 0, r["tiers"]  # chunks held whole here were copied in epoch 1
        assert ram["corrupt_dropped"] == 0
        # A chunk held only in part is never copied: what the tier holds is this node's.
        assert r["tiers"][1]["origin"]["copies"] <= r["local_chunks"]
        # ... and not even tried: the driver says which chunks it holds whole.
        assert r["tiers"][1]["origin"]["copy_failures"] == 0, r["tiers"]
