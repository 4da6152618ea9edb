"""The cold epoch from a slowed S3 endpoint, request by request: when the GETs go out, how
many are in flight, the bytes/s the proxy sends, when batches come.

Generates `bench/s3_compare.py`'s data (``--images`` JPEGs, tierfeed `pack`, 64 MiB chunks),
starts moto's server (its own process) and the slowing proxy (`tests/s3proxy.py`) in this
process, with every GET's start, end and bytes recorded; then runs one cold epoch of tierfeed
(2 DataLoader workers, batch 64, the global plan, an empty disk tier with room for all) in a
child process that writes the wall-clock time of its start, its first iteration and every
batch. Times are from the child's start (its imports, the Dataset, the workers' start
included), in ms. Per run also the CPU seconds each process used in the epoch (the Loader's
process and each worker, from /proc; the proxy's, this process's, over the child's run), and
the same per GB the proxy sent for the epoch (``cpu_s_per_GB``): a figure that holds across
machines where samples/s do not. ``--clients obstore,botocore`` alternates the runs between
the S3 clients that receive (``TIERFEED_S3_CLIENT``: obstore's, `tierfeed.storage.nativeranges`,
and botocore's, the default).

``--row`` also times the origin-limit row of `bench/s3_compare.py` once (N = 32 threads of
8 MiB ranged GETs of the chunk objects through the same proxy, boto3, in a child process;
then the same through obstore, the client alone): its
seconds from the first GET to the last, the CPU seconds its process used (and per GB) and the
proxy's. On a machine of few cores the cold epoch's share of the row is bounded by the CPU
both need.

Usage (in the benchmark environment, or any with moto, s3fs and torch):
    python bench/s3_trace.py [--images 2000] [--latency-ms 20] [--mbps 25] [--runs 1]
        [--requests] [--row] [--clients obstore,botocore]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

BUCKET = "bench"
_BIN_S = 0.1


def child(prefix: str, cache: str, marks: str, workers: int) -> None:
    """One cold epoch with wall-clock marks (run as ``--child``; the store at ``prefix``)."""
    started = time.time()
    import torch

    from bench.peers.run_tierfeed import length_and_label
    from tierfeed.torch import Dataset, Loader, TierConfig

    torch.set_num_threads(1)
    out = {"start": started, "batches": []}
    tiers = TierConfig(disk_dir=cache)
    ds = Dataset(prefix, "global", batch_size=64, decode=length_and_label, tiers=tiers)
    with Loader(ds, num_workers=workers) as loader:
        before = cpu_seconds()
        out["iter"] = time.time()
        for _ in loader:
            out["batches"].append(time.time())
        out["end"] = time.time()
        after = cpu_seconds()  # the workers are still alive
        used = {pid: round(s - before.get(pid, 0.0), 3) for pid, s in after.items()}
        out["cpu_s"] = {"main": used.pop(os.getpid(), 0.0), "workers": sorted(used.values())}
        out["tiers"] = (loader.last_epoch or {}).get("tiers", {})
    Path(marks).write_text(json.dumps(out))


def cpu_seconds() -> dict[int, float]:
    """CPU seconds (user and system) so far of this process and each of its children."""
    me, tick = os.getpid(), os.sysconf("SC_CLK_TCK")
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(name) == me or int(fields[1]) == me:  # fields[1]: the parent's pid
            out[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def row_child(endpoint: str, keys: str, out: str, client: str = "boto3") -> None:
    """The origin-limit row once (run as ``--row-child``): 32 threads of 8 MiB ranged GETs,
    through boto3 (the row of `bench/s3_compare.py`) or obstore (the client alone, no driver)."""
    from bench.s3_compare import parallel_gets, ranges_of, s3_client

    work = ranges_of([(key, size) for key, size in json.loads(keys)])
    if client == "obstore":
        gets = obstore_gets(endpoint)
        gets(work[:1])  # its client made, as boto3's is before the clock starts
    else:
        s3 = s3_client(endpoint)
        gets = lambda w: parallel_gets(s3, w, 32)  # noqa: E731
    cpu0, started = time.process_time(), time.perf_counter()
    total = gets(work)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    result = {"s": round(seconds, 3), "MB": round(total / 1e6, 1), "cpu_s": round(cpu, 3),
              "cpu_s_per_GB": round(cpu / (total / 1e9), 2)}  # fmt: skip
    Path(out).write_text(json.dumps(result))


def obstore_gets(endpoint: str) -> Any:
    """The row's GETs through obstore: 32 threads of ``obstore.get_range``; bytes."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1", access_key_id="testing",
                    secret_access_key="testing", client_options={"allow_http": True})  # fmt: skip

    def get(item: tuple[str, int, int]) -> int:
        key, off, length = item
        return len(obstore.get_range(store, key, start=off, length=length))

    def run(work: list[tuple[str, int, int]]) -> int:
        with ThreadPoolExecutor(32) as pool:
            return sum(pool.map(get, work))

    return run


def traced_proxy(upstream: str, latency_s: float, bps: float, root: Path) -> Any:
    """The slowing proxy, started here, each GET's (start, end, bytes) in ``proxy.gets``."""
    from tests import s3proxy

    proxy = s3proxy.S3Proxy(upstream, latency_s, bps, {BUCKET: root}, keep_alive=False)
    proxy.gets = []
    proxy.log = []
    lock = threading.Lock()
    serve = s3proxy._Handler._serve

    def timed(handler: Any) -> None:
        begun = time.time()
        serve(handler)
        if handler.command != "GET" or "/chunks/" not in handler.path:
            with lock:
                proxy.log.append((begun, time.time(), handler.path.rsplit("/", 1)[-1],
                                  handler.command))  # fmt: skip
        spec = handler.headers.get("Range", "")
        if handler.command == "GET" and "/chunks/" in handler.path and spec.startswith("bytes="):
            first, _, last = spec[6:].partition("-")
            with lock:
                proxy.gets.append((begun, time.time(), int(last) + 1 - int(first)))
                proxy.log.append((begun, time.time(), handler.path.rsplit("/", 1)[-1], spec))

    s3proxy._Handler._serve = timed
    s3proxy._Handler.do_GET = s3proxy._Handler.do_HEAD = timed
    return proxy.start()


def timeline(gets: list[tuple[float, float, int]], marks: dict[str, Any]) -> dict[str, Any]:
    """Milestones (ms from the child's start), GETs in flight and MB/s per 100 ms."""
    t0 = marks["start"]
    ms = lambda t: round((t - t0) * 1e3)  # noqa: E731
    batches = marks["batches"]
    end = max([marks["end"], *(e for _, e, _ in gets)])
    bins = int((end - t0) / _BIN_S) + 1
    inflight = [0.0] * bins
    sent = [0.0] * bins
    for s, e, n in gets:
        for b in range(int((s - t0) / _BIN_S), int((e - t0) / _BIN_S) + 1):
            lo, hi = max(s, t0 + b * _BIN_S), min(e, t0 + (b + 1) * _BIN_S)
            if hi > lo:
                inflight[b] += (hi - lo) / _BIN_S
                sent[b] += n * (hi - lo) / max(e - s, 1e-9) / _BIN_S / 1e6
    count = [0] * bins
    for x in batches:
        count[min(bins - 1, int((x - t0) / _BIN_S))] += 1
    return {
        "iter_ms": ms(marks["iter"]),
        "first_get_ms": ms(min(s for s, _, _ in gets)) if gets else None,
        "last_get_end_ms": ms(max(e for _, e, _ in gets)) if gets else None,
        "first_batch_ms": ms(batches[0]) if batches else None,
        "end_ms": ms(marks["end"]),
        "gets": len(gets),
        "get_MB": round(sum(n for _, _, n in gets) / 1e6, 1),
        "get_sizes_MiB": sorted({round(n / 2**20, 2) for _, _, n in gets}),
        "max_inflight": max((sum(s <= t < e for s, e, _ in gets) for t, _, _ in gets), default=0),
        "per_100ms": [
            {
                "t_ms": round(b * _BIN_S * 1e3),
                "inflight": round(inflight[b], 1),
                "MB_s": round(sent[b], 1),
                "batches": count[b],
            }
            for b in range(bins)
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--mbps", type=float, default=25.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--requests", action="store_true", help="list every chunk GET too")
    p.add_argument("--row", action="store_true", help="time the origin-limit row once too")
    p.add_argument("--clients", default="default",
                   help="comma-separated S3 clients to alternate (obstore, botocore)")  # fmt: skip
    p.add_argument("--child", nargs=3, metavar=("PREFIX", "CACHE", "MARKS"))
    p.add_argument("--row-child", nargs=4, metavar=("ENDPOINT", "KEYS", "OUT", "CLIENT"))
    a = p.parse_args()
    if a.child:
        child(*a.child, a.workers)
        return
    if a.row_child:
        row_child(*a.row_child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for line in trace(Path(tmp), a):
            print(json.dumps(line), flush=True)


def trace(work: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.s3_compare import KEYS, free_port, s3_client, upload_tree, wait_up
    from tierfeed.format.pack import PackOptions, pack
    from tierfeed.synth import SynthSpec, make_imagefolder

    spec = SynthSpec(classes=20, per_class=a.images // 20, median_bytes=64000, sigma=0.6,
                     jpeg=True, seed=1)  # fmt: skip
    make_imagefolder(work / "raw", spec)
    pack(work / "raw", work / "origin" / "tierfeed", PackOptions(chunk_size=64 * 2**20,
         progress=False))  # fmt: skip
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = []
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_up(endpoint)
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        upload_tree(endpoint, work / "origin" / "tierfeed", "tierfeed")
        proxy = traced_proxy(endpoint, a.latency_ms / 1e3, a.mbps * 1e6, work / "origin")
        env = dict(os.environ, **KEYS, AWS_ENDPOINT_URL=proxy.url)
        runs = [(run, c) for run in range(a.runs) for c in a.clients.split(",")]
        for run, client in runs:
            proxy.gets.clear()
            proxy.log.clear()
            with tempfile.TemporaryDirectory(dir=work) as cache:
                marks = work / "marks.json"
                argv = [sys.executable, __file__, "--workers", str(a.workers), "--child",
                        f"s3://{BUCKET}/tierfeed", cache, str(marks)]  # fmt: skip
                chosen = {"TIERFEED_S3_CLIENT": client} if client != "default" else {}
                proxy_cpu = time.process_time()
                subprocess.run(argv, check=True, timeout=600, env=dict(env, **chosen))
                proxy_cpu = time.process_time() - proxy_cpu
                marked = json.loads(marks.read_text())
                line = timeline(list(proxy.gets), marked)
                line["fetch"] = marked.get("tiers", {}).get("fetch", {})  # the epoch's counters
                line["cpu_s"] = dict(marked["cpu_s"], proxy=round(proxy_cpu, 3))
                line["cpu_s_per_GB"] = per_gb(marked["cpu_s"], line["get_MB"])
                if a.requests:
                    t0 = marked["start"]
                    line["requests"] = [(round((s - t0) * 1e3), round((e - t0) * 1e3), k, r)
                                        for s, e, k, r in sorted(proxy.log)]  # fmt: skip
                out.append(dict(run=run, client=client, **line))
        if a.row:
            for client in ("boto3", "obstore"):
                row = origin_row(proxy.url, work / "origin" / "tierfeed", env, work, client)
                out.append({"row": dict(row, client=client)})
        proxy.stop()
    finally:
        server.terminate()
        server.wait(timeout=10)
    return out


def per_gb(cpu_s: dict[str, Any], mb: float) -> dict[str, Any]:
    """The epoch's CPU seconds per GB received: the Loader's process, each worker, all."""
    gb = max(mb, 1e-9) / 1e3
    workers = [round(w / gb, 2) for w in cpu_s["workers"]]
    whole = (cpu_s["main"] + sum(cpu_s["workers"])) / gb
    return {"main": round(cpu_s["main"] / gb, 2), "workers": workers, "all": round(whole, 2)}


def origin_row(
    url: str, store: Path, env: dict[str, str], work: Path, client: str = "boto3"
) -> dict[str, Any]:
    """The origin-limit row once, in a child process; with the proxy's CPU seconds meanwhile."""
    chunks = sorted((store / "chunks").iterdir())
    keys = [(f"tierfeed/chunks/{c.name}", c.stat().st_size) for c in chunks]
    out = work / "row.json"
    argv = [sys.executable, __file__, "--row-child", url, json.dumps(keys), str(out), client]
    proxy_cpu = time.process_time()
    subprocess.run(argv, check=True, timeout=600, env=env)
    row = json.loads(out.read_text())
    row["proxy_cpu_s"] = round(time.process_time() - proxy_cpu, 3)
    return dict(row)


if __name__ == "__main__":
    main()
