"""`tierfeed pack --part I/N`: pack one of N disjoint shares of a source, for `tierfeed merge`.

Every part lists the whole source (a directory walk: cheap next to reading the files), so that
each computes the same samples, classes and labels a single pack does, and packs the
contiguous run of samples ``part_shares`` gives it, about a 1/N of the source's bytes (the
sizes the listing holds): joined in part order, the parts hold the single pack's samples in
its order. Part I of N is a store of its own in
``DST/parts/part-000I-of-000N`` (its chunks, its journal and lock, its index written last),
so parts run at once on any launcher without touching each other, and a part killed mid-way
resumes as a pack does: run it again. Its index records which part of how many it is and a
fingerprint of the whole source listing, which `tierfeed.format.merge` checks before joining
the parts' indexes into the store's one index (no chunk is copied).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from tierfeed.errors import ConfigError, PackError, TierfeedError
from tierfeed.format.chunkroot import is_url
from tierfeed.format.destination import check_destination
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, PackReport, source_tree, write_store
from tierfeed.format.packplan import plan_pack
from tierfeed.format.source import SourceTree
from tierfeed.format.storetarget import LocalDirectory, claimed

__all__ = [
    "PARTS_DIR",
    "finished_part",
    "pack_part",
    "parse_part",
    "part_directory",
    "part_name",
    "part_samples",
    "part_shares",
    "source_fingerprint",
]

PARTS_DIR = "parts"  # under the store: one store directory per part
PART_NAME = re.compile(r"part-([0-9]{4,})-of-([0-9]{4,})")


def part_name(index: int, count: int) -> str:
    """The directory name of part ``index`` of ``count``: ``part-0003-of-0008``."""
    return f"part-{index:04d}-of-{count:04d}"


def part_directory(dst: Path, index: int, count: int) -> Path:
    """Where part ``index`` of ``count`` of the store ``dst`` is packed."""
    return dst / PARTS_DIR / part_name(index, count)


def parse_part(text: str) -> tuple[int, int]:
    """``I/N`` as (I, N): part I (counted from 0) of N.

    Raises:
        ConfigError: not two whole numbers, or I not one of 0..N-1.
    """
    index, slash, count = text.partition("/")
    if not slash or not index.strip().isdigit() or not count.strip().isdigit():
        raise ConfigError(f"--part takes I/N (part I of N, I from 0) or env, not {text!r}")
    i, n = int(index), int(count)
    if not 0 <= i < n:
        raise ConfigError(f"--part {text}: part I of N counts I from 0 to N-1 (0/{n}..{n - 1}/{n})")
    return i, n


def part_samples(num_samples: int, index: int, count: int) -> range:
    """The samples (store order) of part ``index`` of ``count``: contiguous, disjoint, in part
    order, together every sample; sizes differ by one at most."""
    return range(num_samples * index // count, num_samples * (index + 1) // count)


def part_shares(sizes: Sequence[int] | npt.NDArray[np.integer[Any]], count: int) -> list[range]:
    """The shares of ``count`` parts of items of ``sizes`` bytes (store order), balanced by
    bytes: contiguous, disjoint, in part order, together every item, each part's bytes within
    the largest item of an even 1/``count`` of the whole; none empty while there are at least
    ``count`` items. The same for the same sizes on every machine (whole numbers only)."""
    ends = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(np.asarray(sizes, dtype=np.int64), out=ends[1:])
    n, total = len(sizes), int(ends[-1])
    cuts = [0]
    for i in range(1, count):
        # the item boundary nearest to i/count of the bytes (the earlier one on a tie)
        k = int(np.searchsorted(ends, -(-i * total // count)))
        if k > 0 and i * total - count * int(ends[k - 1]) <= count * int(ends[k]) - i * total:
            k -= 1
        cuts.append(k)
    cuts.append(n)
    if n >= count:  # move cuts the least that leaves every part an item
        for i in range(1, count):
            cuts[i] = max(cuts[i], cuts[i - 1] + 1)
        for i in range(count - 1, 0, -1):
            cuts[i] = min(cuts[i], cuts[i + 1] - 1)
    return [range(cuts[i], cuts[i + 1]) for i in range(count)]


def source_fingerprint(tree: SourceTree, options: PackOptions) -> str:
    """Identity of the whole source listing as a pack sees it: how samples are grouped and
    labelled, the classes, every sample's key, label and files (name, size, mtime, mode), and
    the directories; parts with different fingerprints cannot be merged."""
    h = xxhash.xxh3_128()
    h.update(b"tierfeed-source-v1:%s:%s;" % (options.labels.encode(), options.group_by.encode()))
    for name in tree.classes:
        encoded = name.encode("utf-8", "surrogateescape")
        h.update(b"c%d:%s;" % (len(encoded), encoded))
    for sample in tree.samples:
        h.update(b"s%d:%s:%d;" % (len(sample.key), sample.key, sample.label))
        for ext, f in sample.files:
            h.update(b"%s:%d:%s:%d:%d:%d;" % (ext, len(f.rel), f.rel, f.size, f.mtime_ns, f.mode))
            h.update(b"%d;" % f.mtime)
    for d in tree.dirs or []:
        h.update(b"d%d:%s:%d:%d;" % (len(d.rel), d.rel, d.mode, d.mtime_ns))
    return h.hexdigest()


def _share(tree: SourceTree, samples: range, index: int) -> SourceTree:
    """The part of ``tree`` holding ``samples``, with the whole tree's classes and directories
    (labels are the whole source's). What the listing skipped is part 0's to report."""
    return SourceTree(
        samples=tree.samples[samples.start : samples.stop],
        classes=tree.classes,
        skipped=list(tree.skipped) if index == 0 else [],
        dirs=tree.dirs,
    )


def _local(dst: str | os.PathLike[str]) -> Path:
    text = os.fspath(dst)
    if is_url(text):
        raise ConfigError(
            f"{text}: --part packs into a local directory (a shared file system all parts "
            "see); pack to a URL in one part"
        )
    return Path(text)


def pack_part(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    part: tuple[int, int],
    options: PackOptions | None = None,
    files: str | os.PathLike[str] | None = None,
) -> PackReport:
    """Pack part ``part`` = (I, N) of ``src`` into ``dst/parts/part-000I-of-000N`` (see the
    module); `tierfeed.format.merge.merge_parts` joins the N parts into the store at ``dst``.

    Args:
        src: the source directory, as for `tierfeed.pack`.
        dst: the store directory (local: every part must see it).
        part: (I, N): part I, counted from 0, of N.
        options: as for `tierfeed.pack` (``overwrite`` replaces this part only).
        files: a file listing paths relative to ``src``, as for `tierfeed.pack`.

    Raises:
        PackError: as `tierfeed.pack`; also when the part would hold no sample.
        ConfigError: ``part`` names no part, or ``dst`` is a URL.
    """
    options = options or PackOptions()
    index, count = parse_part(f"{part[0]}/{part[1]}")
    src_path, root, started = Path(src), _local(dst), time.perf_counter()
    directory = part_directory(root, index, count)
    target = LocalDirectory(directory, options.overwrite, "--overwrite")
    check_destination(src_path, root)
    tree = source_tree(src_path, root, options, None if files is None else Path(files))
    sizes = [sum(f.size for _, f in sample.files) for sample in tree.samples]
    samples = part_shares(sizes, count)[index]
    if not samples:
        raise PackError(
            f"{src}: part {index} of {count} would hold no sample (the source has "
            f"{len(tree.samples)}); pack it in fewer parts"
        )
    record = _record(tree, options, src_path, samples, index, count)
    done = None if options.overwrite else _packed_already(directory, record, started)
    if done is not None:
        return done  # a launcher ran a finished part again (a requeued array task)
    target.check()
    share = _share(tree, samples, index)
    plan = plan_pack(share, options.chunk_size)
    plan.part = record
    with claimed(target, resume=True):  # an interrupted run of this part is kept
        return write_store(directory, plan, options, share, started)


def finished_part(index: Path, record: dict[str, Any]) -> Index | None:
    """The index at ``index`` (a part's directory or its index file), open, when it is there,
    whole, and records ``record`` as its part (every key of it, the same value): this very part
    of this very source, finished, which a launcher ran again (a requeued array task). None
    otherwise (no index yet, another part's, or one not to trust). The caller closes it."""
    try:
        ix = Index(index)
    except (OSError, TierfeedError):
        return None
    said = ix.header["extra"].get("part")
    if isinstance(said, dict) and {k: said[k] for k in record if k in said} == record:
        return ix
    ix.close()
    return None


def _packed_already(directory: Path, record: dict[str, Any], started: float) -> PackReport | None:
    """The report of the part at ``directory`` if it is finished and is this very part of this
    very source (`finished_part`); None otherwise (then packing it is refused unless asked to
    overwrite, as for any store)."""
    ix = finished_part(directory, record)
    if ix is None:
        return None
    with ix:
        return PackReport(
            store=directory,
            samples=ix.num_samples,
            members=ix.num_members,
            chunks=ix.num_chunks,
            data_bytes=int(ix.member_length.sum()),
            chunk_bytes=int(ix.chunk_size.sum()),
            seconds=time.perf_counter() - started,
            resumed_chunks=ix.num_chunks,
            skipped=[],
            classes=len(ix.classes),
        )


def _record(
    tree: SourceTree, options: PackOptions, src: Path, samples: range, index: int, count: int
) -> dict[str, Any]:
    """What a part's index records of the part (``extra["part"]``), for the merge."""
    return {
        "index": index,
        "count": count,
        "source": source_fingerprint(tree, options),
        "samples": [samples.start, samples.stop],
        "of": len(tree.samples),
        "src": os.fsdecode(os.path.abspath(src)),
    }
