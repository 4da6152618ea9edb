"""The loader under torch.distributed: 2 gloo ranks on 127.0.0.1, spawned, exactly once overall."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.distributed.ranks import free_port
from tests.format.conftest import write_tree
from tierfeed.format.pack import PackOptions, pack

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]
N = 96


def _rank(rank: int, world: int, port: int, store: str, out: str, plan: str) -> None:
    import torch
    import torch.distributed as dist

    from tierfeed.storage.store import Sample
    from tierfeed.torch import Dataset, Loader

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:

        def decode(s: Sample) -> torch.Tensor:
            return torch.tensor(int(s.fields["txt"]))

        ds = Dataset(store, plan, batch_size=8, decode=decode)  # rank/world from dist
        loader = Loader(ds, num_workers=1)
        seen = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            got = [int(v) for batch in loader for v in batch]
            counts = torch.tensor([len(got)])
            dist.all_reduce(counts)  # every rank read as many samples (DDP needs equal steps)
            seen.append(got)
        Path(out).write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("plan", ["global", "partial:0.5"])
def test_two_ranks_read_every_sample_once(tmp_path: Path, plan: str) -> None:
    write_tree(tmp_path / "src", {f"c{i % 4}/s{i:03d}.txt".encode(): b"%d" % i for i in range(N)})
    pack(tmp_path / "src", tmp_path / "store", PackOptions(chunk_size=4096, progress=False))
    outs = [tmp_path / f"rank{r}.txt" for r in range(2)]
    args = (2, free_port(), str(tmp_path / "store"), "", plan)
    ctx = mp.get_context("spawn")
    procs = []
    for r in range(2):
        p = ctx.Process(target=_rank, args=(r, args[0], args[1], args[2], str(outs[r]), plan))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(timeout=100)
        if p.is_alive():
            p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    seen = [eval(o.read_text()) for o in outs]
    for epoch in range(2):
        a, b = seen[0][epoch], seen[1][epoch]
        assert len(a) == len(b)  # equal steps on both ranks
        assert sorted(a + b) == list(range(N))  # disjoint shares covering the epoch
