"""`tierfeed pack --part I/N` at scale: one pack against N parts packed at once and merged, and
the merge of many parts with the time to open the merged index; one JSON line per measurement,
then a markdown table.

    # one pack of a tree of small files against N parts run at once + `tierfeed merge`
    .venv/bin/python bench/pack_parts.py --work /tmp/tf-bench --tree 100000 --parts 1,2,4
    # only `tierfeed merge` of P parts of an S-sample store, and Index(DST) opens
    .venv/bin/python bench/pack_parts.py --work /tmp/tf-bench --merge-parts 1000 --samples 200000

--tree: a source tree of FILES files (class directories, sizes lognormal around --size bytes,
seeded) is made once and read once before anything is timed (page cache warm: the figures are
of packing, not of the source's storage). Each run packs it into a fresh destination with one
`tierfeed pack`, and for each N of --parts with N `tierfeed pack --part I/N` processes at once
followed by `tierfeed merge`; medians of --runs runs, interleaved. The first merged store of
each N is checked against the single pack (samples, members, bytes, keys and labels of a few
samples) so every figure is of a correct store.

--merge-parts: a tree of --samples files of --tiny-size bytes (default 1), packed in P parts;
only the merge is timed (--runs times: merging again rewrites the same index; the parts'
chunks are in the page cache, just written; the build is synced before the first merge, so
that no merge's fsync waits for the build's writeback: the time the sync took is printed).
The parts are made by the real `tierfeed.format.parts.pack_part`; with --build inproc
(default) the source is listed and fingerprinted once and that listing reused by every part,
in --jobs forked processes (the
listing is a pure function of the unchanged tree: each part's store is the one `tierfeed pack
--part` writes, without P walks of the whole tree), with --build cli each part is a real
`tierfeed pack SRC DST --part I/P` process (P walks of the tree). No index is written by
hand. The merged store is checked against a single pack of the same tree, and `Index(DST)`
is opened --opens times, each in a fresh process, for both (median of the open alone, the
interpreter and import not counted).

--build listed (for --samples in the millions: a tree of 10M files would take hours to make
here): the source is a listing of --samples names under 1,000 class directories, every one
read from one file of --tiny-size bytes. Each part's share is grouped and labelled by the real
`group_samples`, the listing fingerprinted by the real `source_fingerprint`, and each part
written by the real `write_store` with the record `pack_part` gives it (`pack_parts_listed`).
The merged store is checked by its names (every sample's key and label are those of the
listing at spread positions); `tierfeed merge --verify` (every chunk read again) is timed once.

    .venv/bin/python bench/pack_parts.py --work /tmp/tf-bench --merge-parts 1000 \
        --samples 10000000 --build listed --runs 5

--keep DIR builds the --merge-parts parts in DIR once and keeps them for the next runs (a
build of 10M samples is minutes); --phases then times one merge's phases in this process
(the parts opened with their full check, their shares, their chunks, the join, the index's
write), --runs times, each a JSON line:

    .venv/bin/python bench/pack_parts.py --merge-parts 1000 --samples 10000000 \
        --build listed --keep /tmp/tf-bench/kept --phases --runs 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TIERFEED = [sys.executable, "-m", "tierfeed"]
OPEN = (
    "import sys, time\n"
    "from tierfeed.format.index import Index\n"
    "t = time.perf_counter()\n"
    "ix = Index(sys.argv[1])\n"
    "n = ix.num_samples\n"
    "print(time.perf_counter() - t, n)\n"
    "ix.close()\n"
)


def machine() -> dict[str, Any]:
    """Cores, memory, load and date of this run."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpus": os.cpu_count(),
        "ram_gib": round(ram / 2**30, 1),
        "load1": round(os.getloadavg()[0], 2),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def make_tree(where: Path, files: int, classes: int, size: float, seed: int) -> int:
    """``files`` files under ``classes`` class directories (ImageFolder), sizes lognormal around
    ``size`` bytes (``size`` 0 or 1: every file that size); returns the bytes written."""
    rng = np.random.default_rng(seed)
    if size <= 1:
        sizes = np.full(files, int(size), dtype=np.int64)
    else:
        sizes = np.maximum(1, rng.lognormal(np.log(size), 0.5, files).astype(np.int64))
    pool = rng.bytes(int(sizes.max()) + (1 << 20))
    offsets = rng.integers(0, 1 << 20, files).tolist()
    classes = max(1, min(classes, files))
    dirs = [where / f"class-{c:05d}" for c in range(classes)]
    for d in dirs:
        d.mkdir(parents=True)
    view = memoryview(pool)
    for i, (n, at) in enumerate(zip(sizes.tolist(), offsets, strict=True)):
        with open(dirs[i * classes // files] / f"{i:08d}.bin", "wb") as f:
            f.write(view[at : at + n])
    return int(sizes.sum())


def read_tree(where: Path) -> float:
    """Read every file once (the page cache warm before timing); seconds taken."""
    started = time.perf_counter()
    for root, _, names in os.walk(where):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 20):
                    pass
    return time.perf_counter() - started


def tierfeed(*args: str) -> float:
    """Seconds one `tierfeed` command takes."""
    started = time.perf_counter()
    subprocess.run([*TIERFEED, *args, "-q"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def pack_single(src: Path, dst: Path) -> float:
    return tierfeed("pack", str(src), str(dst))


def pack_parts_cli(src: Path, dst: Path, count: int, jobs: int) -> float:
    """Seconds for ``count`` `tierfeed pack --part I/count` processes, ``jobs`` at once."""
    command = [*TIERFEED, "pack", str(src), str(dst), "-q"]
    started, running, todo = time.perf_counter(), [], list(range(count))
    while todo or running:
        while todo and len(running) < jobs:
            i = todo.pop(0)
            running.append(
                subprocess.Popen([*command, "--part", f"{i}/{count}"], stdout=subprocess.DEVNULL)
            )
        done = running.pop(0)
        if done.wait() != 0:
            raise SystemExit(f"a part of {count} failed")
    return time.perf_counter() - started


_BUILD: dict[str, Any] = {}


def _build_part(i: int) -> int:
    from tierfeed.format.parts import pack_part

    b = _BUILD
    return pack_part(b["src"], b["dst"], (i, b["count"]), b["options"]).samples


def pack_parts_inproc(src: Path, dst: Path, count: int, jobs: int) -> float:
    """Seconds to make the ``count`` parts with the real `pack_part`, the source listed and
    fingerprinted once (see the module), in ``jobs`` forked processes."""
    import tierfeed.format.parts as parts
    from tierfeed.format.pack import PackOptions

    started = time.perf_counter()
    options = PackOptions(progress=False)  # as `tierfeed pack -q`
    tree = parts.source_tree(src, dst, options, None)
    fingerprint = parts.source_fingerprint(tree, options)
    real_tree, real_fingerprint = parts.source_tree, parts.source_fingerprint

    def listed(s: Path, d: Path, o: Any, files: Path | None) -> Any:
        if (Path(s), Path(d), o, files) != (src, dst, options, None):
            raise SystemExit("the reused listing asked for another source")
        return tree

    def fingerprinted(t: Any, o: Any) -> str:
        if t is not tree or o != options:
            raise SystemExit("the reused fingerprint asked for another listing")
        return fingerprint

    parts.source_tree, parts.source_fingerprint = listed, fingerprinted
    _BUILD.update(src=src, dst=dst, count=count, options=options)
    try:
        if jobs <= 1:
            samples = [_build_part(i) for i in range(count)]
        else:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                samples = pool.map(_build_part, range(count), chunksize=max(1, count // jobs // 8))
    finally:
        parts.source_tree, parts.source_fingerprint = real_tree, real_fingerprint
        _BUILD.clear()
    if sum(samples) != len(tree.samples):
        raise SystemExit(f"the parts hold {sum(samples)} samples, the source {len(tree.samples)}")
    return time.perf_counter() - started


def _listed_files(one: Path, samples: range, total: int, classes: int) -> list[Any]:
    """The listing of samples ``samples`` of a --build listed source: file i is
    ``class-C/i.bin`` (C = i * classes // total), every one of them read from the file ``one``."""
    from tierfeed.format.source import SourceFile

    st = one.stat()
    where = os.fsencode(one)
    return [
        SourceFile(
            b"class-%05d/%08d.bin" % (i * classes // total, i),
            where,
            st.st_size,
            int(st.st_mtime),
            0o644,
            st.st_mtime_ns,
        )
        for i in samples
    ]


def _listed_tree(samples: range) -> Any:
    """The grouped, labelled samples ``samples`` of the --build listed source (`_BUILD`)."""
    from tierfeed.format.source import group_samples

    b = _BUILD
    files = _listed_files(b["one"], samples, b["total"], b["classes"])
    tree = group_samples(files, "auto", b["src"], "file", b["dirs"])
    tree.dirs = b["dirs"]
    return tree


def _build_listed_part(i: int) -> int:
    """Part i of the --build listed source, written as `pack_part` writes a part once it has
    its share (`tierfeed.format.parts`): the share's plan, the part's record, `write_store`."""
    from tierfeed.format.pack import write_store
    from tierfeed.format.packplan import plan_pack
    from tierfeed.format.parts import part_directory
    from tierfeed.format.storetarget import LocalDirectory, claimed

    b = _BUILD
    samples = b["shares"][i]
    share = _listed_tree(samples)
    directory = part_directory(b["dst"], i, b["count"])
    plan = plan_pack(share, b["options"].chunk_size)
    plan.part = {
        "index": i, "count": b["count"], "source": b["fingerprint"],
        "samples": [samples.start, samples.stop], "of": b["total"],
        "src": os.fsdecode(os.path.abspath(b["src"])),
    }  # fmt: skip
    target = LocalDirectory(directory, False, "--overwrite")
    target.check()
    with claimed(target, resume=True):
        return write_store(directory, plan, b["options"], share, time.perf_counter()).samples


def pack_parts_listed(src: Path, dst: Path, count: int, jobs: int, total: int) -> float:
    """Seconds to make ``count`` parts of a ``total``-sample source that is a listing rather
    than a tree (10M files would take hours to make here): ``total`` names under 1,000 class
    directories, every one read from the one file ``src/one.bin``. Each part's share is
    grouped and labelled by the real `group_samples` (the classes from the whole source's
    directories), the whole listing fingerprinted by the real `source_fingerprint`, and each
    part written by the real `write_store`, in ``jobs`` forked processes."""
    from tierfeed.format.pack import PackOptions
    from tierfeed.format.parts import part_samples, source_fingerprint
    from tierfeed.format.source import SourceDir, SourceTree

    started = time.perf_counter()
    options = PackOptions(progress=False)
    classes = 1000
    st = src.stat()
    dirs = [SourceDir(b"", 0o755, st.st_mtime_ns)]
    dirs += [SourceDir(b"class-%05d" % c, 0o755, st.st_mtime_ns) for c in range(classes)]
    _BUILD.update(
        one=src / "one.bin", src=src, dst=dst, count=count, options=options, total=total,
        classes=classes, dirs=dirs, shares=[part_samples(total, i, count) for i in range(count)],
    )  # fmt: skip

    class Listing:  # the whole source's samples, grouped a share at a time
        def __iter__(self) -> Any:
            for share in _BUILD["shares"]:
                yield from _listed_tree(share).samples

    whole = SourceTree(samples=Listing(), classes=[f"class-{c:05d}" for c in range(classes)])  # type: ignore[arg-type]
    whole.dirs = dirs
    _BUILD["fingerprint"] = source_fingerprint(whole, options)
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            samples = pool.map(
                _build_listed_part, range(count), chunksize=max(1, count // jobs // 8)
            )
    finally:
        _BUILD.clear()
    if sum(samples) != total:
        raise SystemExit(f"the parts hold {sum(samples)} samples, the source {total}")
    return time.perf_counter() - started


def check_listed(merged: Path, total: int) -> None:
    """The merged --build listed store holds every sample of the listing, in order: counts,
    and the key and label of spread samples; exits when not."""
    from tierfeed.format.index import Index

    with Index(merged) as ix:
        if ix.num_samples != total or len(ix.classes) != 1000:
            raise SystemExit(f"{merged}: {ix.num_samples} samples in {len(ix.classes)} classes")
        for s in sorted({0, total - 1, *range(0, total, max(1, total // 97))}):
            label = s * 1000 // total
            want = (b"class-%05d/%08d" % (label, s), label)
            got = (ix.key_bytes(s), int(ix.sample_label[s]))
            if got != want:
                raise SystemExit(f"{merged}: sample {s} is {got!r}, not {want!r}")


def check_same(single: Path, merged: Path) -> None:
    """The merged store holds the single pack's samples: counts, bytes, classes, and the keys
    and labels of a few samples (first, last, spread between); exits when not."""
    from tierfeed.format.index import Index

    with Index(single) as a, Index(merged) as b:
        facts = [
            ("samples", a.num_samples, b.num_samples),
            ("members", a.num_members, b.num_members),
            ("bytes", int(a.member_length.sum()), int(b.member_length.sum())),
            ("classes", list(a.classes), list(b.classes)),
        ]
        n = a.num_samples
        for s in sorted({0, n - 1, *range(0, n, max(1, n // 7))}):
            facts.append((f"key {s}", a.key_bytes(s), b.key_bytes(s)))
            facts.append((f"label {s}", int(a.sample_label[s]), int(b.sample_label[s])))
        if "parts" not in b.header["extra"]:
            raise SystemExit(f"{merged}: its index was not merged from parts")
    for what, want, got in facts:
        if want != got:
            raise SystemExit(f"{merged}: {what} is {got!r}, the single pack's {want!r}")


def open_seconds(store: Path, opens: int) -> float:
    """Median seconds of `Index(store)` alone, each in a fresh process."""
    times = []
    for _ in range(opens):
        out = subprocess.run(
            [sys.executable, "-c", OPEN, str(store)], check=True, capture_output=True, text=True
        ).stdout.split()
        times.append(float(out[0]))
    return statistics.median(times)


def emit(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def bench_tree(args: argparse.Namespace, work: Path, rows: list[dict[str, Any]]) -> None:
    src, counts = work / "tree", [int(c) for c in args.parts.split(",")]
    made = time.perf_counter()
    data = make_tree(src, args.tree, args.classes, args.size, args.seed)
    made = time.perf_counter() - made
    warm = read_tree(src)
    print(
        f"# tree: {args.tree} files, {data / 1e6:.1f} MB made in {made:.1f} s, "
        f"read once in {warm:.1f} s (page cache warm)",
        file=sys.stderr,
        flush=True,
    )
    single_s: list[float] = []
    parts_s: dict[int, list[float]] = {c: [] for c in counts}
    merge_s: dict[int, list[float]] = {c: [] for c in counts}
    reference = work / "single-ref"
    for run in range(args.runs):
        dst = reference if run == 0 else work / "single"
        single_s.append(pack_single(src, dst))
        if run:
            shutil.rmtree(dst)
        for count in counts:
            dst = work / f"parts-{count}"
            parts_s[count].append(pack_parts_cli(src, dst, count, count))
            merge_s[count].append(tierfeed("merge", str(dst)))
            if run == 0:
                check_same(reference, dst)
            shutil.rmtree(dst)
    base = statistics.median(single_s)
    common = {"mode": "tree", "files": args.tree, "bytes": data, "runs": args.runs}
    common |= {"page_cache": "warm", **machine()}
    emit(
        {
            **common,
            "what": "single pack",
            "parts": 0,
            "pack_s": median(single_s),
            "merge_s": 0.0,
            "total_s": median(single_s),
            "files_per_s": round(args.tree / base, 1),
            "speedup": 1.0,
            "pack_s_runs": [round(t, 3) for t in single_s],
        },
        rows,
    )
    for count in counts:
        totals = [p + m for p, m in zip(parts_s[count], merge_s[count], strict=True)]
        total = statistics.median(totals)
        emit(
            {
                **common,
                "what": "parts + merge",
                "parts": count,
                "pack_s": median(parts_s[count]),
                "merge_s": median(merge_s[count]),
                "total_s": median(totals),
                "files_per_s": round(args.tree / total, 1),
                "pack_files_per_s": round(args.tree / statistics.median(parts_s[count]), 1),
                "speedup": round(base / total, 2),
                "checked": True,
                "pack_s_runs": [round(t, 3) for t in parts_s[count]],
                "merge_s_runs": [round(t, 3) for t in merge_s[count]],
            },
            rows,
        )
    shutil.rmtree(reference)
    shutil.rmtree(src)


def build_merge(args: argparse.Namespace, work: Path) -> tuple[float, float]:
    """The --merge-parts parts under ``work`` (unless --keep holds them, built as asked):
    seconds to make the tree and to build the parts."""
    src, dst = work / "tiny-tree", work / "merged"
    made = time.perf_counter()
    if args.build == "listed":
        src.mkdir()
        (src / "one.bin").write_bytes(b"x" * args.tiny_size)
        built = pack_parts_listed(src, dst, args.merge_parts, args.jobs, args.samples)
        made = 0.0  # the listing is made with the parts
    else:
        make_tree(src, args.samples, args.classes, args.tiny_size, args.seed)
        made = time.perf_counter() - made
        read_tree(src)
        build: Callable[[Path, Path, int, int], float] = (
            pack_parts_cli if args.build == "cli" else pack_parts_inproc
        )
        built = build(src, dst, args.merge_parts, args.jobs)
    return made, built


def built_record(args: argparse.Namespace) -> dict[str, Any]:
    """What --merge-parts parts are built of (``built.json`` under --keep)."""
    return {"samples": args.samples, "parts": args.merge_parts, "build": args.build}


def kept(args: argparse.Namespace, work: Path) -> bool:
    """``work`` (--keep) holds the parts this run asks for, built before."""
    record = work / "built.json"
    return record.exists() and json.loads(record.read_text()) == built_record(args)


def merge_phases(dst: Path) -> dict[str, float]:
    """One merge of ``dst`` in this process, timed phase by phase: the parts opened with their
    full check, their shares checked, their chunks checked, the columns joined, the index
    written (the calls `tierfeed.format.merge.merge_parts` makes, in its order)."""
    from tqdm import tqdm

    from tierfeed.format import merge as m
    from tierfeed.format.mergecheck import in_order, verify_parts

    times: dict[str, float] = {}
    at = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal at
        now = time.perf_counter()
        times[name] = round(now - at, 3)
        at = now

    count = m._part_count(dst)
    with tqdm(total=count, disable=True) as bar:
        parts = in_order(lambda i: m._open_part(dst, i, count), count, bar, m.Index.close)
    lap("open")
    try:
        m._check_shares(parts, dst)
        lap("shares")
        verify_parts(parts, False, False)
        lap("verify")
        content = m._merged(parts)
        lap("join")
        m._write(dst, content, m._index_mode(parts), False)
        lap("write")
    finally:
        for ix in parts:
            ix.close()
    lap("close")
    times["total"] = round(sum(times.values()), 3)
    return times


def bench_merge(args: argparse.Namespace, work: Path, rows: list[dict[str, Any]]) -> None:
    from tierfeed.format.layout import INDEX_NAME

    src, dst, single = work / "tiny-tree", work / "merged", work / "tiny-single"
    if args.keep and kept(args, work):
        made, built = 0.0, 0.0
        print(f"# the parts kept in {work} (--keep)", file=sys.stderr, flush=True)
    else:
        made, built = build_merge(args, work)
        if args.keep:
            (work / "built.json").write_text(json.dumps(built_record(args)))
    synced = time.perf_counter()
    os.sync()  # the parts' bytes on disk first: a merge's fsync is not to flush the build's
    synced = time.perf_counter() - synced
    print(
        f"# {args.samples} files of {args.tiny_size} B made in {made:.1f} s; "
        f"{args.merge_parts} parts built ({args.build}) in {built:.1f} s, synced in "
        f"{synced:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    if args.phases:
        for run in range(args.runs):
            print(json.dumps({"what": "merge phases", "run": run, **merge_phases(dst)}), flush=True)
        return
    merges = [tierfeed("merge", str(dst)) for _ in range(args.runs)]
    if args.build == "listed":  # no tree to pack in one: the listing's names are checked
        single = dst
        single_s = 0.0
        check_listed(dst, args.samples)
        verified = tierfeed("merge", str(dst), "--verify")
    else:
        single_s = pack_single(src, single)
        check_same(single, dst)
        verified = 0.0
    common = {"mode": "merge", "samples": args.samples, "parts": args.merge_parts}
    common |= {"build": args.build, "page_cache": "warm", **machine()}
    emit(
        {
            **common,
            "what": "merge",
            "merge_s": median(merges),
            "samples_per_s": round(args.samples / statistics.median(merges), 1),
            "build_s": round(built, 3),
            "checked": True,
            "merge_s_runs": [round(t, 3) for t in merges],
            "merge_verify_s": round(verified, 3),
        },
        rows,
    )
    stores = [("open merged index", dst)]
    stores += [] if single == dst else [("open single pack's index", single)]
    for what, store in stores:
        row = {
            **common,
            "what": what,
            "open_s": round(open_seconds(store, args.opens), 5),
            "opens": args.opens,
            "index_bytes": (store / INDEX_NAME).stat().st_size,
        }
        if what.startswith("open single"):
            row["parts"], row["pack_s"] = 0, round(single_s, 3)
        emit(row, rows)
    if not args.keep:
        for path in {dst, single, src}:
            shutil.rmtree(path)


def table(rows: list[dict[str, Any]]) -> str:
    columns = [
        "mode",
        "what",
        "parts",
        "files",
        "samples",
        "pack_s",
        "merge_s",
        "total_s",
        "files_per_s",
        "speedup",
        "open_s",
    ]
    used = [c for c in columns if any(c in r for r in rows)]
    lines = ["| " + " | ".join(used) + " |", "|" + "---|" * len(used)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in used) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=tempfile.gettempdir(), help="where the tmp dir goes")
    ap.add_argument("--tree", type=int, help="files of the tree to pack (default 100000)")
    ap.add_argument("--parts", default="1,2,4", help="part counts N to pack the tree in")
    ap.add_argument("--size", type=float, default=2048, help="median file size (lognormal)")
    ap.add_argument("--classes", type=int, default=1000, help="class directories")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3, help="runs of each timing (median)")
    ap.add_argument("--merge-parts", type=int, help="P: time the merge of P parts")
    ap.add_argument("--samples", type=int, default=200_000, help="S: samples of the P parts")
    ap.add_argument("--tiny-size", type=int, default=1, help="bytes of each of the S files")
    ap.add_argument("--build", choices=("inproc", "cli", "listed"), default="inproc")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parts built at once")
    ap.add_argument("--opens", type=int, default=5, help="Index(DST) opens (fresh processes)")
    ap.add_argument(
        "--keep",
        help="--merge-parts: build the parts in this directory once "
        "and keep them there for the next runs (built.json says what they are)",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="--merge-parts: time the merge's phases in this process (--runs times), nothing else",
    )
    args = ap.parse_args()
    if args.tree is None and args.merge_parts is None:
        args.tree = 100_000
    Path(args.work).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pack-parts-", dir=args.work))
    rows: list[dict[str, Any]] = []
    try:
        if args.tree is not None:
            bench_tree(args, work, rows)
        if args.merge_parts is not None:
            kept_in = Path(args.keep) if args.keep else work
            kept_in.mkdir(parents=True, exist_ok=True)
            bench_merge(args, kept_in, rows)
    finally:
        shutil.rmtree(work)
    if rows:  # (--phases prints its own lines)
        print(table(rows))


if __name__ == "__main__":
    main()
