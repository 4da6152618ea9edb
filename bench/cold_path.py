"""The cold epoch alone: tierfeed's first epoch through slowfs, as in `bench/compare.py`.

Builds compare.py's data once (4,000 JPEGs, lognormal sizes, median 64 KB, packed in 64 MB
chunks; or ``--images``/``--median-kb`` of them: ``--images 20000 --median-kb 101`` is issue
45's user-sized store, 2.1 GB in 32 chunks) under ``--work``, mounts it with slowfs under a
latency model, and runs ``--runs`` cold epochs, each in a fresh process with an empty disk
tier: 2 DataLoader workers, batch 64, the global plan. Per run: samples/s, when the first
batch came, the batch waits after it (p99 and max), and origin bytes over store bytes
(slowfs's counters). With ``--limit``, the origin's own limit through the same mount after
the runs (N parallel 8 MiB reads of the chunk files, the best N: `bench/compare.py`'s row).
To compare two versions of the code in the same window,
run it with ``--code DIR`` (a ``src`` directory put first on the path, e.g. an older commit's
``git archive`` output), interleaved with the current code.

With ``--resume-at K``, each run is a restart: one process reads K batches of a cold epoch
and keeps the Loader's ``state_dict()``; a fresh process with its own empty disk tier loads
it (``load_state_dict``) and reads the rest of the epoch, and the row is that second one's
(first batch after the resume, samples/s of the rest, origin bytes over the store).

Usage:
    python bench/cold_path.py --latency nfs --runs 3
    python bench/cold_path.py --latency heavy-tail --runs 3 --code /tmp/old/src
    python bench/cold_path.py --latency nfs --runs 3 --resume-at 30
    python bench/cold_path.py --latency stalls --images 20000 --median-kb 101 --runs 1 --limit
    python bench/cold_path.py --latency stalls --images 20000 --median-kb 101 --runs 1 --exact
    python bench/cold_path.py --latency stalls --images 20000 --median-kb 101 --trace out/
    python bench/cold_path.py --latency stalls --images 20000 --median-kb 101 --lock-times
    python bench/cold_path.py --latency stalls --images 20000 --median-kb 101 --reuse-pages

With ``--lock-times``, each take of the disk tier's host-wide placement lock is timed in every
process (how long its copy waited for it, how long it was held), and each row adds their
count, sums, the longest wait, and the 90th percentile and longest hold.

With ``--reuse-pages``, the runs alternate two ways of finding memory: before the first of
each pair, as many bytes as the store are written into a file under ``--work`` and removed
(`bench/page_cache_write.py`), so that the run's disk tier takes page-cache pages the kernel
has just freed; before the second, a pause of ``--pause`` seconds, after which this machine's
host has taken freed pages back (free page reporting) and the run pays the first touch of
each, as a run after other work does. Rows say which (``pages``), and the summary has a median
for each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.page_cache_write import write_once  # noqa: E402


def build(work: Path, images: int = 4000, median_kb: float = 64) -> Path:
    """compare.py's data (``images`` JPEGs of median ``median_kb``), packed once: the origin
    directory holding ``tierfeed/``."""
    from tierfeed.format.pack import PackOptions, pack
    from tierfeed.synth import SynthSpec, make_imagefolder

    default = (images, median_kb) == (4000, 64)
    origin = work / ("origin" if default else f"origin-{images}-{median_kb:g}")
    if not (origin / "tierfeed").exists():
        spec = SynthSpec(
            classes=20, per_class=images // 20, median_bytes=int(median_kb * 1000), sigma=0.6,
            jpeg=True, seed=1,
        )  # fmt: skip
        make_imagefolder(origin / "raw", spec)
        pack(origin / "raw", origin / "tierfeed", PackOptions(chunk_size=64 * 2**20))
    return origin


def store_bytes(root: Path) -> int:
    """The bytes of the store under ``root`` (its ``tierfeed`` directory: index and chunks)."""
    return sum(f.stat().st_size for f in (root / "tierfeed").rglob("*") if f.is_file())


def warm_backing(origin: Path) -> None:
    """Read the origin's files once, so that the disk under slowfs is not part of the model:
    a run right after other work evicted them read at this machine's disk speed instead
    (runs of 1,073 and 1,392 samples/s among ~3,100, each the first after a test run)."""
    for path in sorted((origin / "tierfeed").rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                while f.read(16 << 20):
                    pass


def time_the_placement_lock(log: Path) -> None:
    """Wrap the disk tier's host-wide placement lock (`tierfeed.storage.shared_dir`) so that
    each take appends (wait, hold) seconds to ``log``/<pid>, in this process and in the workers
    forked from it: how long copies queue for it, and how long each holds it."""
    import contextlib

    from tierfeed.storage import disktier

    real = disktier.placement_lock
    log.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def timed(root: Any, wait_s: float | None = None) -> Iterator[None]:
        asked = time.perf_counter()
        with real(root, wait_s):
            got = time.perf_counter()
            try:
                yield
            finally:
                held = time.perf_counter() - got
                with open(log / str(os.getpid()), "a") as f:
                    f.write(f"{got - asked:.6f} {held:.6f}\n")

    disktier.placement_lock = timed  # type: ignore[assignment]


def lock_times(log: Path) -> dict[str, float]:
    """The placement lock's takes in ``log`` (`time_the_placement_lock`), every process's."""
    rows = [line.split() for f in log.iterdir() for line in f.read_text().splitlines()]
    waits = sorted(float(w) for w, _ in rows) or [0.0]
    holds = sorted(float(h) for _, h in rows) or [0.0]
    return {
        "lock_takes": len(rows), "lock_wait_s": sum(waits), "lock_wait_max_s": waits[-1],
        "lock_hold_s": sum(holds), "lock_hold_p90_s": holds[int(0.9 * (len(holds) - 1))],
        "lock_hold_max_s": holds[-1],
    }  # fmt: skip


def one_epoch(
    mnt: Path,
    cache: Path,
    workers: int,
    save: Path | None = None,
    stop_at: int = 0,
    exact: bool = False,
    trace: Path | None = None,
    locks: Path | None = None,
) -> dict[str, float]:
    """One cold epoch in this process (run as ``--child``). With ``stop_at``, the first
    ``stop_at`` batches only, and the Loader's state then saved to ``save``; with ``save`` an
    existing file and no ``stop_at``, the epoch resumed from that state; with ``exact``, in
    the plan's exact order (the guard's deferral off: `DeadlineOptions(enabled=False)`); with
    ``trace``, each batch's wait, when it came and slowfs's stalls meanwhile written there;
    with ``locks``, the placement lock's waits and holds (`time_the_placement_lock`)."""
    import torch

    from bench.peers.common import origin_counters
    from bench.peers.run_tierfeed import length_and_label
    from tierfeed.loader.latency import DeadlineOptions
    from tierfeed.torch import Dataset, Loader, TierConfig

    torch.set_num_threads(1)
    if locks is not None:
        time_the_placement_lock(locks)
    tiers = TierConfig(disk_dir=str(cache))  # room for the whole store
    deadline = DeadlineOptions(enabled=not exact)
    ds = Dataset(
        str(mnt / "tierfeed"), "global", batch_size=64, decode=length_and_label, tiers=tiers,
        deadline=deadline,
    )  # fmt: skip
    loader = Loader(ds, num_workers=workers)
    if save is not None and not stop_at:
        loader.load_state_dict(torch.load(save, weights_only=False))
    with loader:
        before = origin_counters(mnt)["bytes_read"]
        uptime = json.loads((mnt / ".slowfs/stats.json").read_bytes())["uptime_s"]
        started, wall = time.perf_counter(), time.time()
        first = None
        samples = 0
        waits: list[float] = []
        at: list[float] = []
        asked = started
        for batch in loader:
            now = time.perf_counter()
            first = first if first is not None else now - started
            waits.append(now - asked)
            at.append(now - started)
            samples += len(batch[0])
            if stop_at and samples >= stop_at * 64:
                torch.save(loader.state_dict(), save)
                break
            asked = time.perf_counter()
        seconds = time.perf_counter() - started
        read = origin_counters(mnt)["bytes_read"] - before
        if trace is not None:  # each batch's wait and when it came, slowfs's stalls beside
            stalls = json.loads((mnt / ".slowfs/stats.json").read_bytes())["stalls"]
            stalls = [{**s, "at_s": s["at_s"] - uptime} for s in stalls if s["at_s"] >= uptime]
            trace.write_text(json.dumps({"waits": waits, "at": at, "stalls": stalls, "t0": wall}))
    own, workers = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    cpu = own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime
    store = store_bytes(mnt)
    after = sorted(waits[1:]) or [0.0]
    return {
        "samples_per_s": samples / seconds,
        "first_batch_s": first or 0.0,
        "wait_p99_after_first_s": after[min(len(after) - 1, int(0.99 * len(after)))],
        "wait_max_after_first_s": after[-1],
        "origin_over_store": read / store,
        "cpu_s": cpu,
        **(lock_times(locks) if locks is not None else {}),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--latency", default="nfs", help="slowfs latency model (nfs, heavy-tail)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--code", type=Path, help="a src directory to run instead of this one's")
    p.add_argument("--work", type=Path, default=Path("bench-out/cold_path"))
    p.add_argument("--resume-at", type=int, default=0, help="restart after this many batches")
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--median-kb", type=float, default=64)
    p.add_argument("--limit", action="store_true", help="then the origin's own limit")
    p.add_argument("--exact", action="store_true", help="the plan's exact order (no deferral)")
    p.add_argument("--trace", type=Path, help="write each run's batch waits and stalls here")
    p.add_argument(
        "--lock-times", action="store_true",
        help="time each take of the disk tier's placement lock: waits and holds, every process",
    )  # fmt: skip
    p.add_argument(
        "--reuse-pages", action="store_true",
        help="alternate runs on just-freed page-cache pages and runs after a pause",
    )  # fmt: skip
    p.add_argument("--pause", type=float, default=20.0, help="with --reuse-pages (seconds)")
    p.add_argument("--locks", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        mnt, cache = Path(args.child[0]), Path(args.child[1])
        row = one_epoch(
            mnt, cache, args.workers, args.state, args.resume_at, args.exact, args.trace,
            args.locks,
        )  # fmt: skip
        print(json.dumps(row))
        return

    from tierfeed.latency import LatencyModel
    from tierfeed.slowfs import SlowFS

    args.work.mkdir(parents=True, exist_ok=True)
    origin = build(args.work, args.images, args.median_kb)
    warm_backing(origin)
    mnt = args.work / f"mnt-{args.latency}"
    mnt.mkdir(exist_ok=True)
    env = dict(os.environ)
    if args.code:
        env["PYTHONPATH"] = os.pathsep.join([str(args.code.resolve()), env.get("PYTHONPATH", "")])
    rows: list[dict[str, float]] = []
    labels: list[str | None] = []
    store_mib = -(-store_bytes(origin) >> 20)
    with SlowFS(origin, mnt, LatencyModel.parse(args.latency)):
        for run in range(args.runs):
            pages = None
            if args.reuse_pages:
                pages = "reused" if run % 2 == 0 else "as found"
                if pages == "reused":
                    write_once(str(args.work), store_mib, os.urandom(4 * 2**20))
                else:
                    time.sleep(args.pause)
            with tempfile.TemporaryDirectory(dir=args.work) as scratch:
                child = [sys.executable, __file__, "--workers", str(args.workers)]
                child += ["--exact"] if args.exact else []
                child += ["--locks", str(Path(scratch) / "locks")] if args.lock_times else []
                if args.trace:
                    args.trace.mkdir(parents=True, exist_ok=True)
                    child += ["--trace", str(args.trace.resolve() / f"run-{run + 1}.json")]
                if args.resume_at:  # the part before the restart, in a process of its own
                    state = ["--state", str(Path(scratch) / "state.pt")]
                    _child([*child, *state, "--resume-at", str(args.resume_at)], mnt, env)
                    child += state
                rows.append(_child(child, mnt, env))
                row = rows[-1]
                tag = {} if pages is None else {"pages": pages}
                print(json.dumps({**tag, **{k: round(v, 4) for k, v in row.items()}}), flush=True)
                labels.append(pages)
        if args.limit:
            from bench.compare import parallel

            chunks = sorted((mnt / "tierfeed" / "chunks").glob("*.tar"))
            limit = parallel(chunks, args.images // 20 * 20, mnt, (4, 8, 16))
            print(json.dumps({k: v for k, v in limit.items() if not k.startswith("origin_")}))
    code = str(args.code or ".")
    for label in dict.fromkeys(labels):
        mine = [r for r, other in zip(rows, labels, strict=True) if other == label]
        summary = {k: round(statistics.median(r[k] for r in mine), 4) for k in rows[0]}
        tag = {} if label is None else {"pages": label}
        print(json.dumps({"latency": args.latency, "code": code, "exact": args.exact, **tag,
                          "median": summary}))  # fmt: skip


def _child(command: list[str], mnt: Path, env: dict[str, str]) -> dict[str, float]:
    """Run one ``--child`` with a fresh, empty disk tier; its row."""
    with tempfile.TemporaryDirectory(dir=mnt.parent) as cache:
        out = subprocess.run(
            [*command, "--child", str(mnt), cache],
            env=env, capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
    row: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


if __name__ == "__main__":
    main()
