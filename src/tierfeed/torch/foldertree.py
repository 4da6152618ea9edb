"""The samples torchvision's ImageFolder selects from a tree, found in a store's index alone
(`tierfeed.torch.ImageFolder` reads them): ``find_classes`` and ``make_dataset`` of
torchvision 0.2x, with its walk order, its extension rule and its refusal of empty classes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from tierfeed.errors import ConfigError, NotFoundError
from tierfeed.format.index import Index
from tierfeed.storage.store import Store

__all__ = ["find_classes", "has_file_allowed_extension", "make_dataset"]


def has_file_allowed_extension(filename: str, extensions: str | Sequence[str]) -> bool:
    """Whether the lower-cased ``filename`` ends with one of ``extensions`` (torchvision's rule:
    the extensions themselves are not lower-cased, and ``.DS_Store`` ends with none)."""
    return filename.lower().endswith(
        extensions if isinstance(extensions, str) else tuple(extensions)
    )


def find_classes(store: Store) -> tuple[list[str], dict[str, int]]:
    """The classes of a store's tree: its top-level directories, sorted, and their indices.

    A store packed from a tree records its empty directories too, so an empty class folder
    is a class, as torchvision lists it (and `make_dataset` then refuses it unless
    ``allow_empty``); a store without the tree knows only the directories holding files.

    Raises:
        NotFoundError: the tree has no top-level directory (torchvision's FileNotFoundError).
    """
    classes = sorted(name for name in store.listdir("") if store.stat(name).is_dir)
    if not classes:
        raise NotFoundError(
            f"{store.location}: couldn't find any class folder in the store's tree (an ImageFolder "
            "tree holds one directory per class); use tierfeed.torch.Dataset for other data"
        )
    return classes, {c: i for i, c in enumerate(classes)}


def make_dataset(
    store: Store,
    class_to_idx: dict[str, int],
    extensions: str | Sequence[str] | None = None,
    is_valid_file: Callable[[str], bool] | None = None,
    allow_empty: bool = False,
) -> tuple[list[tuple[str, int]], npt.NDArray[np.int64]]:
    """The samples torchvision's ``make_dataset`` lists, from the store's index alone.

    In class order (sorted names), each class directory is walked as torchvision walks it,
    ``for root, _, fnames in sorted(os.walk(dir)): for fname in sorted(fnames)``: the files of
    a directory come before those of its subdirectories, and directories follow the order of
    their path strings (``a-b`` before ``a/b``), which is not the order of the full paths.
    A file is kept when its lower-cased path ends with one of ``extensions``, or when
    ``is_valid_file(path)`` says so; ``path`` is relative to the store (``cat/sub/x.png``).
    No file is stat'ed or read: one pass over the index's paths and one sort, O(n log n).

    Returns:
        ``(path, class index)`` per sample, and the member holding each sample's bytes (the
        member `Store.stat` finds at that path).

    Raises:
        ConfigError: both or neither of ``extensions`` and ``is_valid_file`` given, or no class.
        NotFoundError: a class without a valid file, unless ``allow_empty``.
    """
    if not class_to_idx:
        raise ConfigError("class_to_idx must have at least one entry to collect any samples")
    if (extensions is None) == (is_valid_file is None):
        raise ConfigError(
            "give exactly one of extensions and is_valid_file (torchvision's rule: both cannot "
            "be None or not None at the same time)"
        )
    paths, members, targets = _walk_order(store.index, class_to_idx)
    if is_valid_file is not None:
        keep = [bool(is_valid_file(p)) for p in paths]  # called in torchvision's order
    else:
        suffixes = extensions if isinstance(extensions, str) else tuple(extensions or ())
        keep = _suffix_mask(store.index, paths, members, suffixes).tolist()
    samples = list(
        zip(
            itertools.compress(paths, keep), itertools.compress(targets.tolist(), keep), strict=True
        )
    )
    mask = np.asarray(keep, dtype=bool)
    if not allow_empty:
        _refuse_empty_classes(store, class_to_idx, targets[mask], extensions)
    return samples, members[mask]


def _refuse_empty_classes(
    store: Store,
    class_to_idx: dict[str, int],
    kept: npt.NDArray[np.int64],
    extensions: str | Sequence[str] | None,
) -> None:
    """Raise NotFoundError naming the classes none of whose files was kept (``kept``: the
    class index of each sample kept), as torchvision refuses them."""
    found = set(np.unique(kept).tolist())
    empty = sorted(c for c, i in class_to_idx.items() if i not in found)
    if not empty:
        return
    rule = "is_valid_file accepted none"
    if extensions is not None:
        listed = extensions if isinstance(extensions, str) else ", ".join(extensions)
        rule = f"supported extensions are {listed}"
    named = ", ".join(empty[:20]) + (f" and {len(empty) - 20} more" if len(empty) > 20 else "")
    raise NotFoundError(
        f"{store.location}: found no valid file for the classes {named} ({rule}); "
        "pass allow_empty=True to keep empty classes"
    )


def _suffix_mask(
    index: Index, paths: list[str], members: npt.NDArray[np.int64], suffixes: str | tuple[str, ...]
) -> npt.NDArray[np.bool_]:
    """``path.lower().endswith(suffixes)`` for each path, decided once per stored extension
    where that is exact, and per path where it is not.

    A path ends with its member's extension, and ``str.lower`` maps characters one by one but
    for a final sigma, so an extension without a sigma decides alone when its lower-cased form
    ends with a suffix, or is as long as the longest suffix and does not.
    """
    longest = len(suffixes) if isinstance(suffixes, str) else max(map(len, suffixes), default=0)
    decided = np.full(len(index.exts), -1, dtype=np.int8)  # 1 keep, 0 drop, -1 ask the path
    for i, raw in enumerate(index.exts):
        ext = os.fsdecode(raw)
        if "\u03a3" not in ext:
            low = ext.lower()
            if low.endswith(suffixes):
                decided[i] = 1
            elif len(low) >= longest:
                decided[i] = 0
    verdict = decided[index.member_ext[members].astype(np.int64)]
    for i in np.flatnonzero(verdict < 0).tolist():
        verdict[i] = paths[i].lower().endswith(suffixes)
    return verdict.astype(bool)


def _walk_order(
    index: Index, class_to_idx: dict[str, int]
) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Path, member and class index of every file inside a class, in torchvision's walk order.

    That order sorts by (class, directory, name), as ``sorted(classes)``, then
    ``sorted(os.walk(...))`` (by the directory's path string), then ``sorted(fnames)`` sort.
    The few distinct directories are sorted as strings; within a directory, names come in the
    index's path order, which is their string order when every name is UTF-8. Names that are
    not (``os.fsdecode`` maps their bytes to surrogates, which sort after other characters) are
    compared as strings, as torchvision compares them.
    """
    paths, members, str_order = _tree_paths(index)
    dirs = [p.rpartition("/")[0] for p in paths]  # "" for a file at the top level
    distinct = list(dict.fromkeys(dirs))
    ids = np.fromiter(
        map({d: i for i, d in enumerate(distinct)}.__getitem__, dirs), np.int64, len(dirs)
    )
    ranked = sorted(
        (d.partition("/")[0], d, i)
        for i, d in enumerate(distinct)
        if d and d.partition("/")[0] in class_to_idx
    )
    rank = np.full(len(distinct), -1, dtype=np.int64)
    dir_target = np.full(len(distinct), -1, dtype=np.int64)
    for r, (cls, _, i) in enumerate(ranked):
        rank[i], dir_target[i] = r, class_to_idx[cls]
    path_rank = rank[ids]
    if str_order:
        order = np.argsort(path_rank, kind="stable")  # keeps the path order inside a directory
        order = order[int(np.count_nonzero(path_rank < 0)) :]  # top-level files: no class
    else:
        rank_of = path_rank.tolist()
        inside = [i for i, r in enumerate(rank_of) if r >= 0]
        inside.sort(key=lambda i: (rank_of[i], paths[i].rpartition("/")[2]))
        order = np.asarray(inside, dtype=np.int64)
    return [paths[i] for i in order.tolist()], members[order], dir_target[ids[order]]


def _tree_paths(index: Index) -> tuple[list[str], npt.NDArray[np.int64], bool]:
    """Every member's path (``os.fsdecode``) in the index's path order, the members in that
    order, and whether that order is the paths' string order (all UTF-8, and sorted)."""
    offsets = index.sample_key_offset.tolist()
    blob = index.key_blob().tobytes()
    if blob.isascii():
        text = blob.decode("ascii")
        keys = [text[a:b] for a, b in itertools.pairwise(offsets)]
    else:
        keys = [os.fsdecode(blob[a:b]) for a, b in itertools.pairwise(offsets)]
    exts = [os.fsdecode(e) for e in index.exts]
    counts = np.diff(index.sample_member_start).astype(np.int64)
    order = index.path_order.astype(np.int64)
    owner = np.repeat(np.arange(index.num_samples), counts)[order].tolist()
    ext = index.member_ext[order].tolist()
    paths = [keys[o] + exts[e] for o, e in zip(owner, ext, strict=True)]
    utf8 = _is_utf8(blob) and all(_is_utf8(e) for e in index.exts)
    # A crafted index may list paths out of order: then they are sorted here, not trusted.
    return paths, order, utf8 and sorted(paths) == paths


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
