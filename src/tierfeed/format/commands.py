"""CLI subcommands of the format: pack, index, inspect, verify."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.format.pack import PackOptions, pack
from tierfeed.format.shards import index_shards
from tierfeed.format.verify import summarize, verify_store
from tierfeed.units import human, parse_size

__all__ = ["register_index", "register_inspect", "register_pack", "register_verify"]

Sub = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _print_skipped(skipped: list[tuple[str, str]]) -> None:
    if skipped:
        print(f"skipped {len(skipped)}:", file=sys.stderr)
        for path, reason in skipped:
            print(f"  {path}: {reason}", file=sys.stderr)


def _size(text: str) -> int:
    """An argparse type: a bad size is a usage error (exit 2), in parse_size's words."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_pack(args: argparse.Namespace) -> int:
    options = PackOptions(
        chunk_size=args.chunk_size,
        workers=args.workers,
        labels=args.labels,
        group_by=args.group_by,
        skip_unreadable=args.skip_unreadable,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    report = pack(args.src, args.dst, options, files=args.files)
    _print_skipped(report.skipped)
    rate = report.data_bytes / max(report.seconds, 1e-9)
    resumed = f", {report.resumed_chunks} kept from an earlier run" if report.resumed_chunks else ""
    print(
        f"packed {report.samples} samples ({report.members} files, {human(report.data_bytes)}) "
        f"into {report.chunks} chunks{resumed} in {report.seconds:.1f} s ({human(rate)}/s) "
        f"-> {report.store}"
    )
    if report.unlabelled:
        print(
            f"{report.unlabelled} sample{'s lie' if report.unlabelled > 1 else ' lies'} outside "
            f"the {report.classes} class directories (at the top level): label -1",
            file=sys.stderr,
        )
    return 0


def register_pack(sub: Any) -> None:
    """Add `tierfeed pack`."""
    p = sub.add_parser("pack", help="pack a directory tree into tar chunks and an index")
    p.add_argument("src", help="source directory (ImageFolder layout gives labels)")
    p.add_argument("dst", help="store directory to create")
    p.add_argument(
        "--chunk-size", type=_size, default="64MiB", help="target chunk size (default 64MiB)"
    )
    p.add_argument("--workers", type=int, default=8, help="parallel file readers (default 8)")
    p.add_argument("--files", help="pack the paths listed in this file (relative to SRC)")
    p.add_argument(
        "--labels",
        choices=["auto", "folder", "none"],
        default="auto",
        help="auto: ImageFolder classes from the top-level directories (default); folder: "
        "every file lies in a class directory; none: no labels",
    )
    p.add_argument(
        "--group-by",
        choices=["file", "key"],
        default="file",
        help="file: each file is a sample (default); key: files sharing the path up to the "
        "first dot of their name are one sample (WebDataset's rule)",
    )
    p.add_argument("--skip-unreadable", action="store_true", help="skip and list unreadable files")
    p.add_argument("--overwrite", action="store_true", help="replace a store already at DST")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_pack)


def _run_index(args: argparse.Namespace) -> int:
    report = index_shards(
        args.shards,
        args.out,
        args.labels,
        args.skip_bad_names,
        progress=not args.quiet,
        classes=args.classes,
    )
    _print_skipped(report.skipped)
    print(
        f"indexed {report.samples} samples ({report.members} members, "
        f"{human(report.data_bytes)}) in {report.chunks} shards -> {report.index}"
    )
    return 0


def register_index(sub: Any) -> None:
    """Add `tierfeed index`."""
    p = sub.add_parser("index", help="index existing tar shards in place")
    p.add_argument("shards", nargs="+", help="uncompressed .tar shards inside --out")
    p.add_argument("--out", required=True, help="store directory holding the shards")
    p.add_argument(
        "--labels",
        choices=["auto", "cls", "folder", "none"],
        default="auto",
        help="auto (default): from .cls members (integer text; .cls2 if no .cls) when samples "
        "have them, else classes from the top-level directories of the member names, as for "
        "pack; cls: every sample needs a .cls",
    )
    p.add_argument(
        "--classes",
        metavar="FILE",
        help="names of the .cls classes, one per line (line i names class i); "
        "default '0', '1', ...",
    )
    p.add_argument("--skip-bad-names", action="store_true", help="skip and count unsafe names")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_index)


def _run_inspect(args: argparse.Namespace) -> int:
    s = summarize(args.store)
    print(f"store     {args.store}")
    print(f"samples   {s.samples}")
    print(f"files     {s.members}")
    mean_chunk = human(s.chunk_bytes / max(s.chunks, 1))
    print(f"chunks    {s.chunks} ({human(s.chunk_bytes)}, mean {mean_chunk})")
    print(
        f"data      {human(s.data_bytes)} (mean sample {human(s.data_bytes / max(s.samples, 1))})"
    )
    shown = ", ".join(s.classes[:8]) + (", ..." if len(s.classes) > 8 else "")
    print(f"classes   {len(s.classes)}" + (f" ({shown})" if s.classes else ""))
    print("exts      " + ", ".join(f"{e or '(none)'}: {n}" for e, n in s.exts.items()))
    print("sample sizes:")
    peak = max((c for _, c in s.size_histogram), default=1)
    for bound, count in s.size_histogram:
        bar = "#" * max(1, round(40 * count / peak))
        print(f"  <= {human(bound):>10}  {count:>10}  {bar}")
    return 0


def register_inspect(sub: Any) -> None:
    """Add `tierfeed inspect`."""
    p = sub.add_parser("inspect", help="summarise a store: samples, chunks, classes, sizes")
    p.add_argument("store", help="store directory or index file")
    p.set_defaults(func=_run_inspect)


def _run_verify(args: argparse.Namespace) -> int:
    problems = verify_store(args.store, progress=not args.quiet)
    for problem in problems:
        print(f"BAD: {problem}")
    if problems:
        print(f"{len(problems)} problem(s) in {args.store}")
        return 1
    print(f"ok: {args.store}")
    return 0


def register_verify(sub: Any) -> None:
    """Add `tierfeed verify`."""
    p = sub.add_parser("verify", help="check every chunk checksum and the index; exit 1 if bad")
    p.add_argument("store", help="store directory or index file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_verify)
