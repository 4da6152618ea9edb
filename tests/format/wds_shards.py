"""WebDataset shard sets for the `tierfeed index` tests: real tar files (``KEY.jpg`` and
``KEY.cls`` members), a read-only shard directory, and what reading a store back gave."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Samples = dict[str, dict[str, bytes]]  # key -> {field: bytes}


def write_shard(path: Path, samples: Samples) -> None:
    """A tar of ``samples`` as WebDataset's TarWriter lays it out: each key's members
    together, ``KEY.jpg`` then ``KEY.cls``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in samples.items():
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 1_700_000_000
                tar.addfile(info, io.BytesIO(data))


def make_shards(where: Path, shards: int = 4, per_shard: int = 6, prefix: str = "") -> Samples:
    """``shard-000000.tar``... in ``where``; returns every sample written, by key."""
    every: Samples = {}
    for s in range(shards):
        samples = {
            f"{prefix}s{s}_{i:04d}": {
                "jpg": os.urandom(300 + 37 * i + 101 * s),
                "cls": str((s + i) % 3).encode(),
            }
            for i in range(per_shard)
        }
        write_shard(where / f"shard-{s:06d}.tar", samples)
        every |= samples
    return every


def gzip_copy(tar: Path, target: Path) -> Path:
    """A ``.tar.gz`` (or ``.tgz``) of ``tar`` at ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tar.open("rb") as src, gzip.open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return target


def make_read_only(where: Path) -> None:
    """Directories 0o555 and files 0o444 (tests run as root, who may write anyway: a test
    compares `snapshot`s too)."""
    for path in sorted(where.rglob("*"), reverse=True):
        if not path.is_symlink():
            path.chmod(0o555 if path.is_dir() else 0o444)
    where.chmod(0o555)


def make_writable(where: Path) -> None:
    """Undo `make_read_only` (so that tmp_path can be removed)."""
    where.chmod(0o755)
    for path in where.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def snapshot(where: Path) -> list[tuple[str, str, int, int, int]]:
    """Every entry under ``where`` (itself too): name, kind, size, mode, mtime (ns), by lstat:
    equal before and after means nothing there was made, removed, replaced or written."""
    out = []
    for path in sorted([where, *where.rglob("*")]):
        st = path.lstat()
        kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if path.is_dir() else "file"
        out.append((str(path.relative_to(where)), kind, st.st_size, st.st_mode, st.st_mtime_ns))
    return out


def read_back(batches: Iterable[dict[str, Any]]) -> Samples:
    """Every sample in ``batches`` (the default decode's dict batches), by key; a key met
    twice fails (every sample once)."""
    got: Samples = {}
    for batch in batches:
        for i, key in enumerate(batch["__key__"]):
            assert key not in got, f"{key} delivered twice"
            got[key] = {"jpg": batch["jpg"][i], "cls": batch["cls"][i]}
    return got
