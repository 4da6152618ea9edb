"""`tierfeed simulate` (with time too) and a stage-in in one process (`stage(comm=None)`,
`tierfeed stage`) never import torch: only a process group needs it, and `distributed/comm.py`
imports it where one is used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.ranks import make_store
from tierfeed.format.index import Index

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).parents[2]

# Every import of torch is refused and recorded first: one the code catches still fails the test.
SCRIPT = """
import json
import sys


class RefuseTorch:
    tried = []

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            self.tried.append(name)
            raise ImportError(f"{name} is refused in this test")
        return None


sys.meta_path.insert(0, RefuseTorch())
what, store, to = sys.argv[1:]
if what == "stage":
    from tierfeed.distributed import stage

    print(json.dumps(stage(store, to, "partial:0.3", comm=None, progress=False).to_dict()))
else:
    from tierfeed.cli import main

    argv = {
        "simulate": ["simulate", store, "--ranks", "4", "--ranks-per-node", "2"],
        "simulate-time": ["simulate", store, "--ranks", "4", "--ranks-per-node", "2",
                          "--origin", "nfs", "--step-ms", "10"],
        "stage-cli": ["stage", store, "--to", to, "-q", "--json"],
    }[what]
    if main([*argv, "--plan", "partial:0.3"]) != 0:
        raise SystemExit(f"{what} failed")
print("tried:", RefuseTorch.tried, "loaded:", "torch" in sys.modules)
"""


@pytest.mark.parametrize("what", ["simulate", "simulate-time", "stage", "stage-cli"])
def test_simulate_and_a_stage_in_one_process_import_no_torch(tmp_path: Path, what: str) -> None:
    store = make_store(tmp_path, 61)
    to = tmp_path / "local" / "node{node}"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}  # one process
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, what, str(store), str(to)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    *out, verdict = done.stdout.splitlines()
    assert verdict == "tried: [] loaded: False"
    # The run was real: simulate printed its table, a stage-in copied every chunk.
    if what.startswith("simulate"):
        assert "61 samples" in out[0]
        assert ("first batch" in "\n".join(out)) == (what == "simulate-time")
    else:
        with Index(store) as ix:
            chunks = len(np.asarray(ix.chunk_size))
        assert json.loads(out[-1])["chunks_copied"] == chunks > 0
