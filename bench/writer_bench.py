"""Writing a dataset from Python: `tierfeed.Writer` and `tierfeed.optimize` against MosaicML
Streaming's `MDSWriter`, WebDataset's `ShardWriter` and `litdata.optimize` on the same samples.

Usage (in the benchmark environment, `make bench-env`):
    .venv-bench/bin/python bench/writer_bench.py --samples 20000 --bytes 10240 --runs 3

Every system writes the same N synthetic samples (a key, ~``--bytes`` of incompressible data as
``jpg``, an int label as ``cls``), built by the same function `make_sample` from the sample's
number, into 64 MB chunks/shards, without compression. Each run of each system is a fresh
process writing into an empty directory on the same disk; systems alternate within a run, and
the median of the runs is reported as samples/s (N over the wall time of the write, its index
included, imports excluded). The single-process writers run in one process; `tierfeed.optimize`
and `litdata.optimize` run ``--workers`` processes. tierfeed also fsyncs every chunk and its
index before it returns; the peers leave their data in the page cache. A peer that cannot be
imported is skipped with a message saying why.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEMS = ("tierfeed-writer", "tierfeed-optimize", "mds-writer", "wds-shardwriter", "litdata")
# Not run by default: the Writer with tarfile's header building, what it used before the fast
# path of `tarchunk.member_header` (`--systems tierfeed-writer tierfeed-writer-tarfile`).
EXTRA = ("tierfeed-writer-tarfile",)
_PEER_MODULE = {"mds-writer": "streaming", "wds-shardwriter": "webdataset", "litdata": "litdata"}
_BLOB = b""  # filled by `_blob`: one random block all samples are cut from
_CHUNK_BYTES = 64_000_000


def _blob() -> bytes:
    global _BLOB
    if not _BLOB:
        import numpy as np

        _BLOB = np.random.default_rng(14).bytes(4 * 2**20)
    return _BLOB


def make_sample(i: int, size: int = 10240) -> dict[str, Any]:
    """Sample ``i``: its key, ``size`` ± 2 KiB of random bytes, and a label in [0, 100)."""
    blob = _blob()
    n = size - 2048 + (i * 7919) % 4096
    start = (i * 104729) % (len(blob) - n)
    return {"__key__": f"{i:08d}", "jpg": blob[start : start + n], "cls": i % 100}


def _sample_of(args: tuple[int, int]) -> dict[str, Any]:
    """An optimize fn: the sample of (number, size)."""
    return make_sample(*args)


def _litdata_sample(args: tuple[int, int]) -> dict[str, Any]:
    """LitData's fn: the same sample, its key as an ordinary field."""
    s = make_sample(*args)
    return {"key": s["__key__"], "jpg": s["jpg"], "cls": s["cls"]}


def _write(system: str, n: int, size: int, out: Path, workers: int) -> None:
    """Write the ``n`` samples with ``system`` into ``out`` (the timed part)."""
    inputs = [(i, size) for i in range(n)]
    if system.startswith("tierfeed-writer"):
        import tierfeed
        import tierfeed.format.chunksink as chunksink

        if system == "tierfeed-writer-tarfile":
            from tierfeed.format.tarchunk import _tarfile_header

            chunksink.member_header = lambda path, size: _tarfile_header(path, size, 0, 0o644)  # type: ignore[assignment]

        with tierfeed.Writer(out, chunk_size=_CHUNK_BYTES) as w:
            for i in range(n):
                w.write(make_sample(i, size))
    elif system == "tierfeed-optimize":
        import tierfeed

        tierfeed.optimize(_sample_of, inputs, out, workers=workers, chunk_size=_CHUNK_BYTES)
    elif system == "mds-writer":
        from streaming import MDSWriter

        columns = {"key": "str", "jpg": "bytes", "cls": "int"}
        with MDSWriter(out=str(out), columns=columns, size_limit=_CHUNK_BYTES) as mds:
            for i in range(n):
                s = make_sample(i, size)
                mds.write({"key": s["__key__"], "jpg": s["jpg"], "cls": s["cls"]})
    elif system == "wds-shardwriter":
        import webdataset as wds

        out.mkdir(parents=True)
        with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=_CHUNK_BYTES, verbose=0) as sink:
            for i in range(n):
                sink.write(make_sample(i, size))
    elif system == "litdata":
        import litdata

        litdata.optimize(
            fn=_litdata_sample,
            inputs=inputs,
            output_dir=str(out),
            chunk_bytes=_CHUNK_BYTES,
            num_workers=workers,
            verbose=False,
        )
    else:
        raise SystemExit(f"unknown system {system!r}; one of {', '.join(SYSTEMS + EXTRA)}")


def child(system: str, n: int, size: int, out: Path, workers: int) -> None:
    """One timed write in this process; prints a JSON line."""
    _blob()  # built before the clock starts, as every system's input
    importlib.import_module(_PEER_MODULE.get(system, "tierfeed"))  # imports are not timed
    started = time.perf_counter()
    _write(system, n, size, out, workers)
    seconds = time.perf_counter() - started
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(json.dumps({"system": system, "seconds": seconds, "bytes": written}))


def available(system: str) -> str | None:
    """None when ``system`` can run here, else why not."""
    module = _PEER_MODULE.get(system)
    if module is None:
        return None
    probe = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"`import {module}` fails in {sys.executable} ({last}); build it: make bench-env"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--bytes", type=int, default=10240, help="mean data bytes per sample")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="processes of the optimize calls")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS + EXTRA)
    p.add_argument(
        "--workdir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    p.add_argument("--child", choices=SYSTEMS + EXTRA, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child, a.samples, a.bytes, a.out, a.workers)
        return
    systems = []
    for system in a.systems:
        why = available(system)
        if why:
            print(f"skipping {system}: {why}", file=sys.stderr)
        else:
            systems.append(system)
    work = Path(tempfile.mkdtemp(prefix="tierfeed-writer-bench-", dir=a.workdir))
    times: dict[str, list[float]] = {s: [] for s in systems}
    sizes: dict[str, int] = {}
    try:
        for run in range(a.runs):
            for system in systems:
                out = work / f"{system}-{run}"
                cmd = [sys.executable, __file__, "--child", system, "--out", str(out),
                       "--samples", str(a.samples), "--bytes", str(a.bytes),
                       "--workers", str(a.workers)]  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode:
                    raise SystemExit(f"{system} failed:\n{done.stderr[-4000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                times[system].append(result["seconds"])
                sizes[system] = result["bytes"]
                print(f"run {run} {system}: {a.samples / result['seconds']:.0f} samples/s",
                      file=sys.stderr)  # fmt: skip
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{a.samples} samples x ~{a.bytes} B, {a.runs} runs, optimize workers {a.workers}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}")  # fmt: skip
    print("| system | processes | samples/s (median) | MB/s | runs (s) | bytes written |")
    print("|---|---|---|---|---|---|")
    for system in systems:
        median = statistics.median(times[system])
        procs = a.workers if system in ("tierfeed-optimize", "litdata") else 1
        mbps = a.samples * a.bytes / median / 1e6
        runs = ", ".join(f"{t:.2f}" for t in times[system])
        print(f"| {system} | {procs} | {a.samples / median:,.0f} | {mbps:.0f} | {runs} | "
              f"{sizes[system]:,} |")  # fmt: skip


if __name__ == "__main__":
    main()
