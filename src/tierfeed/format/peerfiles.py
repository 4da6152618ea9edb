"""The files of a dataset another tool wrote (MosaicML Streaming's MDS, LitData): its
``index.json``, and each shard read whole, its size and hashes checked against what the index
says, decompressed within the size the index gives.

Nothing here trusts a size it was told: a shard's length is compared with the file before a
byte of it is used, and a compressed shard is inflated at most to its stated size plus one
byte, so a damaged or hostile shard ends in a `PackError` naming it, never in an unbounded
allocation.
"""

from __future__ import annotations

import bz2
import hashlib
import importlib
import json
import os
import stat
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import xxhash

from tierfeed.errors import PackError

__all__ = [
    "INDEX_JSON",
    "check_compression",
    "check_hashes",
    "count_in",
    "decompress",
    "entry",
    "read_index_json",
    "read_shard",
    "shard_path",
]

INDEX_JSON = "index.json"
_MAX_INDEX_BYTES = 256 * 2**20  # an index of millions of shards stays well below
_BLOCK = 1 << 20  # bytes inflated per step


def read_index_json(src: Path) -> Any:
    """The parsed ``src/index.json``.

    Raises:
        PackError: ``src`` is not a directory holding a readable ``index.json`` of JSON text.
    """
    what = "convert takes the directory that MDSWriter or litdata.optimize wrote"
    if not src.is_dir():
        problem = "not a directory" if src.exists() else "no such directory"
        raise PackError(f"{src}: {problem}; {what}")
    path = src / INDEX_JSON
    if not path.exists():
        raise PackError(f"{src}: no {INDEX_JSON} here; {what}")
    data = read_shard(path, f"{path}")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PackError(f"{path}: not JSON text ({exc}); {what}") from None


def entry(obj: object, key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]``, which must be one of ``kinds`` (a bool is no int); PackError naming
    ``where`` (the index and the entry) otherwise."""
    if not isinstance(obj, dict) or key not in obj:
        raise PackError(f"{where}: no {key!r} in it; the index is damaged or of another version")
    value = obj[key]
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise PackError(f"{where}: {key!r} is {str(value)[:80]!r}, which the format does not allow")
    return value


def count_in(obj: object, key: str, where: str) -> int:
    """``obj[key]``, a whole number (0 or more)."""
    value: int = entry(obj, key, int, where)
    if value < 0:
        raise PackError(f"{where}: {key!r} is {value}, which the format does not allow")
    return value


def shard_path(src: Path, name: object, where: str) -> Path:
    """The file ``name`` (as the index gives it) inside ``src``; PackError for a name that is
    not a plain relative path (absolute, ``..``, empty, NUL), which could read outside it."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        raise PackError(f"{where}: file name {name!r} is not a relative path")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PackError(f"{where}: file name {name!r} leaves the dataset directory")
    return src.joinpath(*parts)


def read_shard(
    path: Path, where: str, size: int | None = None, limit: int = _MAX_INDEX_BYTES
) -> bytes:
    """Every byte of the regular file ``path``, which must be ``size`` bytes long, or (for
    None) at most ``limit`` bytes long."""
    try:
        # O_NONBLOCK: a FIFO put in a shard's place must not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PackError(f"{where}: cannot open it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PackError(f"{where}: not a regular file")
        if size is None and st.st_size > limit:
            raise PackError(f"{where}: {st.st_size} bytes, more than the {limit} it may have")
        if size is not None and st.st_size != size:
            raise PackError(
                f"{where}: {st.st_size} bytes, but the index says {size}: the file is "
                "truncated, damaged or not this dataset's; copy it again from the dataset's origin"
            )
        try:
            data = fh.read(st.st_size + 1)  # one more: a file that grew is not this one
        except OSError as exc:
            raise PackError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if len(data) != st.st_size:
        raise PackError(f"{where}: changed while it was read; convert again")
    return data


def _hasher(algo: str) -> Callable[[bytes], Any] | None:
    """The hash named as Streaming names it (hashlib's and xxhash's names), or None."""
    if algo in hashlib.algorithms_available and not algo.startswith("shake_"):
        return lambda data: hashlib.new(algo, data)
    return getattr(xxhash, algo, None) if algo in xxhash.algorithms_available else None


def check_hashes(data: bytes, hashes: object, where: str) -> None:
    """Check ``data`` against the ``{algorithm: hex digest}`` the index gives (an algorithm
    neither hashlib nor xxhash knows is skipped: the size was checked already)."""
    if not isinstance(hashes, Mapping):
        return
    for algo, digest in hashes.items():
        hasher = _hasher(str(algo))
        if hasher is not None and hasher(data).hexdigest() != digest:
            raise PackError(
                f"{where}: its {algo} hash is not the one the index gives: the file is damaged; "
                "copy it again from the dataset's origin"
            )


def _inflate_zlib(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip's header and trailer
    return _whole(inflater.decompress(data, limit), inflater.eof, limit)


def _inflate_bz2(data: bytes, limit: int) -> bytes:
    inflater = bz2.BZ2Decompressor()
    return _whole(inflater.decompress(data, max_length=limit), inflater.eof, limit)


def _whole(out: bytes, eof: bool, limit: int) -> bytes:
    """``out``, unless the stream ended before its end marker (a truncated file)."""
    if not eof and len(out) < limit:
        raise ValueError("the stream ends early")
    return out


def _zstd_module() -> Any:
    """Python 3.14's ``compression.zstd``, else the zstandard package (ModuleNotFoundError if
    neither is there)."""
    try:
        return importlib.import_module("compression.zstd")
    except ModuleNotFoundError:
        return importlib.import_module("zstandard")


def _inflate_zstd(data: bytes, limit: int) -> bytes:
    zstd = _zstd_module()
    if zstd.__name__ == "compression.zstd":
        return bytes(zstd.ZstdDecompressor().decompress(data, max_length=limit))
    parts: list[bytes] = []
    with zstd.ZstdDecompressor().stream_reader(data) as reader:
        while limit > 0 and (part := reader.read(min(limit, _BLOCK))):
            parts.append(part)
            limit -= len(part)
    return b"".join(parts)


# Streaming's compression name (before any ":level") -> inflater of (data, at most n bytes),
# and the module it needs beyond the standard library's.
_INFLATERS: dict[str, tuple[Callable[[bytes, int], bytes], Callable[[], Any] | None]] = {
    "gz": (_inflate_zlib, None),
    "bz2": (_inflate_bz2, None),
    "zstd": (_inflate_zstd, _zstd_module),
}


_REWRITE = "write the dataset again uncompressed or with compression='gz'"


def check_compression(
    compression: str, where: str, instead: str = _REWRITE
) -> Callable[[bytes, int], bytes]:
    """The inflater of ``compression`` (a ``:level`` suffix is ignored); ``instead`` says how
    to write the dataset again in a form tierfeed reads.

    Raises:
        PackError: a compression tierfeed cannot inflate here (brotli, snappy; zstd without
            Python 3.14 or the zstandard package), saying what to do.
    """
    name = compression.split(":", 1)[0]
    inflate, needs = _INFLATERS.get(name, (None, None))
    try:
        if inflate is None:
            raise ModuleNotFoundError(name)
        if needs is not None:
            needs()
    except ModuleNotFoundError:
        hint = "pip install zstandard (or use Python 3.14), or " if name == "zstd" else ""
        raise PackError(
            f"{where}: compressed with {compression!r}, which tierfeed cannot decompress here "
            f"(it reads gz, bz2 and zstd); {hint}{instead}"
        ) from None
    return inflate


def decompress(
    data: bytes, compression: str, size: int, where: str, instead: str = _REWRITE
) -> bytes:
    """``data`` inflated with ``compression`` (`check_compression`), which must give exactly
    ``size`` bytes.

    Raises:
        PackError: a compression tierfeed cannot inflate here, or data that does not inflate
            to ``size`` bytes.
    """
    inflate = check_compression(compression, where, instead)
    try:
        out = inflate(data, size + 1)
    except Exception as exc:  # zlib.error, OSError, ValueError; zstandard's own classes
        raise PackError(f"{where}: does not decompress as {compression!r} ({exc})") from None
    if len(out) != size:
        raise PackError(
            f"{where}: decompresses to {'more than ' if len(out) > size else ''}"
            f"{min(len(out), size)} bytes, but the index says {size}: the file is damaged"
        )
    return out
