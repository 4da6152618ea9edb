"""`tierfeed.torch.ImageFolder`: torchvision's ImageFolder over a packed store, no torchvision.

The samples are chosen from the store's copy of the packed tree by torchvision's rules
(``find_classes`` and ``make_dataset`` of torchvision 0.2x), not from labels given at pack
time, so a store packed from any ImageFolder tree gives the samples, in the order, that
torchvision would give on that tree.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from tierfeed.errors import ConfigError, DecodeError, NotFoundError
from tierfeed.format.codecs import open_image
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.compose import open_store
from tierfeed.loader.location import StoreLocation
from tierfeed.storage.store import Store

__all__ = [
    "IMG_EXTENSIONS",
    "ImageFolder",
    "find_classes",
    "has_file_allowed_extension",
    "make_dataset",
    "pil_loader",
]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def pil_loader(data: bytes) -> Any:
    """Decode image bytes to an RGB PIL image, as torchvision's default loader does, but only
    from the in-process raster formats (`tierfeed.format.codecs.RASTER_FORMATS`): never as a
    format that makes Pillow run a program, such as PostScript bytes in a ``.png`` file.

    Raises:
        DecodeError: the bytes are none of those formats (`ImageFolder` names the file).
    """
    with open_image(data) as img:
        return img.convert("RGB")


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
    blob = index.key_blob()
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


class ImageFolder(Dataset[tuple[Any, int]]):
    """A drop-in for ``torchvision.datasets.ImageFolder`` reading a packed store.

    Samples are selected from the store's tree as torchvision selects them from the tree that
    was packed (see `make_dataset`): classes are the top-level directories, sorted; each class
    directory is walked recursively; a file is a sample when its lower-cased name ends with an
    image extension (``.x.jpg`` counts, ``.DS_Store`` and ``notes.txt`` do not) or when
    ``is_valid_file`` accepts it; files at the top level are not samples. The store is opened
    lazily in each process, so DataLoader workers (fork or spawn) each get their own
    descriptors.

    Attributes:
        classes: class names, sorted.
        class_to_idx: class name -> index.
        samples: ``(path relative to the store's tree, class index)`` per sample, in
            torchvision's order (``imgs`` is the same list). torchvision's paths start with
            the root it was given (``/data/train/cat/a.jpg``), these with the class
            (``cat/a.jpg``): ``os.path.join(tree_root, path)`` gives that form.
        targets: the class index of each sample.

    Args:
        root: a store directory or URL (``s3://bucket/ds``), made by ``tierfeed pack`` from
            an ImageFolder tree.
        transform: applied to the decoded image.
        target_transform: applied to the label.
        loader: bytes -> image; PIL RGB by default.
        is_valid_file: path (relative to the store) -> keep it; replaces ``extensions``.
        allow_empty: keep classes without a valid file instead of raising.
        extensions: the suffixes of kept files (default `IMG_EXTENSIONS`), as torchvision's
            ``DatasetFolder`` takes them.
        storage_options: for a URL, what its fsspec file system takes (credentials,
            ``client_kwargs={"endpoint_url": ...}``); by default the environment's.

    Raises:
        ConfigError: ``root`` is not a store, or both ``extensions`` and ``is_valid_file``.
        NotFoundError: no class directory, or a class without a valid file (unless
            ``allow_empty``); a FileNotFoundError, as torchvision raises.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[bytes], Any] = pil_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        extensions: str | Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._location = StoreLocation.of(root, storage_options)
        self.root: str | Path = self._location.text if self._location.remote else Path(root)
        if not self._location.remote and not (Path(self.root) / INDEX_NAME).exists():
            raise ConfigError(
                f"{self.root}: not a tierfeed store; pack your ImageFolder tree once with "
                f"`tierfeed pack {self.root} STORE_DIR` and pass STORE_DIR here"
            )
        if extensions is None and is_valid_file is None:
            extensions = IMG_EXTENSIONS
        self.transform, self.target_transform, self.loader = transform, target_transform, loader
        self.extensions = extensions
        self._store: Store | None = None
        self._pid = -1
        store = self._open()
        self.classes, self.class_to_idx = find_classes(store)
        self.samples, self._members = make_dataset(
            store, self.class_to_idx, extensions, is_valid_file, allow_empty
        )
        self.imgs = self.samples
        self.targets: list[int] = [target for _, target in self.samples]

    @property
    def sample_ids(self) -> npt.NDArray[np.int64]:
        """The store's samples that hold this dataset's files, sorted: what
        ``tierfeed.torch.Dataset(store, samples=...)`` takes to read the same selection in
        batches (the same files where each file is a sample, as `tierfeed pack` makes them by
        default; with ``--group-by key``, the samples with a selected file, whole)."""
        starts = self._open().index.sample_member_start
        owners = np.searchsorted(starts, np.asarray(self._members), side="right") - 1
        return np.unique(owners.astype(np.int64))

    def _open(self) -> Store:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self._location)  # a forked worker opens its own
            self._pid = os.getpid()
        return self._store

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        store = self._open()
        member = int(self._members[index])
        data = store.read_member(member)
        try:
            image = self.loader(data)
        except Exception as exc:  # PIL names a BytesIO; the user needs the file
            path, _ = self.samples[index]
            chunk = store.chunk_location(int(store.index.member_chunk[member]))
            raise DecodeError(
                f"{path!r} (chunk {chunk}): the loader failed with {type(exc).__name__}: {exc} "
                "(its bytes match the checksum taken when it was packed, so the file itself is "
                "not what the loader expects); fix or remove it and re-pack",
                key=path,
                chunk=str(chunk),
            ) from exc
        target: Any = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"], state["_pid"] = None, -1  # descriptors do not cross processes
        return state
