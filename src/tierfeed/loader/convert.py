"""`tierfeed convert` and `tierfeed.convert`: a MosaicML Streaming (MDS) or LitData dataset
turned into a store, one sample per source sample, in the source's order.

The source is read by `tierfeed.format.peers` (every size checked against its file) and
written by `tierfeed.Writer`, so the store is as crash-safe as any other: an interrupted
conversion leaves no store that opens. Keys are the samples' positions, zero-padded
(``000000``, ``000001``, ...); fields are named by `tierfeed.format.peercolumns`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from tierfeed.errors import ConfigError, PackError
from tierfeed.format.chunkroot import is_url
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.peercolumns import PeerDataset, key_width, sample_of, storage_names
from tierfeed.format.peers import open_peer
from tierfeed.format.writer import Classes, WriteReport
from tierfeed.loader.writer import Writer
from tierfeed.units import human, size_argument

__all__ = ["convert", "register"]

SUMMARY = "convert an MDS or LitData dataset into a store"


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    label_column: str | None = None,
    classes: Classes = None,
    chunk_size: int = 64 * 2**20,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> WriteReport:
    """Write the MDS or LitData dataset in the directory ``src`` as a store at ``dst``.

    An MDS dataset is the directory ``streaming.MDSWriter`` wrote (``index.json`` and
    ``shard.NNNNN.mds`` files, uncompressed or compressed with gz, bz2 or zstd); a LitData one
    the directory ``litdata.optimize`` wrote (``index.json`` and ``chunk-*.bin``). Each column
    becomes a field named for what it holds, so that ``decode="auto"`` reads it back: a JPEG
    column ``image`` the field ``image.jpg`` (its bytes as they are), a string ``text.txt``,
    an array ``vec.npy``, a number ``score.json``, a pickle ``obj.pkl`` (stored, never
    unpickled). docs/coming-from.md has the whole table.

    Args:
        src: the source dataset's directory (the one holding its ``index.json``).
        dst: the store directory (created if missing), or its URL.
        label_column: the integer column that is each sample's label (the field ``cls``);
            None: the store has no labels.
        classes: names of the label classes: a list, or a file naming class ``i`` on line
            ``i``; only with ``label_column``.
        chunk_size: target chunk size of the store in bytes.
        overwrite: replace a store already at ``dst``.
        storage_options: for a URL ``dst``, as for `tierfeed.open_store`.
        progress: a progress bar on stderr.

    Raises:
        PackError: ``src`` is not a dataset of either format, uses a layout or encoding
            tierfeed does not convert, or is damaged (the message names the shard and sample);
            ``dst`` holds a store (without ``overwrite``) or lies inside ``src``.
    """
    dataset = open_peer(src)
    options = (label_column, classes, chunk_size, overwrite, storage_options, progress)
    return _write(dataset, Path(src), dst, *options)


def _write(
    dataset: PeerDataset,
    src: Path,
    dst: str | os.PathLike[str],
    label_column: str | None,
    classes: Classes,
    chunk_size: int,
    overwrite: bool,
    storage_options: Mapping[str, Any] | None,
    progress: bool,
) -> WriteReport:
    """`convert` of an opened ``dataset``."""
    if classes is not None and label_column is None:
        raise ConfigError("classes name the classes of a label column; give label_column too")
    fields = storage_names(dataset.columns, label_column, src)
    if not is_url(os.fspath(dst)):
        _check_destination(src, Path(dst), overwrite)
    width = key_width(dataset.samples)
    labels = "none" if label_column is None else "cls"
    with (
        Writer(dst, chunk_size, labels, classes, overwrite, storage_options) as writer,
        contextlib.closing(_with_bar(dataset, progress)) as samples,  # closed before the error
    ):
        for n, (where, values) in enumerate(samples):
            writer.write(sample_of(f"{n:0{width}d}", dataset.columns, fields, values, where))
        report = writer.close()
    return report


def _check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    """Refuse a ``dst`` inside ``src`` (the source is read-only to tierfeed), or holding a
    store (without ``overwrite``), before anything is written."""
    source = os.stat(src)
    real = Path(os.path.realpath(dst))
    for place in (real, *real.parents):
        try:
            st = os.stat(place)
        except OSError:
            continue  # not made yet
        if (st.st_dev, st.st_ino) == (source.st_dev, source.st_ino):
            raise PackError(
                f"{dst}: lies inside the source {src}, and convert never writes into its "
                f"source; choose a sibling directory such as {src.absolute()}-store"
            )
    if (dst / INDEX_NAME).exists() and not overwrite:
        raise already_holds_a_store(dst, "--overwrite (overwrite=True from Python)")


def _with_bar(dataset: PeerDataset, progress: bool) -> Generator[tuple[str, list[Any]], None, None]:
    """The dataset's samples, under a progress bar on stderr when ``progress``."""
    if not progress:
        yield from dataset
        return
    from tqdm import tqdm

    with tqdm(total=dataset.samples, unit="sample", desc="convert", dynamic_ncols=True) as bar:
        try:
            for item in dataset:
                yield item
                bar.update(1)
        except BaseException:
            bar.leave = False  # an error is one line on stderr, without a stale bar above
            raise


def _run(args: argparse.Namespace) -> int:
    dataset = open_peer(args.src)
    options = (args.label_column, args.classes, args.chunk_size, args.overwrite)
    report = _write(dataset, Path(args.src), args.dst, *options, None, not args.quiet)
    units = "shards" if dataset.kind == "MDS" else "chunks"
    print(
        f"converted {report.samples} samples of the {dataset.kind} dataset ({dataset.files} "
        f"{units}; {report.members} files, {human(report.data_bytes)}) into {report.chunks} "
        f"chunks in {report.seconds:.1f} s -> {report.store}"
    )
    return 0


def register(sub: Any) -> None:
    """Add `tierfeed convert`."""
    p = sub.add_parser("convert", help=SUMMARY)
    p.add_argument("src", help="the dataset's directory, holding the index.json of MDS or LitData")
    p.add_argument("dst", help="store directory to create, or a URL (s3://bucket/ds)")
    p.add_argument(
        "--label-column",
        metavar="NAME",
        help="the integer column holding each sample's label (stored as the field cls); "
        "default: no labels",
    )
    p.add_argument(
        "--classes",
        metavar="FILE",
        help="names of the label classes, one per line (line i names class i); "
        "default '0', '1', ...",
    )
    p.add_argument(
        "--chunk-size",
        type=size_argument,
        default="64MiB",
        help="target chunk size (default 64MiB)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a store already at DST")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
