"""`tierfeed merge`'s checks of the parts, several parts at once: each part's index whole, and
its chunks as `tierfeed verify` checks them where they are not as the part wrote them."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tqdm import tqdm

from tierfeed.errors import PackError, TierfeedError
from tierfeed.format.index import Index
from tierfeed.format.indexparts import KIND, check_shards
from tierfeed.format.relpath import safe_chunk_path
from tierfeed.format.verify import check_index, verify_index

__all__ = ["THREADS", "changed_chunks", "in_order", "verify_parts"]

THREADS = min(4, os.cpu_count() or 1)  # parts checked at once
_T = TypeVar("_T")


def in_order(
    job: Callable[[int], _T], count: int, bar: tqdm[Any], done: Callable[[_T], None]
) -> list[_T]:
    """``job(i)`` for every i below ``count``, several at once (the checks are numpy's, which
    lets go of the GIL), the results in order; the first error in that order is raised, the
    jobs not begun are dropped, and ``done`` is called on every result made meanwhile."""
    results: list[_T] = []
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(job, i) for i in range(count)]
        try:
            for future in futures:
                results.append(future.result())
                bar.update()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            for future in futures[len(results) :]:
                if future.done() and not future.cancelled() and future.exception() is None:
                    done(future.result())
            for result in results:
                done(result)
            raise
    return results


def verify_parts(parts: list[Index], progress: bool, everything: bool) -> int:
    """Each part's index whole, and its chunks as `tierfeed verify` checks them: every chunk
    when ``everything``, else those not as the part wrote them (`changed_chunks`); refuses the
    first problem in part order. Returns how many chunks were read again."""
    shards = parts[0].header["extra"]["part"].get("kind") == KIND

    def problems(i: int) -> tuple[list[str], int]:  # each part opened with a full check
        if shards:  # the shards lie where they are: a stat each (below), not a second read
            return check_index(parts[i]), 0
        ix = parts[i]
        chunks = range(ix.num_chunks) if everything else changed_chunks(ix)
        return verify_index(ix, progress=False, chunks=chunks), len(chunks)

    with tqdm(total=len(parts), unit="part", desc="verify", disable=not progress) as bar:
        found = in_order(problems, len(parts), bar, lambda _: None)
    for ix, (problem, _) in zip(parts, found, strict=True):
        if problem:
            more = f" ({len(problem)} problems in all)" if len(problem) > 1 else ""
            again = "index it again" if shards else "pack it again"
            raise PackError(
                f"{problem[0]}{more}; the part {ix.path.parent} is damaged: {again} "
                "with --overwrite"
            )
    if shards:
        check_shards(parts)
    return sum(read for _, read in found)


def changed_chunks(ix: Index) -> list[int]:
    """The chunks of pack part ``ix`` that are not as the part wrote them: another size, or
    another mtime, than its index records (every chunk of a part that records no mtimes). The
    rest were checksummed as they were written, and are not read again."""
    stamps = ix.header["extra"]["part"].get("chunk_mtime_ns")
    if not (isinstance(stamps, list) and len(stamps) == ix.num_chunks):
        return list(range(ix.num_chunks))
    changed = []
    for chunk, stamp in enumerate(stamps):
        try:
            now = safe_chunk_path(ix.chunk_root, ix.chunk_name(chunk), ix.path).stat()
        except (OSError, TierfeedError):
            changed.append(chunk)  # missing or unsafe: the full check names it
            continue
        if (now.st_size, now.st_mtime_ns) != (int(ix.chunk_size[chunk]), stamp):
            changed.append(chunk)
    return changed
