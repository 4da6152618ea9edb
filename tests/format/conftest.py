"""Fixtures for format tests: small trees written from {path: bytes} maps."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tierfeed.format.pack import PackOptions

Tree = Mapping[bytes, bytes]


def write_tree(root: Path, files: Tree) -> None:
    """Create ``root/<path>`` for every (bytes path, content) pair."""
    base = os.fsencode(root)
    for rel, data in files.items():
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)


def read_tree(root: Path) -> dict[bytes, bytes]:
    """Every regular file under ``root`` as {bytes relative path: content}."""
    base = os.fsencode(root)
    out: dict[bytes, bytes] = {}
    for dirpath, _, names in os.walk(base):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, base)] = fh.read()
    return out


QUIET = PackOptions(chunk_size=64 * 1024, workers=4, progress=False)


# A messy tree: files and directories of several modes and distinct mtimes, empty directories
# at the top (an empty class folder), nested, and inside a class. (path, mode, content or
# None for a directory); mtimes are set after everything exists, deepest first.
MESSY: list[tuple[bytes, int, bytes | None]] = [
    (b"cat", 0o750, None),
    (b"cat/a.jpg", 0o600, b"A" * 1500),
    (b"cat/b.jpg", 0o640, b"B" * 300),
    (b"cat/empty", 0o755, None),
    (b"cat/sub", 0o700, None),
    (b"cat/sub/c.jpg", 0o755, b"C" * 7000),
    (b"dog", 0o755, None),
    (b"dog/d.png", 0o444, b"D" * 20),
    (b"dog/e.txt", 0o644, b""),
    (b"empty_class", 0o700, None),
    (b"top.txt", 0o644, b"top"),
    (b"valid", 0o755, None),
    (b"valid/deeper", 0o750, None),
    (b"valid/deeper/deepest", 0o700, None),
]


def messy_mtime_ns(i: int) -> int:
    """A distinct mtime per entry, with a sub-second part."""
    return (1_600_000_000 + 86_400 * i) * 10**9 + 123_456_789 + i


def write_messy_tree(root: Path) -> None:
    """Create `MESSY` under ``root`` with its modes and mtimes."""
    base = os.fsencode(root)
    os.makedirs(base, exist_ok=True)
    for rel, _, data in MESSY:
        path = os.path.join(base, rel)
        if data is None:
            os.mkdir(path)
        else:
            with open(path, "wb") as fh:
                fh.write(data)
    # Deepest first, so that setting an entry's mode and mtime never touches its parent's.
    for i, (rel, mode, _) in sorted(enumerate(MESSY), key=lambda e: -e[1][0].count(b"/")):
        path = os.path.join(base, rel)
        os.chmod(path, mode)
        os.utime(path, ns=(messy_mtime_ns(i), messy_mtime_ns(i)))
