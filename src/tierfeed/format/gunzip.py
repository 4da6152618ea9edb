"""Gzipped tar shards (``.tar.gz``, ``.tgz``), decompressed once into the store directory.

A tar inside gzip cannot be read by byte range, so `tierfeed index` writes each gzipped shard
as a plain tar into the store directory (``--out``), keeping its path below the directory
that holds them all, with ``.tar`` for ``.tar.gz``/``.tgz``, and indexes that: the plain tar
is checked as any shard is (`tierfeed.format.tarscan`), and gzip's own CRC-32 and length of
each stream are checked as it is decompressed. Before writing it says, in one line on
stderr, how many bytes it will write and how much space is free, and refuses at once where
they do not fit. The bytes come from each stream's gzip trailer, which holds the length
modulo 4 GiB: exact below that, otherwise the least the compressed size allows.

Each plain tar is written under a temporary name and renamed when whole; its mtime is set to
the gzipped shard's. A later run (a re-index, one that failed on a bad member) keeps a plain
tar whose mtime and length still match its gzipped shard instead of decompressing it again.
The gzipped shards are only read.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import stat
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tierfeed.errors import ChunkCorruptError, FormatError, PackError
from tierfeed.format.packplan import OWNER_BITS, SHARED_READ
from tierfeed.format.tarscan import open_shard
from tierfeed.publish import publishing
from tierfeed.units import human

__all__ = ["GZIP_SUFFIXES", "Gunzip", "gunzip_shards", "is_gzipped", "plan_gunzip"]

GZIP_SUFFIXES = (".tar.gz", ".tgz")
_MAGIC = b"\x1f\x8b"
_BLOCK = 1 << 20  # decompressed bytes read and written at a time
_MARGIN = 1 << 30  # free space left beside the plain tars


def is_gzipped(shard: Path) -> bool:
    """Whether ``shard`` is named as a gzipped tar."""
    return shard.name.endswith(GZIP_SUFFIXES)


@dataclass(frozen=True)
class Gunzip:
    """One gzipped shard and the plain tar it becomes in the store directory."""

    source: Path
    target: Path
    size: int  # the plain tar's bytes, from the gzip trailer
    mode: int  # the plain tar's permission bits: the owner's, and the shard's read bits
    kept: bool  # an earlier run's plain tar, still matching: not written again


def _plain_name(name: str) -> str:
    return name[: -len(".gz")] if name.endswith(".tar.gz") else name[: -len(".tgz")] + ".tar"


def _trailer(source: Path) -> tuple[os.stat_result, int]:
    """The shard's stat and the length its gzip trailer gives (see the module's note)."""
    fd = open_shard(source)  # non-blocking; refuses anything but a regular file
    try:
        st = os.fstat(fd)
        head = os.pread(fd, 2, 0)
        tail = os.pread(fd, 4, max(st.st_size - 4, 0))
    except OSError as exc:
        raise FormatError(f"{source}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if head != _MAGIC or st.st_size < 18:  # header and trailer: 18 bytes at least
        raise ChunkCorruptError(
            f"{source}: named as a gzipped tar but is not gzip data; rename it .tar if it is "
            "a plain tar, or copy it again"
        )
    low = int.from_bytes(tail, "little")
    least = max(0, st.st_size - st.st_size // 1000 - 4096)  # deflate grows data by < 0.1%
    wraps = max(0, -(-(least - low) // 2**32))
    return st, low + wraps * 2**32


def plan_gunzip(sources: Sequence[Path], store: Path) -> list[Gunzip]:
    """Where each gzipped shard of ``sources`` is decompressed to in ``store``, its size, and
    whether an earlier run's plain tar is kept."""
    absolute = [s.absolute() for s in sources]
    if not absolute:
        return []
    top = Path(os.path.commonpath([s.parent for s in absolute]))
    plan = []
    for source in absolute:
        rel = source.relative_to(top)
        target = store / rel.with_name(_plain_name(rel.name))
        st, size = _trailer(source)
        if os.path.realpath(target) == os.path.realpath(source):
            raise PackError(f"{source}: would be decompressed onto itself; choose another --out")
        mode = OWNER_BITS | (st.st_mode & SHARED_READ)
        plan.append(Gunzip(source, target, size, mode, _still_good(target, st, size)))
    return plan


def _still_good(target: Path, source: os.stat_result, size: int) -> bool:
    """Whether ``target`` is a plain tar an earlier run wrote from this very shard."""
    try:
        st = target.lstat()
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_mtime_ns == source.st_mtime_ns
        and st.st_size % 2**32 == size % 2**32
    )


def gunzip_shards(plan: Sequence[Gunzip], store: Path, progress: bool = True) -> None:
    """Say what decompressing costs, check it fits, then write each plain tar not kept.

    Raises:
        PackError: the plain tars do not fit in the free space, or cannot be written.
        ChunkCorruptError: a gzip stream is damaged or cut short (named).
    """
    todo = [g for g in plan if not g.kept]
    need = sum(g.size for g in todo)
    free = shutil.disk_usage(_existing(store)).free
    kept = len(plan) - len(todo)
    if not todo:
        print(
            f"tierfeed: {kept} gzipped shard(s) decompressed into {store} before: kept",
            file=sys.stderr,
        )
        return
    if need + _MARGIN > free:  # (the error is the one line then)
        raise PackError(
            f"{store}: the {len(todo)} gzipped shard(s) decompress to {human(need)} and "
            f"{human(free)} is free (less a {human(_MARGIN)} margin); free space or give "
            "--out on a larger disk"
        )
    kept_text = f"; {kept} decompressed by an earlier run, kept" if kept else ""
    print(
        f"tierfeed: decompressing {len(todo)} gzipped shard(s) once into {store}: "
        f"{human(need)} to write (as their gzip trailers say), {human(free)} free{kept_text}",
        file=sys.stderr,
    )
    from tqdm import tqdm  # (only where shards are decompressed: `GZIP_SUFFIXES` is cheap)

    total = sum(g.source.stat().st_size for g in todo)
    with tqdm(total=total, unit="B", unit_scale=True, desc="gunzip", disable=not progress) as bar:
        for g in todo:
            _gunzip_one(g, bar.update)


def _existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists (where free space is measured)."""
    return next(p for p in (path, *path.parents) if p.exists())


def _gunzip_one(g: Gunzip, on_bytes: Callable[[int], object]) -> None:
    fd = open_shard(g.source)
    try:
        g.target.parent.mkdir(parents=True, exist_ok=True)
        with (
            os.fdopen(fd, "rb", closefd=False) as raw,
            gzip.GzipFile(fileobj=raw, mode="rb") as stream,
            publishing(g.target, mode=g.mode) as out,
        ):
            done = 0
            while block := stream.read(_BLOCK):
                out.write(block)
                on_bytes(raw.tell() - done)
                done = raw.tell()
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ChunkCorruptError(
            f"{g.source}: damaged gzip stream ({exc}); copy the shard again"
        ) from None
    except OSError as exc:  # reading the shard, or writing its plain tar (a full disk)
        raise PackError(
            f"{g.target}: cannot decompress {g.source} there: {exc.strerror or exc}"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    st = g.source.stat()
    os.utime(g.target, ns=(st.st_atime_ns, st.st_mtime_ns))
