"""WebDataset labels: a sample's ``cls`` (or ``cls2``) member holds its class as integer text.

One rule for `tierfeed index` and `tierfeed.Writer`: with ``labels="auto"`` a store whose
samples carry a ``.cls`` member (``.cls2`` when a sample has no ``.cls``) takes its labels from
there, and the ImageFolder rule of pack (the first directory of the key) applies otherwise.
Class names come from a ``classes.txt``-style map (line ``i`` names class ``i``) when one is
given, else class ``i`` is named ``"i"``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from tierfeed.errors import PackError
from tierfeed.format.source import assign_labels

__all__ = [
    "CLS_EXTS",
    "CLS_MAX_BYTES",
    "LABEL_MODES",
    "MAX_UNNAMED_CLASSES",
    "load_classes",
    "parse_cls",
    "resolve_labels",
]

LABEL_MODES = ("auto", "cls", "folder", "none")
CLS_EXTS = (b".cls", b".cls2")  # in order of preference
CLS_MAX_BYTES = 32  # integer text, maybe with spaces or a newline; more is not a label
MAX_UNNAMED_CLASSES = 1 << 20  # labels this large need a classes map (names for every class)
_MAX_CLASSES_FILE = 64 * 2**20


def parse_cls(text: bytes, where: str) -> int:
    """The label in a ``cls`` member: decimal integer text, -1 (unlabelled) or more.

    Raises:
        PackError: naming ``where``, when the text is not such an integer.
    """
    stripped = text.strip() if len(text) <= CLS_MAX_BYTES else b""
    digits = stripped[1:] if stripped[:1] in (b"-", b"+") else stripped
    if not digits.isdigit() or not digits.isascii():
        raise PackError(
            f"{where}: a cls label must be integer text (such as b'3'), got "
            f"{text[:CLS_MAX_BYTES]!r}; fix the sample, or pass labels='none' (--labels none) "
            "to keep cls as plain data"
        )
    value = int(stripped)
    if not -1 <= value < 2**31:
        raise PackError(f"{where}: cls label {value} outside [-1, 2**31)")
    return value


def load_classes(classes: str | os.PathLike[str] | Sequence[str]) -> list[str]:
    """Class names from a list, or from a file naming class ``i`` on line ``i`` (UTF-8).

    Raises:
        PackError: the file cannot be read, is not UTF-8 text, or names a class twice.
    """
    if isinstance(classes, str | os.PathLike):
        path = Path(classes)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
                raise PackError(f"{path}: the classes file is not a regular file")
            with open(path, "rb") as fh:
                raw = fh.read(_MAX_CLASSES_FILE + 1)
        except OSError as exc:
            raise PackError(
                f"{path}: cannot read the classes file ({exc.strerror or exc})"
            ) from None
        if len(raw) > _MAX_CLASSES_FILE:
            raise PackError(f"{path}: classes file larger than {_MAX_CLASSES_FILE} bytes")
        try:
            names = [line.strip() for line in raw.decode("utf-8").splitlines()]
        except UnicodeDecodeError:
            raise PackError(f"{path}: the classes file is not UTF-8 text") from None
        while names and not names[-1]:
            names.pop()
        where = str(path)
    else:
        names, where = list(classes), "classes"
        if not all(isinstance(n, str) for n in names):
            raise PackError(f"{where}: class names must be str, one per class")
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise PackError(f"{where}: class {name!r} is named twice (again for class {i})")
        seen.add(name)
    return names


def resolve_labels(
    keys: list[bytes],
    cls: Sequence[int | None],
    mode: str,
    classes: list[str] | None,
    where: Path | str,
) -> tuple[list[int], list[str]]:
    """Labels and class names of a store's samples.

    Args:
        keys: sample keys in store order.
        cls: each sample's ``cls`` label, None where it has none.
        mode: ``auto`` (``cls`` labels when any sample has one, else the folder rule),
            ``cls`` (every sample must have one), ``folder`` or ``none`` (as for pack).
        classes: names of the classes of ``cls`` labels, or None to name class ``i`` ``"i"``.
        where: the store, for error messages.

    Returns:
        (label per sample, class names).
    """
    if mode not in LABEL_MODES:
        raise PackError(f"{where}: labels must be one of {', '.join(LABEL_MODES)}, got {mode!r}")
    use_cls = mode == "cls" or (mode == "auto" and any(c is not None for c in cls))
    if not use_cls:
        if classes is not None and mode != "none":
            raise PackError(
                f"{where}: a classes map names cls labels, but no sample has a cls member "
                "(cls or cls2); drop the map, or give the samples their cls"
            )
        return assign_labels(keys, mode, Path(where))
    missing = next((k for k, c in zip(keys, cls, strict=True) if c is None), None)
    if mode == "cls" and missing is not None:
        raise PackError(
            f"{where}: labels 'cls' needs a cls member in every sample, but sample "
            f"{os.fsdecode(missing)!r} has none"
        )
    return _cls_labels(keys, [-1 if c is None else c for c in cls], classes, where)


def _cls_labels(
    keys: list[bytes], labels: list[int], classes: list[str] | None, where: Path | str
) -> tuple[list[int], list[str]]:
    """The ``cls`` labels (-1: none) and the class names: ``classes``, which must name every
    label, or ``"0"``, ``"1"``, ... up to the largest label."""
    top = max(labels, default=-1)
    if classes is None:
        if top >= MAX_UNNAMED_CLASSES:
            raise PackError(
                f"{where}: cls label {top} needs {top + 1} classes; give a classes map (one name "
                f"per class) for more than {MAX_UNNAMED_CLASSES} classes"
            )
        return labels, [str(i) for i in range(top + 1)]
    if top >= len(classes):
        key = keys[labels.index(top)]
        raise PackError(
            f"{where}: sample {os.fsdecode(key)!r} has cls label {top}, but the classes map "
            f"names only {len(classes)} classes"
        )
    return labels, classes
