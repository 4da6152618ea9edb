"""Elastic in practice: one real torchrun agent per "node" (`--nnodes=2:3`, c10d rendezvous,
gloo on 127.0.0.1), a node lost (3 -> 2) or one added (2 -> 3) mid-epoch; torchrun restarts
the workers at the new world size, they resume from the gathered checkpoint, and the epoch
delivers every sample exactly once (the checkpoint's ids plus those of the finishing run)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.ranks import free_port, make_store

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(240)]
N = 240  # 4-sample batches, checkpoints every 3: what is left splits evenly in 2 or 3, no padding
SCRIPT = Path(__file__).with_name("elastic_train.py")
WAIT_S = 90.0


class Job:
    """torchrun agents on this machine, one per node, each with its own log; `kill` takes a
    node away as a lost machine would (its agent and its worker at once)."""

    def __init__(self, tmp: Path, store: Path) -> None:
        self.tmp, self.store, self.run = tmp, store, tmp / "run"
        self.run.mkdir()
        self.port, self.run_id = free_port(), f"elastic-{os.getpid()}-{time.monotonic_ns()}"
        self.agents: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str, host: bool) -> None:
        conf = f"is_host={int(host)},join_timeout=60,last_call_timeout=3,read_timeout=30"
        conf += ",keep_alive_interval=1,keep_alive_max_attempt=3"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2:3",
            "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-id={self.run_id}",
            f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-conf={conf}",
            "--max-restarts=2", "--monitor-interval=0.2",
            str(SCRIPT), str(self.store), str(self.run), "--every", "3", "--pace", "0.02",
        ]  # fmt: skip
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", TEST_NODE=node)
        # The agents' shared store keeps one round's keys into the next, prefixed by each
        # agent's own restart count, which a failure on one node sets apart from the others':
        # restarted workers then read a dead rank's address (pytorch/pytorch#135712). With it
        # off, each round's rank 0 worker hosts a fresh store.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        with (self.tmp / f"{node}.log").open("wb") as out:
            self.agents[node] = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill(self, node: str) -> None:
        # torchrun starts each worker in a session of its own: the node's worker dies too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.agents[node].pid, signal.SIGKILL)
        self.kill_worker(node)
        self.agents[node].wait(10)

    def kill_worker(self, node: str) -> None:
        """SIGKILL the node's last worker, if it is still this job's (its pid not reused)."""
        pid = json.loads((self.run / "pids" / f"{node}.json").read_text())["pid"]
        with contextlib.suppress(OSError):
            if str(self.run).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.killpg(pid, signal.SIGKILL)

    def wait(self, nodes: list[str]) -> dict[str, int]:
        deadline = time.monotonic() + WAIT_S
        codes = {}
        for node in nodes:
            try:
                codes[node] = self.agents[node].wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[node] = -999
        return codes

    def output(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.tmp.glob("*.log"))

    def close(self) -> None:
        for node, agent in self.agents.items():
            if agent.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(10)
            if (self.run / "pids" / f"{node}.json").exists():
                self.kill_worker(node)  # one whose agent was killed under it


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    j = Job(tmp_path, make_store(tmp_path, N))
    yield j
    j.close()


def wait_for(what: str, ready: Callable[[], Any], job: Job) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"no {what} within {WAIT_S:.0f} s\n{job.output()}")


def checkpoint(run: Path, world: int) -> dict[str, Any] | None:
    """A checkpoint taken at ``world`` ranks, once one is on disk."""
    for path in sorted((run / "ckpts").glob("*.json")) if (run / "ckpts").exists() else []:
        record = json.loads(path.read_text())
        if record["world"] == world:
            return dict(record)
    return None


def records(run: Path) -> list[dict[str, Any]]:
    lines = [line for p in sorted((run / "logs").glob("*.jsonl")) for line in p.open()]
    return [json.loads(line) for line in lines if line.endswith("\n")]  # not one being written


def started_at(run: Path, world: int) -> bool:
    logs = records(run) if (run / "logs").exists() else []
    return any(r["event"] == "start" and r["world"] == world for r in logs)


def check_exactly_once(run: Path, old_world: int, new_world: int) -> list[dict[str, Any]]:
    """The run that finished the epoch: at ``new_world`` ranks, resumed from a checkpoint of
    ``old_world``; its ids and that checkpoint's are the epoch, each sample once."""
    logs = records(run)
    done = {r["gen"] for r in logs if r["event"] == "done"}
    assert len(done) == 1, done  # one run finished the epoch
    final = done.pop()
    starts = [r for r in logs if r["event"] == "start" and r["gen"] == final]
    assert sorted(r["rank"] for r in starts) == list(range(new_world)), starts
    loaded = {(r["loaded"], r["loaded_gen"]) for r in starts}
    assert len(loaded) == 1 and None not in next(iter(loaded)), loaded  # one checkpoint, for all
    seq, gen = loaded.pop()
    ckpt = json.loads((run / "ckpts" / f"{seq}-{gen}.json").read_text())
    assert ckpt["world"] == old_world and len(ckpt["states"]) == old_world
    after = [i for r in logs if r["event"] == "batch" and r["gen"] == final for i in r["ids"]]
    counts = Counter(ckpt["delivered"] + after)
    assert sorted(counts) == list(range(N)), sorted(set(range(N)) - set(counts))  # none missed
    assert {n for n in counts.values()} == {1}, [i for i, n in counts.items() if n > 1]  # once
    return logs


def redelivered(logs: list[dict[str, Any]], gen: str, ckpt: dict[str, Any]) -> set[int]:
    """Ids a lost run delivered after the checkpoint the next run resumed from."""
    ids = {i for r in logs if r["event"] == "batch" and r["gen"] == gen for i in r["ids"]}
    return ids - set(ckpt["delivered"])


def test_a_node_lost_three_to_two_resumes_the_epoch_exactly_once(job: Job) -> None:
    (job.run / "gate").touch()  # the workers hold after each checkpoint while it is there
    for node in ("node0", "node1", "node2"):  # node0 hosts the rendezvous store: it stays
        job.start(node, host=node == "node0")
    ckpt = wait_for("checkpoint at 3 ranks", lambda: checkpoint(job.run, 3), job)
    job.kill("node2")
    (job.run / "gate").unlink()  # the survivors read on until a collective finds rank 2 gone
    codes = job.wait(["node0", "node1"])
    assert codes == {"node0": 0, "node1": 0}, job.output()
    logs = check_exactly_once(job.run, 3, 2)
    final = next(r for r in logs if r["event"] == "done")
    starts = [r for r in logs if r["event"] == "start" and r["gen"] == final["gen"]]
    assert {r["restart"] for r in starts} == {1}  # torchrun's restart after a failure
    assert {r["node"] for r in starts} == {"node0", "node1"}
    assert redelivered(logs, ckpt["gen"], ckpt)  # read again after the loss, counted once


def test_a_node_added_two_to_three_resumes_the_epoch_exactly_once(job: Job) -> None:
    (job.run / "gate").touch()
    for node in ("node0", "node1"):
        job.start(node, host=node == "node0")
    wait_for("checkpoint at 2 ranks", lambda: checkpoint(job.run, 2), job)
    job.start("node2", host=False)  # waiting nodes make the agents restart their workers
    wait_for("run at 3 ranks", lambda: started_at(job.run, 3), job)
    (job.run / "gate").unlink()
    codes = job.wait(["node0", "node1", "node2"])
    assert codes == {"node0": 0, "node1": 0, "node2": 0}, job.output()
    logs = check_exactly_once(job.run, 2, 3)
    final = next(r for r in logs if r["event"] == "done")
    starts = [r for r in logs if r["event"] == "start" and r["gen"] == final["gen"]]
    assert {r["restart"] for r in starts} == {0}  # a membership change is not a failure
