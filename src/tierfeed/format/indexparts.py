"""`tierfeed index SHARDS --out DST --part I/N`: index one of N contiguous shares of a shard
list, for `tierfeed merge`.

Every part lists the whole shard list (a stat of each shard, or the object listing: cheap next
to reading them), in the order a single `tierfeed index` takes it, names every shard as a
single index into DST would (under the one chunk root, `tierfeed.format.chunkroot`), and reads
only its contiguous run of shards. Part I of N writes its index alone into
``DST/parts/part-000I-of-000N/``; its chunks are the shards where they lie (its chunk root is
the same directory, seen from there). The index records which part of how many it is, its
shards, and a fingerprint of the whole list (names, sizes, mtimes or ETags, the labelling
asked for); `tierfeed.format.merge` checks these and joins the parts (`merged_index`).

Labels are the whole list's, as for a single index: a part keeps each sample's ``.cls`` label
(-1 without one) and whether any of its samples had one; the merge decides, over every part,
between ``.cls`` labels and the ImageFolder rule, as `tierfeed.format.labels` does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash

from tierfeed.errors import ConfigError, PackError
from tierfeed.format.chunkroot import ShardNames, is_url
from tierfeed.format.index import Index, IndexContent
from tierfeed.format.labels import load_classes, resolve_labels
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.parts import finished_part, parse_part, part_directory, part_shares
from tierfeed.format.shards import IndexReport, ShardScan, scan_shard_set, write_shard_index
from tierfeed.format.shardset import ShardSet, check_target, listed_shards

__all__ = [
    "KIND",
    "check_shards",
    "index_part",
    "merged_index",
    "shard_fingerprint",
    "shard_share",
]

KIND = "index"  # a part's record["kind"]: a part of `tierfeed index` (pack parts have none)


def shard_fingerprint(whole: ShardSet, labels: str, skip_bad: bool, names: list[str] | None) -> str:
    """Identity of the whole shard list as the parts index it: the labelling asked for, the
    chunk root, every shard's name, size and version (mtime or ETag, when known)."""
    h = xxhash.xxh3_128()
    h.update(b"tierfeed-shards-v1:%s:%d;" % (labels.encode(), skip_bad))
    for name in names if names is not None else ["\0none"]:
        encoded = name.encode("utf-8", "surrogateescape")
        h.update(b"c%d:%s;" % (len(encoded), encoded))
    h.update(b"r%s;" % (whole.where.root or "\0store").encode("utf-8", "surrogateescape"))
    stamps = whole.stamps or [""] * len(whole.sizes)
    for name, size, stamp in zip(whole.where.names, whole.sizes, stamps, strict=True):
        encoded = name.encode("utf-8", "surrogateescape")
        h.update(b"s%d:%s:%d:%s;" % (len(encoded), encoded, size, stamp.encode()))
    return h.hexdigest()


def _part_root(root: str | None, part_dir: Path, dst: Path) -> str | None:
    """The chunk root the store at ``dst`` records, as seen from the part's directory."""
    if root is not None and (is_url(root) or os.path.isabs(root)):
        return root
    return os.path.normpath(os.path.join(os.path.relpath(dst, part_dir), root or "."))


def shard_share(whole: ShardSet, share: range, part_dir: Path, dst: Path) -> ShardSet:
    """The shards ``share`` of ``whole`` (named for the store at ``dst``), for an index in
    ``part_dir``: the same names, under the same root seen from there."""
    where = ShardNames(
        _part_root(whole.where.root, part_dir, dst), whole.where.names[share.start : share.stop]
    )
    return ShardSet(
        where,
        whole.shown[share.start : share.stop],
        whole.sizes[share.start : share.stop],
        lambda chunk: whole.fetch(share.start + chunk),
        whole.stamps[share.start : share.stop],
    )


def _labels(
    scan: ShardScan, labels: str, names: list[str] | None, dst: Path
) -> tuple[list[int], list[str], bool]:
    """The part's ``.cls`` labels (-1 without one), classes, and whether any sample had one;
    what a single index would refuse of these samples (no ``.cls`` under ``cls``, a label the
    map does not name) is refused here already."""
    keys, cls = scan.got.keys, scan.got.labels_of_cls()
    has_cls = labels in ("auto", "cls") and any(c is not None for c in cls)
    if not has_cls and labels != "cls":
        return [-1] * len(keys), names or [], False
    label_of, classes = resolve_labels(keys, cls, labels, names, dst)
    return label_of, classes, True


def _finished(index_path: Path, record: dict[str, Any]) -> IndexReport | None:
    """The report of the part at ``index_path`` when it is finished and is this very part of
    this very shard list (`finished_part`: a requeued task); None otherwise."""
    ix = finished_part(index_path, record)
    if ix is None:
        return None
    with ix:
        counts = (ix.num_samples, ix.num_members, ix.num_chunks, int(ix.member_length.sum()))
        return IndexReport(index_path, *counts, [], ix.chunk_url or ix.chunk_root)


def _whole(shards: Sequence[str | os.PathLike[str]] | ShardSet, dst: Path) -> ShardSet:
    """The whole shard list, named for the store at ``dst``; shards at URLs come as a `ShardSet`."""
    if isinstance(shards, ShardSet):
        return shards
    url = next((os.fspath(s) for s in shards if is_url(os.fspath(s))), None)
    if url is not None:
        raise ConfigError(
            f"{url}: index_part reads shards at URLs through "
            "tierfeed.loader.urlshards.index_shards(..., part=(I, N))"
        )
    return listed_shards(shards, dst)


def _share(whole: ShardSet, index: int, count: int, dst: Path) -> range:
    """The shards of part ``index`` of ``count``, the parts of about equal bytes
    (`tierfeed.format.parts.part_shares`); refuses a part that would hold none."""
    share = part_shares(whole.sizes, count)[index]
    if not share:
        raise PackError(
            f"{dst}: part {index} of {count} would hold no shard (there are "
            f"{len(whole.shown)}); index them in fewer parts"
        )
    return share


def index_part(
    shards: Sequence[str | os.PathLike[str]] | ShardSet,
    dst: str | os.PathLike[str],
    part: tuple[int, int],
    labels: str = "auto",
    skip_bad_names: bool = False,
    progress: bool = True,
    classes: str | os.PathLike[str] | Sequence[str] | None = None,
    overwrite: bool = False,
) -> IndexReport:
    """Index part ``part`` = (I, N) of ``shards`` into ``dst/parts/part-000I-of-000N`` (see
    the module); `tierfeed.format.merge.merge_parts` joins the N parts into ``dst``'s index.

    Args:
        shards: as for `tierfeed.format.shards.index_shards` (plain ``.tar`` only), or a
            `ShardSet` of the whole list named for ``dst``.
        dst: the store directory (local: every part must see it).
        part: (I, N): part I, counted from 0, of N.
        labels, skip_bad_names, progress, classes: as for a single index.
        overwrite: replace this part's index when it is not this very part.

    Raises:
        ConfigError: ``part`` names no part, ``dst`` is a URL, a shard is gzipped.
        PackError: the part would hold no shard; a single index would refuse its shards.
    """
    index, count = parse_part(f"{part[0]}/{part[1]}")
    if is_url(os.fspath(dst)):
        raise ConfigError(f"{os.fspath(dst)}: --part indexes into a local directory; drop --part")
    root = Path(dst)
    whole = _whole(shards, root)
    share = _share(whole, index, count, root)
    names = None if classes is None else load_classes(classes)
    part_dir = part_directory(root, index, count)
    record = _record(whole, share, index, count, (labels, skip_bad_names, names))
    index_path = part_dir / INDEX_NAME
    done = None if overwrite else _finished(index_path, record)
    if done is not None:
        return done
    check_target(part_dir, index_path, overwrite)
    part_dir.mkdir(parents=True, exist_ok=True)
    mine = shard_share(whole, share, part_dir, root)
    scan = scan_shard_set(mine, labels, skip_bad_names, progress)
    label_of, class_names, has_cls = _labels(scan, labels, names, root)
    content = scan.content(label_of, class_names, mine.where)
    content.extra["part"] = record | {"cls": has_cls}
    write_shard_index(index_path, content, scan)
    return scan.report(index_path, mine.where.root)


def _record(
    whole: ShardSet, share: range, index: int, count: int, asked: tuple[str, bool, Any]
) -> dict[str, Any]:
    """What a part's index records of the part (``extra["part"]``), for the merge."""
    labels, skip_bad, names = asked
    first, last = whole.shown[0], whole.shown[-1]
    return {
        "kind": KIND,
        "index": index,
        "count": count,
        "source": shard_fingerprint(whole, labels, skip_bad, names),
        "shards": [share.start, share.stop],
        "of": len(whole.shown),
        "src": first if first == last else f"{first} ... {last}",
        "root": whole.where.root,
        "labels": labels,
        "classes_map": names is not None,
    }


def check_shards(parts: list[Index]) -> None:
    """Every local shard of every part still has the size its part indexed (a stat each; the
    bytes were read and checksummed by the part: `tierfeed verify` reads them again)."""
    for ix in parts:
        if ix.chunk_url is not None:
            continue  # objects at a URL: the part listed them; verify checks them there
        for c in range(ix.num_chunks):
            path, want = ix.chunk_root / ix.chunk_name(c), int(ix.chunk_size[c])
            try:
                size = os.stat(path).st_size
            except OSError as exc:
                size, why = -1, exc.strerror or str(exc)
            if size != want:
                said = f"{size} bytes" if size >= 0 else f"cannot stat ({why})"
                raise PackError(
                    f"{path}: {said}, {ix.path.parent.name} indexed {want}: the shard changed "
                    "after it was indexed; index that part again with --overwrite"
                )


def merged_index(content: IndexContent, parts: list[Index], dst: Path) -> IndexContent:
    """``content`` (the parts' rows joined) as a single index of the whole list makes it:
    labels decided over every part, the shards' chunk root; a key in two parts refused."""
    records = [ix.header["extra"]["part"] for ix in parts]
    keys = list(content.keys)
    seen: set[bytes] = set()
    for key in keys:
        if key in seen:
            raise PackError(
                f"{dst}: sample key {os.fsdecode(key)!r} is in two shards of two parts; a "
                "sample's members must be adjacent in one shard (a single index refuses it too)"
            )
        seen.add(key)
    cls: list[int | None] = []
    for ix, record in zip(parts, records, strict=True):
        labels = ix.sample_label.astype(int).tolist()
        cls.extend(labels if record["cls"] else [None] * len(labels))
    names = list(parts[0].classes) if records[0]["classes_map"] else None
    label_of, classes = resolve_labels(keys, cls, records[0]["labels"], names, dst)
    content.labels = content.labels.copy()
    content.labels[:] = label_of
    content.classes = classes
    content.chunk_root = records[0]["root"]
    return content
