"""A column of another tool's dataset (an MDS column, a LitData leaf) as a tierfeed field: the
field's name, so that tierfeed's decoders read it back as the value it was, and one source
sample as the sample dict `tierfeed.Writer` takes.

The naming rule: a column keeps its name and gains the extension of what it holds
(``image`` of JPEG bytes -> ``image.jpg``, ``text`` -> ``text.txt``, ``vec`` -> ``vec.npy``),
unless its name already ends in that extension (``jpg`` stays ``jpg``, ``seg.png`` stays
``seg.png``); a column without a name (a LitData sample that is a single value) is the
extension alone. A list of images (``frames``) is one field per image: ``frames.0.png``,
``frames.1.png``, ... The label column is the field ``cls``, the sample's label.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tierfeed.errors import PackError
from tierfeed.format.codecs import IMAGE_FORMATS, field_ext
from tierfeed.format.encode import KEY_FIELD

__all__ = [
    "LABEL_FIELD",
    "PeerColumn",
    "PeerDataset",
    "decoded_utf8",
    "key_width",
    "safe_ext",
    "sample_of",
    "storage_names",
]

LABEL_FIELD = "cls"
# The image modes a PNG keeps unchanged (`tierfeed.format.codecs`); another mode goes to TIFF.
_PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I;16")
_EXT = re.compile(r"[a-z0-9]{1,16}(\.[a-z0-9]{1,16})?")
_LABEL_RANGE = (-1, 2**31)  # what a cls label may be (`tierfeed.format.labels.parse_cls`)


@dataclass(frozen=True)
class PeerColumn:
    """One column of a source dataset.

    Attributes:
        name: its name in the source (``"image"``; ``"meta.n"`` for a nested LitData leaf;
            ``"0"`` for the first item of a tuple sample; ``""`` for a sample that is one value).
        encoding: the source's name for its encoding (``"jpeg"``, ``"no_header_numpy:1"``).
        ext: the extension its values are stored under (``"jpg"``, ``"npy"``, ``"json"``).
        integer: its values are integers (a label column must be such a column).
        many: each value is a list of images, one field each.
    """

    name: str
    encoding: str
    ext: str
    integer: bool = False
    many: bool = False


class PeerDataset(Protocol):
    """A source dataset opened for conversion: its columns, and its samples in order."""

    kind: str  # "MDS" or "LitData", for reports
    columns: list[PeerColumn]
    samples: int
    files: int  # shards or chunks

    def __iter__(self) -> Iterator[tuple[str, list[Any]]]:
        """(where, one value per column) per sample, in the source's order; ``where`` names
        the shard and the sample for error messages."""
        ...


def safe_ext(text: str, default: str = "bin") -> str:
    """``text`` (lower-cased) when it is a plain extension (``jpg``, ``nii.gz``), else
    ``default``: an extension read from a source becomes part of a member's name."""
    text = text.lower()
    return text if _EXT.fullmatch(text) else default


def _same_codec(name_ext: str, ext: str) -> bool:
    image = IMAGE_FORMATS.get(name_ext)
    return name_ext == ext or (image is not None and image == IMAGE_FORMATS.get(ext))


def _field(column: PeerColumn, src: Path) -> str:
    if not column.name:
        return column.ext
    if "/" in column.name or "\0" in column.name:
        raise PackError(
            f"{src}: column {column.name!r}: a '/' or NUL in a column name cannot name a tar "
            "member; rename the column in the source"
        )
    if not column.many and _same_codec(field_ext(column.name), column.ext):
        return column.name
    return f"{column.name}.{column.ext}"


def storage_names(columns: Sequence[PeerColumn], label: str | None, src: Path) -> list[str]:
    """The field (or, for a list column, the field prefix) of each column; ``label`` names the
    column that becomes the label field ``cls``.

    Raises:
        PackError: ``label`` names no column, or one that does not hold integers; two columns
            would be one field.
    """
    names = [c.name for c in columns]
    if label is not None and label not in names:
        raise PackError(
            f"{src}: no column {label!r} for the label; the columns are "
            f"{', '.join(repr(n) for n in names)}"
        )
    fields = [LABEL_FIELD if c.name == label else _field(c, src) for c in columns]
    for column in columns:
        if column.name == label and not column.integer:
            raise PackError(
                f"{src}: the label column {label!r} holds {column.encoding} values; a label "
                "column holds integers (convert without --label-column to keep it as data)"
            )
    seen: dict[str, str] = {}
    for column, field in zip(columns, fields, strict=True):
        if field in seen:
            raise PackError(
                f"{src}: columns {seen[field]!r} and {column.name!r} would both be the field "
                f"{field!r}; rename one of them in the source"
            )
        seen[field] = column.name
    return fields


def _label(value: Any, where: str) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise PackError(f"{where}: the label is {value!r}, not an integer")
    low, high = _LABEL_RANGE
    if not low <= int(value) < high:
        raise PackError(
            f"{where}: the label {int(value)} is outside -1..2**31-1; convert without "
            "--label-column to keep the column as data"
        )
    return int(value)


def _stored(column: PeerColumn, value: Any) -> Any:
    """What the Writer is given for ``value``: bytes, a str, an array or an image as they
    are; a number or a JSON value as JSON text (NaN and infinities as Python writes them)."""
    if column.ext == "json" and not isinstance(value, bytes | memoryview):
        if isinstance(value, np.generic):
            value = value.item()
        return json.dumps(value, ensure_ascii=False).encode()
    return value


def _image_field(field: str, value: Any) -> str:
    """A decoded image's field: as named when PNG keeps its mode, else TIFF (lossless)."""
    mode = getattr(value, "mode", None)
    if mode is None or field_ext(field) != "png" or mode in _PNG_MODES:
        return field
    return field[: -len("png")] + "tiff"


def sample_of(
    key: str,
    columns: Sequence[PeerColumn],
    fields: Sequence[str],
    values: Sequence[Any],
    where: str,
) -> dict[str, Any]:
    """The Writer's sample dict for one source sample (values in column order)."""
    sample: dict[str, Any] = {KEY_FIELD: key}

    def put(name: str, value: Any) -> None:
        if name in sample:  # a list's field named like another column's
            raise PackError(f"{where}: two columns would be the field {name!r}")
        sample[name] = value

    for column, field, value in zip(columns, fields, values, strict=True):
        if field == LABEL_FIELD:
            put(field, _label(value, f"{where}, column {column.name!r}"))
        elif column.many:
            stem = field[: -len(column.ext)]
            for i, item in enumerate(value):
                put(_image_field(f"{stem}{i}.{column.ext}", item), item)
        else:
            put(_image_field(field, value), _stored(column, value))
    return sample


def key_width(samples: int) -> int:
    """Digits of the keys of ``samples`` samples: six, or more for a million or more."""
    return max(6, len(str(max(samples - 1, 0))))


def decoded_utf8(data: bytes | memoryview, where: str) -> str:
    """``data`` as UTF-8 text; PackError naming ``where`` when it is not."""
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as exc:
        raise PackError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
