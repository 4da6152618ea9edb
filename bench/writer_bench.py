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
index before it returns; the peers leave their data in the page cache (the ``-nosync`` variants
measure tierfeed without its fsyncs). A peer that cannot be imported is skipped with a message
saying why.

With ``--tree DIR`` every system writes the files of an ImageFolder tree instead (each file a
sample: its path without the extension as key, its bytes as ``jpg``, its class directory's
number as ``cls``), listing and reading them inside the timed part; ``tierfeed-pack`` packs the
tree and ``tar-cf`` runs ``tar -cf`` over it (``tar-cf-sync`` then syncs the archive). Ratios
are of seconds within one run (the peer's over tierfeed's), so both saw the same load:
    .venv-bench/bin/python bench/writer_bench.py --tree /tmp/jpegs --runs 3
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
# With --tree: the same systems over the files of a tree, plus `tierfeed pack` and `tar -cf`.
TREE_SYSTEMS = ("tierfeed-pack", *SYSTEMS, "tar-cf")
# Not run by default: the Writer with tarfile's header building, what it used before the fast
# path of `tarchunk.member_header` (`--systems tierfeed-writer tierfeed-writer-tarfile`), and
# tierfeed without any fsync (`-nosync`: `os.fsync` made a no-op in the child, as the peers
# leave their data in the page cache), and `tierfeed pack` as a whole command (`-cli`: a new
# interpreter, its imports included, as `tar-cf` is a whole command).
EXTRA = (
    "tierfeed-writer-tarfile",
    "tierfeed-writer-nosync",
    "tierfeed-optimize-nosync",
    "tierfeed-pack-nosync",
    "tar-cf-sync",
    "tierfeed-pack-cli",
)
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


def _tree_files(tree: Path) -> list[Path]:
    """The files under ``tree``, sorted (listed inside the timed part, as pack lists them)."""
    found = []
    for top, dirs, names in os.walk(tree):
        dirs.sort()
        found.extend(Path(top) / name for name in sorted(names))
    return found


def _file_sample(path: Path, tree: Path) -> dict[str, Any]:
    """A file of an ImageFolder tree as a sample: its relative path, its bytes, its class."""
    rel = path.relative_to(tree)
    return {"__key__": str(rel.with_suffix("")), "jpg": path.read_bytes(), "cls": _class_of(rel)}


def _class_of(rel: Path) -> int:
    digits = "".join(c for c in rel.parts[0] if c.isdigit())
    return int(digits) if digits else 0


def _file_sample_of(args: tuple[str, str]) -> dict[str, Any]:
    """An optimize fn: the sample of (file, tree)."""
    return _file_sample(Path(args[0]), Path(args[1]))


def _litdata_file_sample(args: tuple[str, str]) -> dict[str, Any]:
    s = _file_sample_of(args)
    return {"key": s["__key__"], "jpg": s["jpg"], "cls": s["cls"]}


def _tree_inputs(tree: Path) -> tuple[list[tuple[str, str]], Any, Any, Any]:
    """The optimize inputs, optimize fns and a sample iterator of the files under ``tree``."""
    inputs = [(str(f), str(tree)) for f in _tree_files(tree)]
    samples = (_file_sample_of(i) for i in inputs)
    return inputs, _file_sample_of, _litdata_file_sample, samples


def _write(
    system: str, n: int, size: int, out: Path, workers: int, tree: Path | None, readers: int = 0
) -> None:
    """Write the ``n`` samples (or ``tree``'s files) with ``system`` into ``out`` (timed)."""
    if system.endswith("-nosync"):
        os.fsync = lambda fd: None  # what the peers do: leave the data in the page cache
        system = system.removesuffix("-nosync")
    if system.startswith("tar-cf"):
        assert tree is not None, "tar-cf needs --tree"
        out.mkdir(parents=True)
        subprocess.run(["tar", "-cf", str(out / "all.tar"), "-C", str(tree.parent), tree.name],
                       check=True)  # fmt: skip
        if system == "tar-cf-sync":
            subprocess.run(["sync", str(out / "all.tar")], check=True)
        return
    if system == "tierfeed-pack-cli":
        assert tree is not None, "tierfeed-pack-cli needs --tree"
        cli = "import sys; from tierfeed.cli import main; sys.exit(main())"
        cmd = [sys.executable, "-c", cli, "pack", str(tree), str(out), "--quiet",
               "--chunk-size", str(_CHUNK_BYTES)]  # fmt: skip
        if readers:
            cmd += ["--workers", str(readers)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return
    if system == "tierfeed-pack":
        from tierfeed.format.pack import PackOptions, pack

        assert tree is not None, "tierfeed-pack needs --tree"
        readers = readers or PackOptions.workers
        pack(tree, out, PackOptions(chunk_size=_CHUNK_BYTES, workers=readers, progress=False))
        return
    if tree is None:
        inputs: list[Any] = [(i, size) for i in range(n)]
        fn, lit_fn, samples = _sample_of, _litdata_sample, (make_sample(i, size) for i in range(n))
    else:
        inputs, fn, lit_fn, samples = _tree_inputs(tree)
    if system.startswith("tierfeed-writer"):
        import tierfeed
        import tierfeed.format.chunksink as chunksink

        if system == "tierfeed-writer-tarfile":
            from tierfeed.format.tarchunk import _tarfile_header

            chunksink.member_header = lambda path, size: _tarfile_header(path, size, 0, 0o644)  # type: ignore[assignment]

        with tierfeed.Writer(out, chunk_size=_CHUNK_BYTES) as w:
            for sample in samples:
                w.write(sample)
    elif system == "tierfeed-optimize":
        import tierfeed

        tierfeed.optimize(fn, inputs, out, workers=workers, chunk_size=_CHUNK_BYTES)
    elif system == "mds-writer":
        from streaming import MDSWriter

        columns = {"key": "str", "jpg": "bytes", "cls": "int"}
        with MDSWriter(out=str(out), columns=columns, size_limit=_CHUNK_BYTES) as mds:
            for s in samples:
                mds.write({"key": s["__key__"], "jpg": s["jpg"], "cls": s["cls"]})
    elif system == "wds-shardwriter":
        import webdataset as wds

        out.mkdir(parents=True)
        with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=_CHUNK_BYTES, verbose=0) as sink:
            for s in samples:
                sink.write(s)
    elif system == "litdata":
        import litdata

        litdata.optimize(
            fn=lit_fn,
            inputs=inputs,
            output_dir=str(out),
            chunk_bytes=_CHUNK_BYTES,
            num_workers=workers,
            verbose=False,
        )
    else:
        raise SystemExit(f"unknown system {system!r}; one of {', '.join(SYSTEMS + EXTRA)}")


def child(
    system: str, n: int, size: int, out: Path, workers: int, tree: Path | None, readers: int
) -> None:
    """One timed write in this process; prints a JSON line."""
    _blob()  # built before the clock starts, as every system's input
    importlib.import_module(_PEER_MODULE.get(system, "tierfeed"))  # imports are not timed
    if system.startswith("tierfeed"):
        import tierfeed.format.pack  # noqa: F401  (pack's modules too: not timed)
    started = time.perf_counter()
    _write(system, n, size, out, workers, tree, readers)
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


def _args() -> argparse.Namespace:
    choices = TREE_SYSTEMS + EXTRA
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--bytes", type=int, default=10240, help="mean data bytes per sample")
    p.add_argument("--tree", type=Path, default=None,
                   help="write the files of this ImageFolder tree instead")  # fmt: skip
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="processes of the optimize calls")
    p.add_argument("--pack-readers", type=int, default=0,
                   help="tierfeed-pack's reader threads (default: PackOptions')")  # fmt: skip
    p.add_argument("--systems", nargs="+", default=None, choices=choices)
    p.add_argument(
        "--workdir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    p.add_argument("--child", choices=choices, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.systems is None:
        a.systems = list(TREE_SYSTEMS if a.tree else SYSTEMS)
    return a


def _run_all(
    a: argparse.Namespace, systems: list[str]
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Every system once per run, alternating; the seconds of each and its bytes written."""
    work = Path(tempfile.mkdtemp(prefix="tierfeed-writer-bench-", dir=a.workdir))
    times: dict[str, list[float]] = {s: [] for s in systems}
    sizes: dict[str, int] = {}
    tree = ["--tree", str(a.tree.resolve())] if a.tree else []
    try:
        for run in range(a.runs):
            for system in systems:
                out = work / f"{system}-{run}"
                cmd = [sys.executable, __file__, "--child", system, "--out", str(out),
                       "--samples", str(a.samples), "--bytes", str(a.bytes),
                       "--workers", str(a.workers),
                       "--pack-readers", str(a.pack_readers), *tree]  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode:
                    raise SystemExit(f"{system} failed:\n{done.stderr[-4000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                times[system].append(result["seconds"])
                sizes[system] = result["bytes"]
                print(f"run {run} {system}: {result['seconds']:.3f} s", file=sys.stderr)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return times, sizes


def _report(a: argparse.Namespace, times: dict[str, list[float]], sizes: dict[str, int]) -> None:
    if a.tree:
        files = _tree_files(a.tree)
        n, data = len(files), sum(f.stat().st_size for f in files)
        what = f"{n} files, {data:,} B under {a.tree}"
    else:
        n, data = a.samples, a.samples * a.bytes
        what = f"{n} samples x ~{a.bytes} B"
    print(f"{what}, {a.runs} runs, optimize workers {a.workers}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}")  # fmt: skip
    print("| system | processes | samples/s (median) | MB/s | runs (s) | bytes written |")
    print("|---|---|---|---|---|---|")
    for system, seconds in times.items():
        median = statistics.median(seconds)
        procs = a.workers if "optimize" in system or system == "litdata" else 1
        runs = ", ".join(f"{t:.2f}" for t in seconds)
        print(f"| {system} | {procs} | {n / median:,.0f} | {data / median / 1e6:.0f} | {runs} | "
              f"{sizes[system]:,} |")  # fmt: skip
    peers = [s for s in times if not s.startswith("tierfeed")]
    print("\nspeed ratios, same run (peer's seconds / tierfeed's), per run and median:")
    for mine in (s for s in times if s.startswith("tierfeed")):
        for peer in peers:
            ratios = [p / t for p, t in zip(times[peer], times[mine], strict=True)]
            listed = ", ".join(f"{r:.2f}" for r in ratios)
            print(f"- {mine} / {peer}: {listed}; median {statistics.median(ratios):.2f}x")


def main() -> None:
    a = _args()
    if a.child:
        child(a.child, a.samples, a.bytes, a.out, a.workers, a.tree, a.pack_readers)
        return
    systems = []
    for system in a.systems:
        why = available(system)
        if why:
            print(f"skipping {system}: {why}", file=sys.stderr)
        else:
            systems.append(system)
    times, sizes = _run_all(a, systems)
    _report(a, times, sizes)


if __name__ == "__main__":
    main()
