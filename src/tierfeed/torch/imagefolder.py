"""`tierfeed.torch.ImageFolder`: torchvision's ImageFolder over a packed store, no torchvision."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from tierfeed.errors import ConfigError
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.store import Store, open_store

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "pil_loader"]

IMG_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")


def pil_loader(data: bytes) -> Any:
    """Decode image bytes to an RGB PIL image, as torchvision's default loader does."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


class ImageFolder(Dataset[tuple[Any, int]]):
    """A drop-in for ``torchvision.datasets.ImageFolder`` reading a packed store.

    ``(image, label)`` items, ``classes``, ``class_to_idx``, ``samples`` and ``targets`` as
    torchvision defines them. The store is opened lazily in each process, so DataLoader
    workers (fork or spawn) each get their own descriptors.

    Args:
        root: a store directory (made by ``tierfeed pack`` from an ImageFolder tree).
        transform: applied to the decoded image.
        target_transform: applied to the label.
        loader: bytes -> image; PIL RGB by default.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[bytes], Any] = pil_loader,
    ) -> None:
        self.root = Path(root)
        if not (self.root / INDEX_NAME).exists():
            raise ConfigError(
                f"{self.root}: not a tierfeed store; pack your ImageFolder tree once with "
                f"`tierfeed pack {self.root} STORE_DIR` and pass STORE_DIR here"
            )
        self.transform, self.target_transform, self.loader = transform, target_transform, loader
        self._store: Store | None = None
        self._pid = -1
        store = self._open()
        if not store.classes:
            raise ConfigError(
                f"{self.root}: the store has no classes (it was not packed from an ImageFolder "
                "tree); use tierfeed.torch.Dataset for unlabelled data"
            )
        ix = store.index
        self.classes: list[str] = list(store.classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._member = self._image_members(store)
        self.targets: list[int] = [int(ix.sample_label[s]) for s in range(len(store))]

    def _image_members(self, store: Store) -> list[int]:
        ix = store.index
        exts = {i for i, e in enumerate(ix.exts) if e.lower().lstrip(b".") in _IMG_BYTES}
        found = []
        for s in range(len(store)):
            members = [m for m in ix.members(s) if int(ix.member_ext[m]) in exts]
            if not members:
                raise ConfigError(f"{self.root}: sample {ix.key(s)!r} has no image file")
            found.append(members[0])
        return found

    def _open(self) -> Store:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self.root)  # a forked worker opens its own
            self._pid = os.getpid()
        return self._store

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(path inside the store's tree, label) per sample, as torchvision lists them."""
        ix = self._open().index
        return [
            (os.fsdecode(ix.member_path_bytes(m)), t)
            for m, t in zip(self._member, self.targets, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        store = self._open()
        image = self.loader(store.read_member(self._member[index]))
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


_IMG_BYTES = {e.encode() for e in IMG_EXTENSIONS}
