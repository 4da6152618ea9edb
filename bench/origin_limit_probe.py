"""The origin-limit row of `bench/compare.py` alone, on 4 x 64 MiB random files through
slowfs under the `nfs` and `heavy-tail` models: sequential 8 MiB reads, and N parallel 8 MiB
ranged reads for N in 1..32 (the best N). Usage: .venv/bin/python bench/origin_limit_probe.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from bench.compare import parallel, sequential  # noqa: E402
from tierfeed.latency import LatencyModel  # noqa: E402
from tierfeed.slowfs import SlowFS  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        origin = Path(tmp) / "origin"
        (origin / "chunks").mkdir(parents=True)
        for i in range(4):
            (origin / "chunks" / f"{i}.tar").write_bytes(os.urandom(64 * 2**20))
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        for latency in ("nfs", "heavy-tail"):
            with SlowFS(origin, mnt, LatencyModel.parse(latency)):
                paths = sorted((mnt / "chunks").glob("*.tar"))
                for row in (sequential(paths, 4000, "sequential", mnt), parallel(paths, 4000, mnt)):
                    print(json.dumps({"latency": latency, **row}), flush=True)


if __name__ == "__main__":
    main()
