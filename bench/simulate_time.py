"""`tierfeed simulate`'s times against measured runs: cold and warm epoch and first batch.

Usage:
    python bench/simulate_time.py [--images 20000] [--median-kb 101] [--runs 3]
        [--latency nfs,heavy-tail] [--worlds 1,2,4] [--s3 [--s3-images 3000]] [--cache-check]
        [--out bench-out/simtime]
    python bench/simulate_time.py --latency "" --s3 --s3-images 3000   # S3 alone
    python bench/simulate_time.py --latency nfs --worlds 4,2 --runs 3 --code /tmp/old/src,.

For each origin: POSIX through slowfs under each ``--latency`` model (`bench/cold_path.py`'s
store: ``--images`` JPEGs of median ``--median-kb``, 64 MiB chunks), and with ``--s3`` the same
store (or one of ``--s3-images``) from moto through the bench proxy (`tests/s3proxy.py`: 20 ms a
request, 25 MB/s a connection), one rank. For each world W of ``--worlds``, ``tierfeed simulate
--ranks W --ranks-per-node W --calibrate`` probes it first (seconds: the origin, and W ranks'
Loaders over the store's first chunks; the figures saved), then ``tierfeed simulate ...
--calibration`` predicts the whole store's epochs, and ``--runs`` measured runs follow: W rank
processes on this machine (`World(rank, W)`, the global plan, 2 DataLoader workers each, batch
64, one disk tier directory for all, empty at the start), each told to start at once. Measured:
the first batch (the last rank's), the cold epoch (from the start to the last rank's end of
epoch 0) and the warm one (the last rank's end of epoch 1 from the last one's end of epoch 0).

With ``--code A,B`` (POSIX): the measured runs alone, the code of each directory in turn (a
``src`` as ``git archive REV src`` makes it, first on ``PYTHONPATH``; ``.``: this checkout's),
``--runs`` rounds, each with the node's busy CPU-seconds over the cold epoch; ``--locks`` times
every take of the disk tier's placement lock (`bench/cold_path.py --lock-times`).

With ``--cache-check`` (POSIX, the first latency model, one rank): the model is given a step time
(``--step-ms``, a sleep per batch), simulate names the smallest cache at which warm epochs do not
wait, and runs at that cache and at half of it measure the warm epoch and its batch waits.

Results: one JSON line per run and prediction, and a table of measured / predicted, in
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

TIERFEED = [sys.executable, "-m", "tierfeed"]


def child(a: argparse.Namespace) -> None:
    """One rank: wait for the go, read ``--epochs`` epochs, write when each began and ended."""
    import torch

    from bench.peers.run_tierfeed import length_and_label
    from tierfeed.torch import Dataset, Loader, TierConfig
    from tierfeed.torch.loaderprobe import node_cpu_s
    from tierfeed.world import World

    torch.set_num_threads(1)
    if a.lock_log:
        from bench.cold_path import time_the_placement_lock

        time_the_placement_lock(Path(a.lock_log))
    world = World(a.rank, a.world, a.rank, a.world)
    tiers = TierConfig(disk_dir=a.cache, disk_bytes=a.cache_bytes or None)
    ds = Dataset(
        a.store, "global", batch_size=64, decode=length_and_label, tiers=tiers, world=world
    )
    marks: dict[str, Any] = {"epochs": []}
    with Loader(ds, num_workers=a.workers) as loader:
        Path(a.ready).touch()
        while not Path(a.go).exists():
            time.sleep(0.005)
        marks["go"] = Path(a.go).stat().st_mtime
        marks["go_cpu"] = node_cpu_s()
        for _ in range(a.epochs):
            start, first, waits = time.time(), None, []
            asked = time.perf_counter()
            for _batch in loader:
                waits.append(time.perf_counter() - asked)
                first = first or time.time()
                time.sleep(a.step_s)
                asked = time.perf_counter()
            marks["epochs"].append(
                {
                    "start": start,
                    "first": first,
                    "end": time.time(),
                    "waits_s": sum(waits),
                    "cpu": node_cpu_s(),
                }
            )
    Path(a.out).write_text(json.dumps(marks))


def measure(
    store: str,
    world: int,
    work: Path,
    env: dict[str, str],
    cache_bytes: int = 0,
    step_s: float = 0.0,
    epochs: int = 2,
    locks: bool = False,
) -> dict[str, float]:
    """One measured run of ``world`` ranks: first batch, cold and warm epoch (seconds), and the
    origin's bytes (slowfs's or the proxy's counters); with ``locks``, the disk tier's
    placement lock's takes over both epochs, every process's (`bench.cold_path.lock_times`)."""
    from bench.cold_path import lock_times
    from bench.peers.common import origin_counters

    where = env["AWS_ENDPOINT_URL"] if store.startswith("s3://") else Path(store).parent
    before = origin_counters(where)["bytes_read"]
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        s = Path(scratch)
        go = s / "go"
        procs = []
        for rank in range(world):
            argv = [
                sys.executable,
                __file__,
                "--child",
                "--store",
                store,
                "--rank",
                str(rank),
                "--world",
                str(world),
                "--cache",
                str(s / "cache"),
                "--ready",
                str(s / f"ready{rank}"),
                "--go",
                str(go),
                "--out-file",
                str(s / f"marks{rank}"),
                "--cache-bytes",
                str(cache_bytes),
                "--step-s",
                str(step_s),
                "--epochs",
                str(epochs),
                *(["--lock-log", str(s / "locks")] if locks else []),
            ]
            procs.append(subprocess.Popen(argv, env=env))
        deadline = time.monotonic() + 300
        while not all((s / f"ready{r}").exists() for r in range(world)):
            if time.monotonic() > deadline or any(p.poll() for p in procs):
                raise SystemExit("a rank did not get ready")
            time.sleep(0.01)
        go.touch()
        for p in procs:
            if p.wait(timeout=900):
                raise SystemExit(f"a rank failed: {p.returncode}")
        marks = [json.loads((s / f"marks{r}").read_text()) for r in range(world)]
        held = lock_times(s / "locks") if locks else {}
    t0 = marks[0]["go"]
    ends = [[e["end"] for e in m["epochs"]] for m in marks]
    out = {
        "first_batch_s": max(m["epochs"][0]["first"] for m in marks) - t0,
        "cold_s": max(e[0] for e in ends) - t0,
        # the node's busy CPU-seconds (every process, the kernel's and slowfs's too) from the
        # go to the last rank's end of the cold epoch
        "cold_cpu_s": max(m["epochs"][0]["cpu"] for m in marks) - min(m["go_cpu"] for m in marks),
        "origin_MB": (origin_counters(where)["bytes_read"] - before) / 1e6,
        "firsts_s": [round(m["epochs"][0]["first"] - t0, 3) for m in marks],
        **held,
    }
    for k in range(1, epochs):
        out[f"warm{k}_s"] = max(e[k] for e in ends) - max(e[k - 1] for e in ends)
        out[f"warm{k}_waits_s"] = max(m["epochs"][k]["waits_s"] for m in marks)
    return out


def simulate(store: str, world: int, env: dict[str, str], *args: str) -> str:
    """``tierfeed simulate STORE`` for ``world`` ranks on one node, with ``args``; its output."""
    argv = [*TIERFEED, "simulate", store, "--ranks", str(world), "--ranks-per-node", str(world)]
    done = subprocess.run(
        [*argv, *args], env=env, capture_output=True, text=True, check=True, timeout=600
    )
    return done.stdout


def predict(
    store: str, world: int, calibration: Path, env: dict[str, str], extra: list[str] | None = None
) -> dict[str, Any]:
    """The predicted epochs, from a saved calibration."""
    out = simulate(
        store,
        world,
        env,
        "--calibration",
        str(calibration),
        "--epochs",
        "2",
        "--json",
        *(extra or []),
    )
    timed: dict[str, Any] = json.loads(out)["time"]
    return timed


def calibrate(store: str, path: Path, env: dict[str, str], world: int = 1) -> None:
    """``tierfeed simulate --calibrate`` with ``world`` ranks on the node, saved to ``path``."""
    simulate(store, world, env, "--epochs", "1", "--calibrate", "--save-calibration", str(path))


def compare(
    origin: str, store: str, worlds: list[int], runs: int, work: Path, env: dict[str, str], log: Any
) -> list[dict[str, Any]]:
    """Per world: calibrate (the world's ranks on the node), predict, and ``runs`` measured
    runs."""
    rows = []
    for world in worlds:
        calibration = work / f"calibration-{origin}-W{world}.json"
        calibrate(store, calibration, env, world)
        timed = predict(store, world, calibration, env)
        want = {
            "first_batch_s": timed["epochs"][0]["first_batch_s"],
            "cold_s": timed["epochs"][0]["seconds"],
            "warm1_s": timed["epochs"][1]["seconds"],
        }
        for run in range(runs):
            got = measure(store, world, work, env)
            row = {
                "origin": origin,
                "world": world,
                "run": run + 1,
                "measured": got,
                "predicted": want,
                "ratio": {k: got[k] / want[k] for k in want},
            }
            print(json.dumps(row), file=log, flush=True)
            print(
                f"{origin:>12} W={world} run {run + 1}: "
                + "  ".join(f"{k} {got[k]:.2f}/{want[k]:.2f}" for k in want),
                flush=True,
            )
            rows.append(row)
    return rows


def code_pairs(
    origin: str, store: str, a: argparse.Namespace, env: dict[str, str], log: Any
) -> None:
    """Measured runs only (no probe, no prediction), alternating the code of each ``--code``
    directory (a ``src`` as ``git archive REV src`` makes it, put first on ``PYTHONPATH``; ``.``
    for this checkout's): ``--runs`` rounds, each world of ``--worlds`` once per code in turn;
    then the medians per world and code."""
    rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
    codes = a.code.split(",")
    for run in range(a.runs):
        for world in [int(w) for w in a.worlds.split(",")]:
            for code in codes:
                here = dict(env) if code == "." else {**env, "PYTHONPATH": code}
                got = measure(store, world, a.out, here, locks=a.locks)
                print(json.dumps({"origin": origin, "world": world, "code": code, **got}), file=log)
                print(
                    f"{origin} W={world} {code} run {run + 1}: first batch "
                    f"{got['first_batch_s']:.2f} s, cold {got['cold_s']:.2f} s "
                    f"({got['cold_cpu_s']:.1f} CPU-s), warm {got['warm1_s']:.2f} s",
                    flush=True,
                )
                rows.setdefault((world, code), []).append(got)
    for (world, code), got in sorted(rows.items()):
        medians = {k: statistics.median(g[k] for g in got) for k in ("first_batch_s", "cold_s")}
        print(
            f"{origin} W={world} {code}: median first batch {medians['first_batch_s']:.2f} s, "
            f"cold {medians['cold_s']:.2f} s; cold runs "
            + " / ".join(f"{g['cold_s']:.2f}" for g in got)
        )


def cache_check(
    store: str, work: Path, env: dict[str, str], step_ms: float, runs: int, log: Any
) -> list[dict[str, Any]]:
    """The smallest cache simulate names, and half of it: warm epochs measured at each."""
    calibration = work / "calibration-cache.json"
    calibrate(store, calibration, env, 1)
    timed = predict(store, 1, calibration, env, ["--step-ms", str(step_ms)])
    least = timed["least_cache"]
    rows = []
    for cache in (int(least), int(least) // 2) if least else ():
        want = predict(
            store, 1, calibration, env, ["--step-ms", str(step_ms), "--cache", str(cache)]
        )["epochs"][1]
        for run in range(runs):
            got = measure(store, 1, work, env, cache_bytes=cache, step_s=step_ms / 1e3)
            row = {
                "cache": cache,
                "least_cache": least,
                "run": run + 1,
                "measured": got,
                "predicted_warm_s": want["seconds"],
                "predicted_io_bound": want["io_bound"],
            }
            print(json.dumps(row), file=log, flush=True)
            print(
                f"cache {cache / 2**20:.0f} MiB run {run + 1}: warm {got['warm1_s']:.2f}/"
                f"{want['seconds']:.2f} s, waits {got['warm1_waits_s']:.2f} s, predicted "
                f"{'waiting' if want['io_bound'] else 'fed'}",
                flush=True,
            )
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--median-kb", type=float, default=101)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--latency", default="nfs,heavy-tail")
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--s3", action="store_true")
    p.add_argument("--s3-images", type=int, default=0, help="S3: a store of its own, this size")
    p.add_argument("--s3-median-kb", type=float, default=66)
    p.add_argument("--cache-check", action="store_true")
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=Path("bench-out/simtime"))
    p.add_argument(
        "--code",
        help="measured runs only, alternating these src directories (comma-separated; "
        "'.' for this checkout's)",
    )
    p.add_argument(
        "--locks", action="store_true", help="time the disk tier's placement lock in each run"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("store", "cache", "ready", "go", "out-file", "lock-log"):
        p.add_argument(f"--{name}", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cache-bytes", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--step-s", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.out = a.out_file or a.out
        return child(a)
    run_all(a)


def run_all(a: argparse.Namespace) -> None:
    from bench.cold_path import build, warm_backing
    from tierfeed.latency import LatencyModel
    from tierfeed.slowfs import SlowFS

    a.out.mkdir(parents=True, exist_ok=True)
    work = Path("bench-out/cold_path")
    work.mkdir(parents=True, exist_ok=True)
    origin = build(work, a.images, a.median_kb)
    warm_backing(origin)
    worlds = [int(w) for w in a.worlds.split(",")]
    env = dict(os.environ)
    rows: list[dict[str, Any]] = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with (a.out / f"runs-{stamp}.jsonl").open("w") as log:
        for n, model in enumerate(m for m in a.latency.split(",") if m):
            mnt = work / f"mnt-simtime-{model}"
            mnt.mkdir(exist_ok=True)
            with SlowFS(origin, mnt, LatencyModel.parse(model)):
                store = str(mnt / "tierfeed")
                if a.code:
                    code_pairs(f"posix-{model}", store, a, env, log)
                    continue
                rows += compare(f"posix-{model}", store, worlds, a.runs, a.out, env, log)
                if a.cache_check and n == 0:
                    cache_check(store, a.out, env, a.step_ms, a.runs, log)
        if a.s3:
            small = build(work, a.s3_images, a.s3_median_kb) if a.s3_images else origin
            rows += s3(small, a, env, log)
    if rows:
        summary(rows)


def s3(origin: Path, a: argparse.Namespace, env: dict[str, str], log: Any) -> list[dict[str, Any]]:
    """The same store from moto through the bench proxy, one rank, cold and warm."""
    from bench.s3_compare import BUCKET, KEYS, free_port, s3_client, upload_tree, wait_up

    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = None
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_up(endpoint)
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        upload_tree(endpoint, origin / "tierfeed", "tierfeed")
        url_file = a.out / "proxy-url"
        url_file.unlink(missing_ok=True)
        proxy = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.s3proxy",
                "--upstream",
                endpoint,
                "--latency-ms",
                "20",
                "--mbps",
                "25",
                "--url-file",
                str(url_file),
                "--serve",
                f"{BUCKET}={origin}",
                "--no-keep-alive",
            ],
            cwd=ROOT,
        )
        deadline = time.monotonic() + 30
        while not url_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        s3env = {**env, **KEYS, "AWS_ENDPOINT_URL": url_file.read_text()}
        with tempfile.TemporaryDirectory() as home:  # the index's cache, fresh
            s3env["XDG_CACHE_HOME"] = home
            return compare("s3", f"s3://{BUCKET}/tierfeed", [1], a.runs, a.out, s3env, log)
    finally:
        for process in (proxy, server):
            if process is not None:
                process.terminate()
                process.wait(timeout=10)


def summary(rows: list[dict[str, Any]]) -> None:
    """Per origin and world: the median measured / predicted, and the worst."""
    keys = ("first_batch_s", "cold_s", "warm1_s")
    print(f"{'origin':>16} {'W':>2} " + " ".join(f"{k + ' (med, worst)':>28}" for k in keys))
    for origin, world in sorted({(r["origin"], r["world"]) for r in rows}):
        here = [r for r in rows if (r["origin"], r["world"]) == (origin, world)]
        cells = []
        for k in keys:
            ratios = [r["ratio"][k] for r in here]
            worst = max(ratios, key=lambda x: abs(x - 1))
            cells.append(f"{statistics.median(ratios):>14.2f} {worst:>13.2f}")
        print(f"{origin:>16} {world:>2} " + " ".join(cells))


if __name__ == "__main__":
    main()
