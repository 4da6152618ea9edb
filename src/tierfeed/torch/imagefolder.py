"""`tierfeed.torch.ImageFolder`: torchvision's ImageFolder over a packed store, no torchvision.

The samples are chosen from the store's copy of the packed tree by torchvision's rules
(``find_classes`` and ``make_dataset`` of torchvision 0.2x), not from labels given at pack
time, so a store packed from any ImageFolder tree gives the samples, in the order, that
torchvision would give on that tree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from tierfeed.errors import ConfigError, DecodeError
from tierfeed.format.codecs import open_image
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.compose import open_store
from tierfeed.loader.location import StoreLocation
from tierfeed.storage.store import Store
from tierfeed.torch.foldertree import find_classes, has_file_allowed_extension, make_dataset

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
        loader: path -> image, as torchvision's ``loader`` (``default_loader``, your own
            ``Image.open(path)`` or ``cv2.imread(path)``): it is given a path that opens to
            the file's bytes (an in-memory file, ``/proc/self/fd/N``); PIL RGB by default,
            from the bytes directly.
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
        loader: Callable[[Any], Any] = pil_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        extensions: str | Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._location = StoreLocation.of(root, storage_options)
        remote = self._location.remote
        self.root: str | Path = self._location.text if remote else Path(root).expanduser()
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
        self._made: tuple[list[tuple[str, int]], npt.NDArray[np.int64]] | None = None
        self.classes, self.class_to_idx = self.find_classes(str(self.root))
        self.samples = self.make_dataset(
            str(self.root), self.class_to_idx, extensions, is_valid_file, allow_empty
        )
        self._members = self._members_of(self.samples)
        self.imgs = self.samples
        self.targets: list[int] = [target for _, target in self.samples]

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        """The classes and their indices (`find_classes` of the store's tree); override it
        as torchvision's ``DatasetFolder.find_classes`` (``directory`` is the store)."""
        return find_classes(self._open())

    def make_dataset(
        self,
        directory: str,
        class_to_idx: dict[str, int],
        extensions: str | Sequence[str] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """``(path, class index)`` of each sample (`make_dataset` of the store's tree, paths
        relative to it); override it as torchvision's ``DatasetFolder.make_dataset``
        (``directory`` is the store): the paths it returns are looked up in the store."""
        samples, members = make_dataset(
            self._open(), class_to_idx, extensions, is_valid_file, allow_empty
        )
        self._made = (samples, members)
        return samples

    def _members_of(self, samples: list[tuple[str, int]]) -> npt.NDArray[np.int64]:
        """The member holding each of ``samples``: as `make_dataset` found them, else (an
        override's list) looked up by path."""
        made, self._made = self._made, None
        if made is not None and made[0] is samples:
            return made[1]
        store, members = self._open(), []
        for path, _ in samples:
            try:
                member = store.stat(path).member
            except FileNotFoundError:
                member = -1
            if member < 0:
                raise ConfigError(f"{self.root}: make_dataset gave {path!r}, not a file here")
            members.append(member)
        return np.asarray(members, dtype=np.int64)

    @property
    def sample_ids(self) -> npt.NDArray[np.int64]:
        """The store's samples that hold this dataset's files, in the order of ``samples``
        (``zip(ds.samples, ds.sample_ids)`` pairs them where each file is a sample): what
        ``tierfeed.torch.Dataset(store, samples=...)`` takes to read the same selection in
        batches (the same files where each file is a sample, as `tierfeed pack` makes them by
        default; with ``--group-by key``, the samples with a selected file, whole, each once
        where its first file comes)."""
        starts = self._open().index.sample_member_start
        owners = np.searchsorted(starts, np.asarray(self._members), side="right") - 1
        _, first = np.unique(owners, return_index=True)
        return owners[np.sort(first)].astype(np.int64)

    def __repr__(self) -> str:
        lines = [
            f"Dataset {type(self).__name__}",
            f"    Number of datapoints: {len(self)}",
            f"    Root location: {self.root}",
        ]
        for name in ("transform", "target_transform"):
            value = getattr(self, name)
            if value is not None:
                text = repr(value).replace("\n", "\n    ")
                lines.append(
                    f"    {'Transform' if name == 'transform' else 'Target transform'}: {text}"
                )
        return "\n".join(lines)

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
            image = self.loader(data) if self.loader is pil_loader else _load(self.loader, data)
        except Exception as exc:  # PIL names a BytesIO; the user needs the file
            path, _ = self.samples[index]
            chunk = store.chunk_location(int(store.index.member_chunk[member]))
            raise DecodeError(
                f"{path!r} (chunk {chunk}): the loader failed with {type(exc).__name__}: {exc} "
                "(its bytes match the checksum taken when it was packed, so the file itself is "
                f"not what the loader expects); {_remedy(exc)}",
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


def _remedy(exc: Exception) -> str:
    """What to do about a file the loader failed on: torchvision's own habit where there is
    one (PIL's switch for images an interrupted copy cut short), else fix, skip or re-pack."""
    either = (
        "fix or remove it and re-pack, or read the store with "
        "tierfeed.torch.Dataset(..., on_error='skip'), which leaves such a sample out"
    )
    if isinstance(exc, OSError) and "truncated" in str(exc):
        return (
            "`PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True` decodes it as far as it goes, "
            f"as with torchvision; or {either}"
        )
    return either


def _load(loader: Callable[[Any], Any], data: bytes) -> Any:
    """``loader(path)`` of a path that opens to ``data``: an in-memory file (a memfd), as
    torchvision's loaders open a path. The loader's own open outlives this one's close (a
    lazy PIL image reads on)."""
    fd = os.memfd_create("tierfeed-member", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return loader(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
