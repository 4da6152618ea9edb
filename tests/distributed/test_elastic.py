"""Elastic resume across a real process group: 2 gloo ranks checkpoint mid-epoch with
`Loader.gather_state_dict`, and a job of 4 ranks reads the rest of the epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import workers
from tests.distributed.ranks import make_store, run_ranks
from tierfeed.torch import Dataset, Loader
from tierfeed.world import World

pytestmark = [pytest.mark.dist, pytest.mark.timeout(150)]
N = 96


def test_two_ranks_gather_and_four_resume(tmp_path: Path) -> None:
    store = make_store(tmp_path, N)
    codes, results = run_ranks(workers.read_then_gather, 2, tmp_path, str(store), 5)
    assert codes == [0, 0], codes
    states = results[0]["states"]
    assert states == results[1]["states"]  # every rank holds every rank's state
    assert [s["rank"] for s in states] == [0, 1] and {s["world_size"] for s in states} == {2}
    delivered = results[0]["seen"] + results[1]["seen"]
    lengths = []
    for rank in range(4):  # the resized job (ranks simulated in this process)
        ds = Dataset(store, "global", batch_size=4, decode=workers.decode, world=World(rank, 4))
        loader = Loader(ds, num_workers=0)
        loader.load_state_dict(states)
        rest = [int(v) for batch in loader for v in batch]
        lengths.append(len(rest))
        delivered += rest
        loader.close()
    assert len(set(lengths)) == 1  # equal shares: DDP stays in lockstep
    assert set(delivered) == set(range(N)) and len(delivered) - N <= (2 - 1) + (4 - 1)
