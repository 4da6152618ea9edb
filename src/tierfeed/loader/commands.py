"""CLI subcommands that take a store by path or URL: index (where the shards lie), inspect,
verify (`tierfeed pack` is registered by `tierfeed.cli`).

A URL (``s3://bucket/ds``) is read with the environment's credentials and endpoint
(``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...): its index is fetched into the user's cache
(`tierfeed.loader.location`), and `verify` copies each chunk in turn to a temporary file
there, checks it as it checks a local one, and names the chunk by its URL.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tierfeed.config import default_cache_dir
from tierfeed.errors import ChunkCorruptError, StorageError, TierfeedError
from tierfeed.format.commands import register_index as register_local_index
from tierfeed.format.verify import ChunkFetch, summarize, verify_store
from tierfeed.loader import urlshards
from tierfeed.loader.location import StoreLocation
from tierfeed.storage import Driver
from tierfeed.units import human

__all__ = [
    "register_index",
    "register_inspect",
    "register_verify",
    "verify_location",
]


def register_index(sub: Any) -> None:
    """Add `tierfeed index`, of shards in a directory or at URLs, into a directory or at the
    shards' URL (only the index is uploaded)."""
    register_local_index(sub, urlshards.index_shards)


def _run_inspect(args: argparse.Namespace) -> int:
    s = summarize(StoreLocation.of(args.store).open_index())
    print(f"store     {args.store}")
    print(f"samples   {s.samples}")
    print(f"files     {s.members}")
    mean_chunk = human(s.chunk_bytes / max(s.chunks, 1))
    print(f"chunks    {s.chunks} ({human(s.chunk_bytes)}, mean {mean_chunk})")
    if s.chunk_root is not None:
        print(f"shards    {s.chunk_root} (the chunks: read there, never written)")
    print(
        f"data      {human(s.data_bytes)} (mean sample {human(s.data_bytes / max(s.samples, 1))})"
    )
    shown = ", ".join(s.classes[:8]) + (", ..." if len(s.classes) > 8 else "")
    print(f"classes   {len(s.classes)}" + (f" ({shown})" if s.classes else ""))
    print("exts      " + ", ".join(f"{e or '(none)'}: {n}" for e, n in s.exts.items()))
    print("sample sizes:")
    peak = max((c for _, c in s.size_histogram), default=1)
    for bound, count in s.size_histogram:
        bar = "#" * max(1, round(40 * count / peak))
        print(f"  <= {human(bound):>10}  {count:>10}  {bar}")
    return 0


def register_inspect(sub: Any) -> None:
    """Add `tierfeed inspect`."""
    p = sub.add_parser("inspect", help="summarise a store: samples, chunks, classes, sizes")
    p.add_argument("store", help="store directory, index file, or URL (s3://bucket/ds)")
    p.set_defaults(func=_run_inspect)


def verify_location(location: StoreLocation, progress: bool = True) -> list[str]:
    """`verify_store` for a store by path or URL: the problems found (empty: good). Chunks
    at a URL (the store's, or the shards' its local index records) are checked there."""
    try:  # a URL's through the checked cache directory; no stamp spares its checks (bit rot)
        index = location.open_index(recheck=True)
    except TierfeedError as exc:
        return [str(exc)]
    if not location.remote and index.chunk_url is None:
        return verify_store(index, progress)
    scratch = default_cache_dir()  # made 0700 and checked
    with (
        index,  # verify_store closes it too; a second close is a no-op
        location.chunk_origin(index) as origin,
        tempfile.TemporaryDirectory(dir=scratch, prefix=".verify-") as tmp,
    ):
        root = location.chunks_at(index)
        return verify_store(index, progress, _fetcher(origin, root, Path(tmp)))


def _fetcher(origin: Driver, root: str, scratch: Path) -> ChunkFetch:
    """Copies of the chunks at ``origin`` in ``scratch``, one at a time."""

    @contextlib.contextmanager
    def fetch(name: str, want: int) -> Iterator[tuple[Path, str]]:
        local = scratch / "chunk.tar"
        size = origin.size(name)
        if size != want:  # checked before a byte is copied: the listing may be hostile
            raise ChunkCorruptError(
                f"chunk {root}/{name}: size {size} bytes, the index says {want} (truncated?)"
            )
        try:
            origin.get_file(name, local)
        except StorageError:  # the store's own error (an OSError too): as it is
            raise
        except OSError as exc:  # the local copy
            raise StorageError(
                f"{scratch}: cannot hold a copy of {root}/{name} to check it ({exc.strerror}); "
                "free space or point TIERFEED_CACHE at a larger local directory"
            ) from None
        try:
            yield local, f"{root}/{name}"
        finally:
            local.unlink(missing_ok=True)

    return fetch


def _run_verify(args: argparse.Namespace) -> int:
    problems = verify_location(StoreLocation.of(args.store), progress=not args.quiet)
    for problem in problems:
        print(f"BAD: {problem}")
    if problems:
        print(f"{len(problems)} problem(s) in {args.store}")
        return 1
    print(f"ok: {args.store}")
    return 0


def register_verify(sub: Any) -> None:
    """Add `tierfeed verify`."""
    p = sub.add_parser("verify", help="check every chunk checksum and the index; exit 1 if bad")
    p.add_argument("store", help="store directory, index file, or URL (s3://bucket/ds)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_verify)
