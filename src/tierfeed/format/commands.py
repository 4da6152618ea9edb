"""CLI subcommands of the format: pack, index (inspect and verify, which read stores by path
or URL, are `tierfeed.loader.commands`)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tierfeed.errors import ConfigError
from tierfeed.format.pack import PackOptions, PackReport, pack
from tierfeed.units import human, size_argument

if TYPE_CHECKING:  # `tierfeed index`'s module (tqdm with it) loads only for that command
    from tierfeed.format.shards import IndexReport

__all__ = [
    "register_index",
    "register_merge",
    "register_pack",
    "run_index",
    "run_merge",
    "run_pack",
]

Sub = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _print_skipped(skipped: list[tuple[str, str]]) -> None:
    if skipped:
        print(f"skipped {len(skipped)}:", file=sys.stderr)
        for path, reason in skipped:
            print(f"  {path}: {reason}", file=sys.stderr)


def _count(text: str) -> int:
    """An argparse type: a whole number of 1 or more (``--workers 0`` names its flag)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a whole number, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"takes 1 or more, not {n}")
    return n


def _part(text: str) -> str:
    """An argparse type: ``I/N`` (checked now: a usage error, exit 2) or ``env``."""
    if text == "env":
        return text
    from tierfeed.format.parts import parse_part

    try:
        parse_part(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _pack_part(args: argparse.Namespace, options: PackOptions) -> PackReport:
    """Pack the part ``--part`` names (I/N, or env: the launcher's rank and world)."""
    from tierfeed.config import part_from_env
    from tierfeed.format.parts import pack_part, parse_part

    part = part_from_env() if args.part == "env" else parse_part(args.part)
    return pack_part(args.src, args.dst, part, options, files=args.files)


def run_pack(args: argparse.Namespace, packer: Callable[..., PackReport] = pack) -> int:
    """`tierfeed pack` with ``args``, packing with ``packer`` (`tierfeed.loader.commands`
    gives one that also packs to a URL); with ``--part``, one part for `tierfeed merge`."""
    options = PackOptions(
        chunk_size=args.chunk_size,
        workers=args.workers,
        labels=args.labels,
        group_by=args.group_by,
        skip_unreadable=args.skip_unreadable,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    if args.part is not None:
        report = _pack_part(args, options)
    else:
        report = packer(args.src, args.dst, options, files=args.files)
    _print_skipped(report.skipped)
    rate = report.data_bytes / max(report.seconds, 1e-9)
    resumed = f", {report.resumed_chunks} kept from an earlier run" if report.resumed_chunks else ""
    print(
        f"packed {report.samples} samples ({report.members} files, {human(report.data_bytes)}) "
        f"into {report.chunks} chunks{resumed} in {report.seconds:.1f} s ({human(rate)}/s) "
        f"-> {report.store}"
    )
    if args.part is not None:
        print(f"when every part is packed: tierfeed merge {args.dst}")
    if report.unlabelled:
        print(
            f"{report.unlabelled} sample{'s lie' if report.unlabelled > 1 else ' lies'} outside "
            f"the {report.classes} class directories (at the top level): label -1",
            file=sys.stderr,
        )
    return 0


def register_pack(sub: Any, packer: Callable[..., PackReport] = pack) -> None:
    """Add `tierfeed pack`, packing with ``packer`` (`tierfeed.loader.commands` gives one that
    also packs to a URL)."""
    p = sub.add_parser("pack", help="pack a directory tree into tar chunks and an index")
    p.add_argument("src", help="source directory (ImageFolder layout gives labels)")
    p.add_argument("dst", help="store directory to create, or a URL (s3://bucket/ds)")
    p.add_argument(
        "--chunk-size",
        type=size_argument,
        default="64MiB",
        help="target chunk size (default 64MiB)",
    )
    p.add_argument(
        "--workers",
        type=_count,
        default=16,
        help="the most parallel file readers: as many as the cores, more while reads wait "
        "on storage (default 16)",
    )
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
    p.add_argument(
        "--part",
        type=_part,
        metavar="I/N|env",
        help="pack only part I (from 0) of N, into DST/parts/, for `tierfeed merge DST`; env: "
        "I and N from torchrun's RANK/WORLD_SIZE or Slurm's array or task ids",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=functools.partial(run_pack, packer=packer))


def run_merge(args: argparse.Namespace) -> int:
    """`tierfeed merge` with ``args``."""
    from tierfeed.format.merge import merge_parts

    report = merge_parts(
        args.dst, overwrite=args.overwrite, progress=not args.quiet, verify=args.verify
    )
    print(
        f"merged {report.parts} parts: {report.samples} samples "
        f"({human(report.data_bytes)}) in {report.chunks} chunks, checked ({report.chunks_read} "
        f"of them read again), in {report.seconds:.1f} s -> {report.store}"
    )
    return 0


def register_merge(sub: Any) -> None:
    """Add `tierfeed merge`."""
    p = sub.add_parser("merge", help="join the parts `tierfeed pack --part` packed into one store")
    p.add_argument("dst", help="the store directory the parts were packed into")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an index at DST that was not merged from parts",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="read every chunk again, as `tierfeed verify` does (default: only the chunks "
        "whose size or mtime changed since their part was packed)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_merge)


def run_index(args: argparse.Namespace, indexer: Callable[..., IndexReport] | None = None) -> int:
    """`tierfeed index` with ``args``, indexing with ``indexer`` (default: shards in a
    directory; `tierfeed.loader.commands` gives one that also indexes shards at a URL)."""
    if args.part is not None:
        indexer = functools.partial(_index_part, part=args.part, indexer=indexer)
    elif indexer is None:
        from tierfeed.format.shards import index_shards

        indexer = index_shards
    report = indexer(
        args.shards,
        args.out,
        args.labels,
        args.skip_bad_names,
        progress=not args.quiet,
        classes=args.classes,
        overwrite=args.overwrite,
    )
    _print_skipped(report.skipped)
    read_from = f" (shards read from {report.shard_root})" if report.shard_root else ""
    print(
        f"indexed {report.samples} samples ({report.members} members, "
        f"{human(report.data_bytes)}) in {report.chunks} shards -> {report.index}{read_from}"
    )
    if args.part is not None:
        print(f"when every part is indexed: tierfeed merge {args.out}")
    return 0


def _index_part(
    shards: list[str],
    out: str,
    *options: Any,
    part: str,
    indexer: Callable[..., IndexReport] | None,
    **keywords: Any,
) -> IndexReport:
    """Index the part ``part`` names (I/N, or env: the launcher's rank and world) with
    ``indexer`` given ``part=(I, N)`` (one that also reads shards at URLs), or of local shards;
    ``options`` and ``keywords`` as `run_index` gives any indexer."""
    from tierfeed.config import part_from_env
    from tierfeed.format.indexparts import index_part
    from tierfeed.format.parts import parse_part

    where = part_from_env() if part == "env" else parse_part(part)
    if indexer is not None:
        return indexer(shards, out, *options, part=where, **keywords)
    return index_part(shards, out, where, *options, **keywords)


def register_index(sub: Any, indexer: Callable[..., IndexReport] | None = None) -> None:
    """Add `tierfeed index`, indexing with ``indexer`` (`tierfeed.loader.commands` gives one
    that also indexes shards at a URL)."""
    p = sub.add_parser("index", help="index tar shards where they lie")
    p.add_argument(
        "shards",
        nargs="+",
        help=".tar shards, read where they lie (any directory, read-only too; links to them "
        "too); .tar.gz/.tgz ones are decompressed once into --out; quoted brace patterns "
        "expand as WebDataset's ('shard-{000000..000009}.tar'); URLs (s3://...), read "
        "where they lie, quoted glob patterns too",
    )
    p.add_argument(
        "--out",
        required=True,
        help="store directory for the index (made if missing; shards outside it, or at URLs "
        "in a bucket you cannot write, are recorded as its shard root), or the shards' URL",
    )
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
    p.add_argument("--overwrite", action="store_true", help="replace an index already in --out")
    p.add_argument(
        "--part",
        type=_part,
        metavar="I/N|env",
        help="index only part I (from 0) of N of the shards (local or at URLs), into --out's "
        "parts/, for `tierfeed merge OUT`; env: I and N from torchrun's or Slurm's variables",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=functools.partial(run_index, indexer=indexer))
