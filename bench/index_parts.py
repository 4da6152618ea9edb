"""`tierfeed index --part I/N` at scale: shards/s of 1, 2 and 4 parts run as separate
processes at once, and the `tierfeed merge` time; one JSON line per part count.

    .venv/bin/python bench/index_parts.py --work /tmp/tf-bench --shards 10000
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


def make_shards(where: Path, shards: int, samples: int, size: int) -> None:
    """``shards`` WebDataset shards of ``samples`` samples (a ``.bin`` of ``size`` bytes and
    a ``.cls`` each)."""
    where.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(where / f"shard-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(samples):
                for ext, data in (("bin", os.urandom(size)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{s:06d}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def run_parts(pattern: str, dst: Path, count: int) -> tuple[float, float]:
    """Seconds for ``count`` parts run at once, then for the merge."""
    command = [sys.executable, "-m", "tierfeed", "index", pattern, "--out", str(dst)]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*command, "--part", f"{i}/{count}", "-q"],
            stdout=subprocess.DEVNULL,
        )
        for i in range(count)
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"a part of {count} failed")
    indexed = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tierfeed", "merge", str(dst), "-q"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return indexed, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=tempfile.gettempdir(), help="where the tmp dir goes")
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=4, help="samples per shard")
    ap.add_argument("--size", type=int, default=1024, help="bytes per sample")
    ap.add_argument("--parts", default="1,2,4")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="index-parts-", dir=args.work))
    try:
        make_shards(work / "shards", args.shards, args.samples, args.size)
        pattern = str(work / "shards" / f"shard-{{000000..{args.shards - 1:06d}}}.tar")
        for count in map(int, args.parts.split(",")):
            indexed, merged = run_parts(pattern, work / f"dst-{count}", count)
            row = {
                "parts": count,
                "shards": args.shards,
                "samples": args.shards * args.samples,
                "index_s": round(indexed, 3),
                "shards_per_s": round(args.shards / indexed, 1),
                "merge_s": round(merged, 3),
                "cpus": os.cpu_count(),
            }
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
