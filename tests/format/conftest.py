"""Fixtures for format tests: small trees written from {path: bytes} maps."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tierfeed.format.pack import PackOptions, pack

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


@pytest.fixture
def packed(tmp_path: Path) -> Callable[..., Path]:
    """Write a tree and pack it; returns the store directory."""

    def make(files: Tree, options: PackOptions = QUIET) -> Path:
        src, dst = tmp_path / "src", tmp_path / "store"
        write_tree(src, files)
        pack(src, dst, options)
        return dst

    return make
