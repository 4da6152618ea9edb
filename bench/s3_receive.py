"""The same ranged GETs through tierfeed's S3 driver and through boto3 threads, in one process.

Packs `bench/s3_compare.py`'s data (``--images`` JPEGs, 64 MiB chunks), starts moto's server
(its own process) and the slowing proxy (`tests/s3proxy.py`, in this process); then, per
trial, fetches every 4 MiB piece of the two large chunks with 32 threads: once through
`FsspecDriver.read_range` (aiobotocore on fsspec's one event loop, each object's HEAD made
before the clock starts), twice through `FsspecDriver.read_block` (a copy's pieces on the
calling threads: obstore's client, `NativeRanges`, as ``TIERFEED_S3_CLIENT=obstore`` asks,
then botocore's, `S3Ranges`, the default; each client made before the clock starts), once
through a
boto3 client (urllib3, one connection per thread), as the origin-limit row of
`bench/s3_compare.py` does. Prints the wall time of each and the
span the proxy took to send the bytes: where the first is much longer than the second, the
client, not the link, is what a copy waits for.

Usage (in the benchmark environment):
    PYTHONPATH=src python bench/s3_receive.py [--images 2000] [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.s3_compare import KEYS, free_port, s3_client, upload_tree, wait_up  # noqa: E402
from bench.s3_trace import BUCKET, traced_proxy  # noqa: E402

PIECE = 4 * 2**20


def timed(proxy: Any, label: str, items: list[tuple[str, int, int]],
          get: Callable[[tuple[str, int, int]], int]) -> None:  # fmt: skip
    proxy.gets.clear()
    started = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        total = sum(pool.map(get, items))
    seconds = time.perf_counter() - started
    span = max(e for _, e, _ in proxy.gets) - min(s for s, _, _ in proxy.gets)
    print(f"{label}: {seconds * 1e3:.0f} ms, {total / seconds / 1e6:.0f} MB/s; "
          f"the proxy sent them in {span * 1e3:.0f} ms", flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--trials", type=int, default=3)
    a = p.parse_args()
    from tierfeed.format.pack import PackOptions, pack
    from tierfeed.storage.fsspec_driver import FsspecDriver
    from tierfeed.synth import SynthSpec, make_imagefolder

    os.environ.update(KEYS)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = SynthSpec(classes=20, per_class=a.images // 20, median_bytes=64000, sigma=0.6,
                         jpeg=True, seed=1)  # fmt: skip
        make_imagefolder(work / "raw", spec)
        store = work / "origin" / "tierfeed"
        pack(work / "raw", store, PackOptions(chunk_size=64 * 2**20, progress=False))
        port = free_port()
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            endpoint = f"http://127.0.0.1:{port}"
            wait_up(endpoint)
            s3_client(endpoint).create_bucket(Bucket=BUCKET)
            upload_tree(endpoint, store, "tierfeed")
            proxy = traced_proxy(endpoint, 0.02, 25e6, work / "origin")
            os.environ["AWS_ENDPOINT_URL"] = proxy.url
            chunks = sorted((store / "chunks").glob("*.tar"), key=lambda c: -c.stat().st_size)
            items = [(f"chunks/{c.name}", off, min(PIECE, c.stat().st_size - off))
                     for c in chunks[:2] for off in range(0, c.stat().st_size, PIECE)]  # fmt: skip
            for _ in range(a.trials):
                driver = FsspecDriver(f"s3://{BUCKET}/tierfeed", read_only=True)
                for name in {k for k, _, _ in items}:
                    driver.size(name)  # its HEAD: the pin
                timed(proxy, "FsspecDriver.read_range", items,
                      lambda it, d=driver: len(d.read_range(*it)))  # fmt: skip
                driver.close()
                for client in ("obstore", "botocore"):
                    os.environ["TIERFEED_S3_CLIENT"] = client
                    driver = FsspecDriver(f"s3://{BUCKET}/tierfeed", read_only=True)
                    for name in {k for k, _, _ in items}:
                        driver.size(name)
                    driver.read_block(items[0][0], 0, 1)  # its client made (once per process)
                    kind = type(driver._threaded()).__name__
                    timed(proxy, f"FsspecDriver.read_block ({kind})", items,
                          lambda it, d=driver: len(d.read_block(*it)))  # fmt: skip
                    driver.close()
                os.environ.pop("TIERFEED_S3_CLIENT")
                s3 = s3_client(proxy.url)

                def get(it: tuple[str, int, int], s3: Any = s3) -> int:
                    key, off, n = it
                    answer = s3.get_object(Bucket=BUCKET, Key=f"tierfeed/{key}",
                                           Range=f"bytes={off}-{off + n - 1}")  # fmt: skip
                    return len(answer["Body"].read())

                timed(proxy, "boto3 threads", items, get)
            proxy.stop()
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
