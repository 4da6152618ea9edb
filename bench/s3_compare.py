"""Side by side from an object store: tierfeed, MosaicML Streaming, LitData and AWS's
s3torchconnector read the same generated JPEGs from a slowed S3 endpoint, in one run.

Usage (in the benchmark environment, `make bench-env`):
    .venv-bench/bin/python bench/s3_compare.py [--images 2000] [--median-kb 64] [--epochs 3]
        [--latency-ms 20] [--mbps 25] [--systems tierfeed,streaming,litdata,s3torchconnector]
        [--out bench-out/s3]

Steps: generate an ImageFolder tree of real JPEGs (as `bench/compare.py`); convert it with each
system's own tool (s3torchconnector reads one object per sample: the tree as it is, its users'
layout); start moto's S3 server (its own process, on loopback) and upload each
converted dataset to ``s3://bench/<system>``; start the slowing proxy in front of it
(`tests/s3proxy.py`, its own process: ``--latency-ms`` before every request, each response's
body at most ``--mbps`` MB/s, as one connection to S3 is). The proxy answers GET and HEAD of the
uploaded objects from the same files itself (ETags, ranges, If-Match), because moto copies a
whole object for every ranged GET under a lock per object (moto/s3/models.py, FakeKey.value),
which no real S3 does and which would penalise ranged readers; lists and writes go to moto. Like
moto's server, the proxy closes each connection after its response: Streaming's downloader
fetches index.json before the DataLoader forks, and its forked workers then share that pooled
connection, whose responses interleave (a corrupted shard, or a 60 s read timeout). Run each
system's loader in a fresh process for ``--epochs`` epochs with the same workers, batch size and
a local cache with room for everything, pointed at the proxy by the SDKs' own settings
(``AWS_ENDPOINT_URL``, and Streaming's ``S3_ENDPOINT_URL``; s3torchconnector, which has no
cache, is given that URL as its ``endpoint``). Per epoch: samples/s, the first
batch's wait (from asking for the epoch's iterator: the DataLoader workers' start included),
batch waits, and the GET requests and bytes the proxy served. The origin's own limit: N
threads of 8 MiB ranged GETs of tierfeed's chunk objects through the proxy, the best N (timed
from the first GET to the last, its client made before: no process start in it). Results: JSON
lines per epoch, a markdown table and a plot under ``--out``.
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
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench.compare import SYSTEMS, convert_all, plot, read_run  # noqa: E402
from bench.peers.common import origin_counters  # noqa: E402
from tierfeed.synth import SynthSpec, make_imagefolder  # noqa: E402

# s3torchconnector reads only from S3, so it is a peer here and not in compare.py's run through
# a slowed file system: registered beside the others for convert_all, read_run and plot.
SYSTEMS.setdefault("s3torchconnector", ("run_s3torch.py", "s3torchconnector"))
PEERS = ("tierfeed", "streaming", "litdata", "s3torchconnector")
BUCKET = "bench"
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError as exc:
            if getattr(exc, "code", None) is not None:  # an HTTP answer: the server is up
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up in {timeout:.0f} s") from None
            time.sleep(0.2)


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip


def upload_tree(endpoint: str, local: Path, prefix: str) -> int:
    """Every file under ``local`` to ``s3://BUCKET/prefix/...`` (straight to the server)."""
    s3 = s3_client(endpoint)
    files = [p for p in sorted(local.rglob("*")) if p.is_file()]

    def put(path: Path) -> None:
        s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local).as_posix()}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))
    return sum(p.stat().st_size for p in files)


def ranges_of(keys: list[tuple[str, int]], block: int = 8 * 2**20) -> list[tuple[str, int, int]]:
    """(key, offset, length) of every ``block`` bytes of the objects ``keys`` (key, size)."""
    return [(k, off, min(block, size - off)) for k, size in keys for off in range(0, size, block)]


def parallel_gets(s3: Any, work: list[tuple[str, int, int]], n: int) -> int:
    """The ranged GETs ``work`` (`ranges_of`) on ``n`` threads of the client ``s3``; bytes."""

    def get(item: tuple[str, int, int]) -> int:
        key, off, length = item
        rng = f"bytes={off}-{off + length - 1}"
        return len(s3.get_object(Bucket=BUCKET, Key=key, Range=rng)["Body"].read())

    with ThreadPoolExecutor(n) as pool:
        return sum(pool.map(get, work))


def origin_limit(proxy: str, keys: list[tuple[str, int]], samples: int,
                 widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> dict[str, Any]:  # fmt: skip
    """N threads of 8 MiB ranged GETs of ``keys`` through the proxy, for each N; the best."""
    work = ranges_of(keys)
    best: dict[str, Any] = {}
    probes: dict[int, float] = {}
    for n in widths:
        s3 = s3_client(proxy)
        before = origin_counters(proxy)
        started = time.perf_counter()
        total = parallel_gets(s3, work, n)
        seconds = time.perf_counter() - started
        probes[n] = round(total / seconds / 1e6, 1)
        if not best or probes[n] > best["MB_per_s"]:
            after = origin_counters(proxy)
            best = {"system": f"origin limit ({n} parallel 8 MiB GETs)",
                    "samples_per_s": round(samples / seconds, 1), "MB_per_s": probes[n],
                    "seconds": round(seconds, 3),
                    **{f"origin_{k}": after[k] - before[k] for k in after}}  # fmt: skip
    return dict(best, probes_MB_per_s=probes)


def render(result: dict[str, Any]) -> str:
    """Markdown: per system, the cold epoch (epoch 1) and the warm ones (median of the rest)."""
    lines = [
        "| system | epoch 1 samples/s | warm samples/s | first batch ms, epoch 1 | max wait "
        "ms, epoch 1 | GETs / MB, epoch 1 | HEADs, epoch 1 | GETs warm |",
        "|" + "---|" * 8,
    ]
    for system in dict.fromkeys(r["system"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["system"] == system]
        if "failed" in rows[0]:  # not run: the last line its process wrote says why
            reason = (rows[0]["failed"].strip().splitlines() or ["?"])[-1].replace("|", "/")
            lines.append(f"| {system} | not run: {reason} | | | | | | |")
            continue
        cold, warm = rows[0], rows[1:] or rows
        lines.append(
            f"| {system} | {cold['samples_per_s']:,.0f} | "
            f"{statistics.median(r['samples_per_s'] for r in warm):,.0f} | "
            f"{cold['first_batch_ms']:,.0f} | {cold['wait_max_ms']:,.0f} | "
            f"{cold['origin_reads']:,} / {cold['origin_bytes_read'] / 1e6:,.0f} | "
            f"{cold['origin_stats']:,} | {max(r['origin_reads'] for r in warm):,} |"
        )  # fmt: skip
    for limit in result["limits"]:
        lines.append(f"| {limit['system']} | {limit['samples_per_s']:,.0f} "
                     f"({limit['MB_per_s']:,.0f} MB/s) | | | | | | |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--median-kb", type=float, default=64.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--mbps", type=float, default=25.0, help="MB/s per response (one connection)")
    p.add_argument("--systems", default=",".join(PEERS), help=f"some of {','.join(PEERS)}")
    p.add_argument("--run-timeout", type=float, default=900)
    p.add_argument("--out", type=Path, default=Path("bench-out/s3"))
    p.add_argument("--work", type=Path, default=None, help="scratch directory")
    args = p.parse_args()
    unknown = set(args.systems.split(",")) - set(PEERS)
    if unknown:
        p.error(f"--systems: unknown {','.join(sorted(unknown))}; choose from {','.join(PEERS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        run(Path(tmp), args.systems.split(","), args)


def run(work: Path, systems: list[str], args: argparse.Namespace) -> None:
    origin, raw = work / "origin", work / "origin" / "raw"
    spec = SynthSpec(classes=20, per_class=args.images // 20, median_bytes=int(args.median_kb
                     * 1000), sigma=0.6, jpeg=True, seed=1)  # fmt: skip
    raw_bytes = make_imagefolder(raw, spec)
    samples = spec.classes * spec.per_class
    converted = convert_all(raw, origin, systems)
    config = f"s3 {args.latency_ms:g} ms, {args.mbps:g} MB/s per GET"
    result: dict[str, Any] = {
        "images": samples, "raw_bytes": raw_bytes, "epochs": args.epochs,
        "workers": args.workers, "batch": args.batch, "convert": converted,
        "latency_ms": args.latency_ms, "mbps_per_get": args.mbps,
        "machine": {"cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")},
        "rows": [], "limits": [],
    }  # fmt: skip
    port = free_port()
    moto = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(moto, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url_file = work / "proxy-url"
    proxy_process = None
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_up(endpoint)
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        for system in systems:
            name = SYSTEMS[system][1]
            if name is not None:
                upload_tree(endpoint, origin / name, name)
        proxy_process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3proxy", "--upstream", endpoint, "--latency-ms",
             str(args.latency_ms), "--mbps", str(args.mbps), "--url-file", str(url_file),
             "--serve", f"{BUCKET}={origin}", "--no-keep-alive"],
            cwd=ROOT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not url_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        proxy = url_file.read_text()
        chunks = [(f"tierfeed/{c.relative_to(origin / 'tierfeed').as_posix()}", c.stat().st_size)
                  for c in sorted((origin / "tierfeed" / "chunks").glob("*.tar"))]  # fmt: skip
        result["limits"].append(dict(origin_limit(proxy, chunks, samples), config=config))
        for system in systems:
            data = f"s3://{BUCKET}/{SYSTEMS[system][1]}"
            env = {**KEYS, "AWS_ENDPOINT_URL": proxy, "S3_ENDPOINT_URL": proxy}
            result["rows"] += read_run(system, data, proxy, work, raw_bytes * 4, args, config, env)
    finally:
        for process in (proxy_process, server):
            if process is not None:
                process.terminate()
                process.wait(timeout=10)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    table = render(result)
    (args.out / "table.md").write_text(table)
    print(table)
    plot(result, args.out / "compare.png")


if __name__ == "__main__":
    main()
