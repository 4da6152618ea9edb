"""A sample given from Python (``{"__key__": ..., "jpg": bytes, "cls": 3}``) as tar members.

The rules, shared by `tierfeed.Writer` and `tierfeed.optimize`:

- ``__key__`` (str) names the sample; without one the writer gives it a generated key (see
  `Writer`). A key is a relative ``/``-separated path: not empty, not absolute, no ``.``, ``..``
  or empty component, no NUL: exactly the keys `pack` makes. A dot in its last component is
  allowed (``fish/photo.v2``, from a tree packed one file per sample): the index keeps key and
  extension apart, but a WebDataset reader of the tar files alone (or `tierfeed index`) would
  split that name at its first dot.
- Every other entry is a field, stored as member ``key + "." + field``, or as ``key`` itself
  for the field ``""`` (a file without an extension: ``README``); fields are sorted by name in
  the chunk. A field name holds no ``/`` or NUL. Two samples whose members would have one path
  (``a.b`` + ``c`` and ``a`` + ``b.c``), or a member path that is another key's directory,
  are refused by the writer. Other entries named like ``__url__`` (WebDataset's metadata) are
  not stored.
- Values: ``bytes``, ``bytearray`` or ``memoryview`` are stored as they are, ``str`` as UTF-8;
  other values by the field's extension, as WebDataset's encoders do (`tierfeed.format.codecs`:
  an ``int`` in ``cls``, a dict in ``json``, a PIL image or uint8 array in ``jpg``/``png``, a
  numpy array in ``npy``, a tensor in ``pt``). A numpy scalar or 0-d tensor is stored as the
  Python number it holds (``np.int64(3)`` in ``cls`` as ``3``), a bool in ``cls`` as ``1`` or
  ``0``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tierfeed.errors import BadMemberError, PackError
from tierfeed.format.codecs import encode_field
from tierfeed.format.labels import CLS_EXTS, parse_cls

__all__ = ["KEY_FIELD", "EncodedSample", "check_key", "encode_sample"]

KEY_FIELD = "__key__"


@dataclass(frozen=True)
class EncodedSample:
    """A sample as members: its key, (ext, data) sorted by ext, and its cls label if any."""

    key: bytes
    members: list[tuple[bytes, bytes | memoryview]]
    cls: int | None


def check_key(key: object) -> bytes:
    """A sample key as stored bytes; BadMemberError naming it when it is not a safe key."""
    if not isinstance(key, str):
        raise BadMemberError(f"sample key {key!r}: __key__ must be a str, not {type(key).__name__}")
    raw = os.fsencode(key)
    problem = ""
    parts = raw.split(b"/")
    if not raw:
        problem = "is empty"
    elif b"\0" in raw:
        problem = "contains a NUL byte"
    elif raw.startswith(b"/"):
        problem = "is an absolute path"
    elif b".." in parts:
        problem = "has a '..' component"
    elif any(p in (b"", b".") for p in parts):
        problem = "has an empty or '.' component"
    if problem:
        raise BadMemberError(f"sample key {key!r} {problem}; give a relative path such as 'cat/x1'")
    return raw


def encode_sample(
    sample: Mapping[str, Any], default_key: str, want_cls: bool, quality: int = 95
) -> EncodedSample:
    """Check ``sample`` and turn it into members.

    Args:
        sample: the user's mapping of field name to value (and ``__key__``).
        default_key: the key when ``sample`` has no ``__key__``.
        want_cls: parse ``cls`` (or ``cls2``) as the sample's label.
        quality: of the images a jpg or webp field encodes (`tierfeed.format.codecs`).

    Raises:
        BadMemberError: an unsafe key or field name.
        PackError: a value of another type, no field at all, or a cls that is not integer text.
    """
    if not isinstance(sample, Mapping):
        raise PackError(f"a sample must be a dict of fields, not {type(sample).__name__}")
    key_text = sample.get(KEY_FIELD, default_key)
    key = check_key(key_text)
    members: list[tuple[bytes, bytes | memoryview]] = []
    for name, value in sample.items():
        if not isinstance(name, str):
            raise BadMemberError(f"sample {key_text!r}: field name {name!r} is not a str")
        if name.startswith("__") and name.endswith("__"):
            continue  # __key__ and WebDataset's metadata (__url__, __local_path__)
        if "/" in name or "\0" in name:
            raise BadMemberError(f"sample {key_text!r}: field name {name!r} holds '/' or NUL")
        suffix = b"." + os.fsencode(name) if name else b""  # "": the key is the file's path
        members.append((suffix, encode_field(str(key_text), name, value, quality)))
    if not members:
        raise PackError(f"sample {key_text!r} has no field to store")
    members.sort(key=lambda m: m[0])
    cls: int | None = None
    if want_cls:
        found = {ext: data for ext, data in members if ext in CLS_EXTS}
        ext = next((e for e in CLS_EXTS if e in found), None)
        if ext is not None:
            cls = parse_cls(bytes(found[ext]), f"sample {key_text!r}: field {ext[1:].decode()!r}")
    return EncodedSample(key, members, cls)
