"""Sample keys, extensions and member paths: one file per sample, WebDataset grouping, and
the tar-slip guard.

Paths are handled as bytes (``/``-separated, relative to the store root) so that names which
are not valid UTF-8 round-trip exactly; the public API shows them as ``os.fsdecode`` strings.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence

from tierfeed.errors import BadMemberError

__all__ = [
    "GROUPINGS",
    "field_name",
    "fields_of",
    "label_dir",
    "normalize_member_name",
    "split_file",
    "split_for",
    "split_key",
]

GROUPINGS = ("file", "key")  # how files of a tree become samples (see `split_for`)
_EXT_MAX = 16  # longer "extensions" are part of the name (``data.2024-01-01``)


def split_key(path: bytes) -> tuple[bytes, bytes]:
    """Split a member path into (key, ext) the way WebDataset groups samples.

    The key is the path up to the first dot of its last component; ``ext`` keeps the dot, so
    ``key + ext == path`` always holds: ``b"cat/x.1.jpg" -> (b"cat/x", b".1.jpg")``,
    ``b"README" -> (b"README", b"")``.
    """
    slash = path.rfind(b"/")
    dot = path.find(b".", slash + 1)
    if dot < 0:
        return path, b""
    return path[:dot], path[dot:]


def split_file(path: bytes) -> tuple[bytes, bytes]:
    """Split a file's path into (key, ext) when each file of a tree is a sample of its own.

    The extension is what follows the last dot of the last component, when it is a short run of
    letters, digits and underscores and the dot does not start the name; otherwise the file has
    none. ``key + ext == path`` always holds: ``b"fish/photo.v2.jpg" -> (b"fish/photo.v2",
    b".jpg")``, ``b"cat/.DS_Store" -> (b"cat/.DS_Store", b"")``, ``b"log.2024-01-01" ->
    (b"log.2024-01-01", b"")``.
    """
    slash = path.rfind(b"/")
    dot = path.rfind(b".")
    ext = path[dot + 1 :]
    if dot <= slash + 1 or not ext or len(ext) > _EXT_MAX:
        return path, b""
    if not ext.replace(b"_", b"").isalnum() or not ext.isascii():
        return path, b""
    return path[:dot], path[dot:]


def split_for(grouping: str) -> Callable[[bytes], tuple[bytes, bytes]]:
    """The key rule of a grouping: ``file`` (one file, one sample) or ``key`` (WebDataset)."""
    return split_file if grouping == "file" else split_key


def field_name(ext: bytes) -> str:
    """The field name of a member in a Sample: the extension without its leading dot."""
    return os.fsdecode(ext[1:] if len(ext) > 1 else ext)


def fields_of(
    exts: Sequence[int], data: Sequence[bytes], names: Sequence[str], lowered: Sequence[str]
) -> dict[str, bytes]:
    """A sample's fields from its members' extension ids and bytes, given each extension's
    field name (`field_name`) and that name lower-cased: named in lower case, as WebDataset
    names fields (``UPPER.JPG`` is a ``"jpg"`` field, as torchvision's ImageFolder selects
    it), except where the sample holds one extension in two cases (``s.jpg`` and ``s.JPG``):
    those keep the case they were packed with, so that no field hides another."""
    fields = {lowered[e]: d for e, d in zip(exts, data, strict=True)}
    if len(fields) == len(exts):
        return fields
    seen = Counter(lowered[e] for e in exts)
    return {
        lowered[e] if seen[lowered[e]] == 1 else names[e]: d
        for e, d in zip(exts, data, strict=True)
    }


def label_dir(path: bytes) -> bytes | None:
    """The ImageFolder class directory of a path (its first component), or None at top level."""
    slash = path.find(b"/")
    return path[:slash] if slash > 0 else None


def normalize_member_name(name: str, where: str) -> bytes:
    """Check a member name from an untrusted tar and return it as a safe relative path.

    ``./`` and empty components are dropped (``tar -C dir -cf x.tar .`` writes them). A name
    that is absolute, contains a ``..`` component or NUL, or is empty is refused.

    Args:
        name: the member name as tarfile decoded it (surrogateescape).
        where: the shard path, for the error message.

    Raises:
        BadMemberError: naming the shard and the member.
    """
    raw = os.fsencode(name)
    if b"\x00" in raw:
        raise BadMemberError(f"{where}: member {name!r} contains a NUL byte")
    if raw.startswith(b"/"):
        raise BadMemberError(f"{where}: member {name!r} is an absolute path")
    parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
    if b".." in parts:
        raise BadMemberError(f"{where}: member {name!r} has a '..' component")
    if not parts:
        raise BadMemberError(f"{where}: member {name!r} has an empty name")
    return b"/".join(parts)
