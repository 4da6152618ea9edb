"""`tierfeed simulate` with time: the options that describe the origin, the node and the
model, the calibration probe (`tierfeed.torch.calibrate`, run in a process of its own), and the
table of epoch times, first batch, where the time goes, and the cache and node advice
(`tierfeed.plan.timing`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.plan import PlanSpec
from tierfeed.plan.timing import (
    IO_PARTS,
    Costs,
    EpochTime,
    Job,
    Node,
    Origin,
    epoch_times,
    fed_nodes,
    least_cache,
)
from tierfeed.units import human, size_argument

__all__ = [
    "add_time_arguments",
    "check_layout",
    "print_times",
    "run_probe",
    "times",
    "wants_time",
]

CALIBRATE_S = 300  # the probe ends within this or is stopped


def add_time_arguments(p: argparse.ArgumentParser) -> None:
    """The origin, the node, the loader and the model: what times a job."""
    g = p.add_argument_group(
        "time (any of --origin, --calibrate, --calibration prints the epochs in seconds)"
    )
    g.add_argument(
        "--origin",
        help="the origin: a latency model (nfs, heavy-tail, stalls, or median_ms=,sigma=,"
        "tail_prob=,stall_ms=,bandwidth_mbps= for its total) with stream_mbps= (a request's "
        "bandwidth), streams= and heads=0 (an object store: the first batch waits for pieces)",
    )
    g.add_argument(
        "--calibrate", action="store_true", help="probe STORE's origin and this node's loader"
    )
    g.add_argument(
        "--calibration", type=Path, help="a probe's figures saved with --save-calibration"
    )
    g.add_argument("--save-calibration", type=Path, help="write the probe's figures here")
    g.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores per node")
    g.add_argument(
        "--ram", type=size_argument, default=_ram(), help="memory per node (default: this one's)"
    )
    g.add_argument("--disk-mbps", type=float, default=1000.0, help="local disk MB/s (default 1000)")
    g.add_argument("--nic-mbps", type=float, default=0.0, help="network MB/s each way (0: none)")
    g.add_argument(
        "--cache", type=size_argument, help="cache tier per node (default: room for all)"
    )
    g.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (probe)")
    g.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    g.add_argument("--step-ms", type=float, default=0.0, help="the model's time per batch")
    g.add_argument("--decode-ms", type=float, default=0.0, help="a sample's decode, CPU ms")
    g.add_argument("--max-nodes", type=int, default=1024, help="node counts advised up to this")


def _ram() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 16 * 2**30


def wants_time(args: argparse.Namespace) -> bool:
    return bool(args.origin or args.calibrate or args.calibration)


def check_layout(args: argparse.Namespace) -> None:
    """``--ranks-per-node`` lays the ranks out on whole nodes."""
    if args.ranks_per_node < 1 or args.ranks % args.ranks_per_node:
        raise ConfigError(
            f"--ranks-per-node {args.ranks_per_node} does not divide --ranks {args.ranks}"
        )


def _calibrated(args: argparse.Namespace) -> dict[str, Any]:
    """The probe's figures: run now (``--calibrate``) or saved (``--calibration``)."""
    if args.calibration is not None:
        try:
            found: dict[str, Any] = json.loads(args.calibration.read_text())
            Origin(**found["origin"]), Costs(**found["costs"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{args.calibration}: not a saved calibration ({exc})") from None
        return found
    command = [sys.executable, "-m", "tierfeed.torch.calibrate", args.store]
    command += ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
    command += ["--ranks", str(args.ranks_per_node)]
    print(
        f"calibrating on {args.store} with {args.ranks_per_node} rank(s) (seconds) ...",
        file=sys.stderr,
    )
    out: dict[str, Any] = json.loads(run_probe(command, CALIBRATE_S))
    if args.save_calibration is not None:
        try:
            args.save_calibration.write_text(json.dumps(out, indent=1) + "\n")
        except OSError as exc:
            raise ConfigError(
                f"{args.save_calibration}: cannot save the calibration ({exc.strerror or exc})"
            ) from None
    return out


def run_probe(command: list[str], timeout_s: float) -> str:
    """Run the probe ``command`` and return what it printed; it and every process it started
    (its own session) end within ``timeout_s``, or when this one is interrupted.

    Raises:
        ConfigError: it failed (its last line said why), or did not end in time.
    """
    probe = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = probe.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(probe.pid, signal.SIGKILL)
        probe.communicate()
        raise ConfigError(f"the calibration probe did not end in {timeout_s:g} s") from None
    finally:  # interrupted, or ended and left a process behind: they go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(probe.pid, signal.SIGKILL)
    if probe.returncode:
        last = (stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(
            f"the calibration probe failed: {last.removeprefix('tierfeed simulate: error: ')}"
        )
    return stdout


def _models(args: argparse.Namespace) -> tuple[Origin, Node, Costs]:
    """The origin, node and costs the options say; checked before any probe is run."""
    if args.calibrate and args.calibration is None and args.store is None:
        raise ConfigError("--calibrate probes a STORE: give one")
    if min(args.cores, args.batch_size, args.max_nodes) < 1 or args.disk_mbps <= 0:
        raise ConfigError("--cores, --batch-size, --max-nodes and --disk-mbps must be positive")
    check_layout(args)
    found = _calibrated(args) if args.calibrate or args.calibration else None
    origin = Origin(**found["origin"]) if found else Origin()
    if args.origin:  # beside a calibration: what it names wins, a preset wholly
        origin = Origin.parse(args.origin, origin if found else None)
    costs = Costs(**found["costs"]) if found else Costs()
    costs = replace(costs, cpu_per_sample_s=costs.cpu_per_sample_s + args.decode_ms / 1e3)
    node = Node(
        cores=args.cores,
        ram_bytes=args.ram,
        disk_bps=args.disk_mbps * 1e6,
        nic_bps=args.nic_mbps * 1e6,
        ranks=args.ranks_per_node,
        cache_bytes=args.cache,
    )
    return origin, node, costs


def times(args: argparse.Namespace, samples: int, nbytes: int, chunks: int) -> dict[str, Any]:
    """The job's epochs in seconds, and the advice, as plain values."""
    origin, node, costs = _models(args)
    spec = PlanSpec.parse(args.plan, seed=args.seed)
    job = Job(
        samples=samples,
        store_bytes=nbytes,
        chunks=chunks,
        nodes=args.ranks // args.ranks_per_node,
        plan=spec.policy,
        q=spec.q,
        epochs=args.epochs,
        batch_size=args.batch_size,
        step_s=args.step_ms / 1e3,
    )
    counts = [n for n in (2**k for k in range(31)) if n <= args.max_nodes]
    return {
        "origin": origin.__dict__,
        "node": node.__dict__,
        "costs": costs.__dict__,
        "epochs": [e.to_dict() for e in epoch_times(origin, node, costs, job)],
        "least_cache": least_cache(origin, node, costs, job),
        "nodes": {n: e.to_dict() for n, e in fed_nodes(origin, node, costs, job, counts).items()},
    }


def print_times(out: dict[str, Any]) -> None:
    """The epochs' table, where the time goes, and the advice."""
    names = ("origin", "exchange", "local", "cpu", "model")
    print(f"{'epoch':>5} {'seconds':>8} {'first batch':>11} " + " ".join(f"{n:>8}" for n in names))
    for e in (EpochTime(**d) for d in out["epochs"]):
        parts = " ".join(f"{e.parts[n]:>8.2f}" for n in names)
        waits = ": the model waits on I/O" if e.io_bound else ""
        print(f"{e.epoch:>5} {e.seconds:>8.2f} {e.first_batch_s:>11.2f} {parts}  {e.bound}{waits}")
    cache = out["least_cache"]
    print(
        "cache per node for warm epochs that do not wait: "
        + ("none is enough (" + _why(out) + ")" if cache is None else human(cache))
    )
    fed = [str(n) for n, e in out["nodes"].items() if not e["io_bound"]]
    print("node counts at which the model does not wait: " + (", ".join(fed) or "none"))


def _why(out: dict[str, Any]) -> str:
    last = out["epochs"][-1]["parts"]
    return max(IO_PARTS, key=lambda k: float(last[k])) + " is the bound"
