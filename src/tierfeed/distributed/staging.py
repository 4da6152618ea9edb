"""Stage-in: the ranks of a job copy disjoint chunk sets from the origin to node-local storage.

Each chunk is copied by exactly one rank (its holder, see `tierfeed.distributed.holders`), into the
directory of that rank's node, which every rank of the node shares. A chunk split between the
partitions of several ranks is copied in parts: each rank copies the byte ranges of its own
samples' members, checks each member against its checksum, and publishes them as one segment
in its parts directory (``parts/rank<r>/``). A copy is streamed in
blocks, hashed on the way, checked against the index and only then renamed into place, so a
staged chunk is whole and verified or absent; a chunk already present and verified is
skipped, which makes stage-in resumable. The index is copied once per node (it is metadata:
~60 B per sample). The origin is only read.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from tierfeed.cachedir import private_dir
from tierfeed.distributed.comm import Comm
from tierfeed.distributed.holders import Part, SampleHolders
from tierfeed.distributed.inbox import parts_dir, punched_dir
from tierfeed.distributed.parts import StagedParts
from tierfeed.errors import ChunkCorruptError, ConfigError, StorageError
from tierfeed.format.chunkref import ChunkInfo, checksum_file
from tierfeed.format.index import Index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.loader.compose import plan_for
from tierfeed.loader.location import StoreLocation
from tierfeed.plan import PlanSpec
from tierfeed.publish import publishing
from tierfeed.storage import Driver, fetch_verified
from tierfeed.world import World

__all__ = ["StageReport", "local_dir_for", "stage"]

_STAGE_THREADS = 4  # chunks copied at once from a file system (an object store: more)


@dataclass
class StageReport:
    """What a stage-in did, summed over every rank of the job.

    Attributes:
        chunks_copied: chunks read from the origin and written to local storage.
        chunks_present: chunks found staged and verified (skipped: stage-in resumed).
        parts_copied: parts of split chunks read from the origin and written.
        parts_present: parts found staged and verified.
        bytes_copied: bytes read from the origin.
        bytes_present: bytes already staged.
        seconds: wall time of the slowest rank.
        origin_opens: files the ranks opened at the origin.
        origin_reads: read calls served by the origin.
        origin_retries: transient origin faults tried again (resets, cut bodies, 5xx, ...).
        local_dir: this rank's node-local store directory.
        rank_bytes_copied: bytes this rank read from the origin (``bytes_copied`` is the job's).
    """

    chunks_copied: int = 0
    chunks_present: int = 0
    parts_copied: int = 0
    parts_present: int = 0
    bytes_copied: int = 0
    bytes_present: int = 0
    seconds: float = 0.0
    origin_opens: int = 0
    origin_reads: int = 0
    origin_retries: int = 0
    local_dir: str = ""
    rank_bytes_copied: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for JSON)."""
        return asdict(self)

    def summary(self) -> str:
        """One line for people."""
        from tierfeed.units import human

        rate = self.bytes_copied / self.seconds if self.seconds > 0 else 0.0
        copied, present = f"{self.chunks_copied} chunks", f"{self.chunks_present}"
        if self.parts_copied or self.parts_present:  # chunks cut between partitions
            copied += f" and {self.parts_copied} parts of split chunks"
            present = f"{self.chunks_present} chunks and {self.parts_present} parts"
        return (
            f"staged {copied} ({human(self.bytes_copied)}) in "
            f"{self.seconds:.1f} s ({human(rate)}/s), {present} already present "
            f"({human(self.bytes_present)}); origin: {self.origin_opens} opens, "
            f"{self.origin_reads} reads"
            + (f", {self.origin_retries} retries" if self.origin_retries else "")
        )


def local_dir_for(template: str | os.PathLike[str], world: World) -> Path:
    """The node-local directory: ``template`` with ``{node}`` and ``{rank}`` filled in.

    On a cluster ``--to /local/ssd/data`` names a different disk on every node; on one host,
    ``{node}`` lets a test or benchmark give each pretend-node a directory of its own.
    """
    return Path(os.fspath(template).format(node=world.node, rank=world.rank)).absolute()


def _verified(path: Path, info: ChunkInfo) -> bool:
    try:
        if path.stat().st_size != info.size:  # the cheap test first: no read of a wrong file
            return False
        return checksum_file(path) == (info.size, info.checksum)
    except OSError:
        return False


def _copy_chunk(origin: Driver, root: str, info: ChunkInfo, target: Path, bar: tqdm[Any]) -> None:
    """Stream one chunk from the origin to ``target`` with the tier stack's verified copy; it is
    renamed into place only once its size and checksum matched the index."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        with publishing(target) as out:  # renamed only when the block ends without an error

            def sink(block: bytes) -> None:
                out.write(block)
                bar.update(len(block))

            fetch_verified(origin, info, sink=sink)
    except ChunkCorruptError as exc:
        raise ChunkCorruptError(
            f"chunk {root}/{info.name} at the origin does not match the index (size or "
            "checksum); run `tierfeed verify` on the store and re-pack it"
        ) from exc


def _stage_chunks(
    origin: Driver,
    root: str,
    local: Path,
    mine: list[ChunkInfo],
    bar: tqdm[Any],
    report: StageReport,
) -> None:
    """Copy the chunks not already here and verified, several at once (an object store's GET
    is slow alone: `Driver.parallel_requests` of them; a file system's, a few)."""
    todo = []
    for info in mine:
        if _verified(local / info.name, info):
            report.chunks_present += 1
            report.bytes_present += info.size
            bar.update(info.size)
        else:
            todo.append(info)
    if not todo:
        return
    threads = min(len(todo), max(_STAGE_THREADS, origin.parallel_requests))
    with ThreadPoolExecutor(threads, thread_name_prefix="tierfeed-stage") as pool:
        copies = [
            (info, pool.submit(_copy_chunk, origin, root, info, local / info.name, bar))
            for info in todo
        ]
        try:
            for info, copy in copies:
                copy.result()
                report.chunks_copied += 1
                report.bytes_copied += info.size
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # a failed copy leaves no file
            raise


def _copy_index(origin_index: Path, local: Path) -> None:
    target = local / INDEX_NAME
    if target.exists() and target.stat().st_size == origin_index.stat().st_size:
        return
    local.mkdir(parents=True, exist_ok=True, mode=0o700)
    with origin_index.open("rb") as source, publishing(target, fsync=False) as out:
        shutil.copyfileobj(source, out)


def stage(
    store: str | os.PathLike[str],
    to: str | os.PathLike[str],
    plan: PlanSpec | str = "global",
    world: World | None = None,
    comm: Comm | None = None,
    progress: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> StageReport:
    """Copy this rank's share of the store's chunks into node-local storage.

    Call it on every rank (with ``comm``) or in a single process (copies everything).

    Args:
        store: the store at the origin (its directory, or a URL such as ``s3://bucket/ds``).
        to: the node-local directory; ``{node}`` and ``{rank}`` are filled in.
        plan: the plan the job will read with: partition plans stage each rank's partition.
        world: rank, world size and ranks per node (default: from ``comm``, single process
            without one).
        comm: the job's byte group, to sum the report over ranks and wait for every node.
        progress: show a progress bar of this rank's bytes (on local rank 0 only).
        storage_options: for a URL, what its fsspec file system takes (by default the
            environment's credentials and endpoint).

    Returns:
        The job-wide report (this rank's ``local_dir``).
    """
    started = time.monotonic()
    location = StoreLocation.of(store, storage_options)
    index = location.open_index()
    world = _world_of(world, comm)
    holdings = _holdings(index, plan, world)
    local = private_dir(local_dir_for(to, world))  # made 0700, or checked: not a link, ours
    check_stageable(index, local)
    mine, parts, my_parts = _share_of(index, local, holdings, world.rank)
    report = StageReport(local_dir=os.fspath(local))
    origin = location.chunk_origin(index)  # the store's own chunks, or the shards it names
    if world.local_rank == 0:
        _copy_index(index.path, local)
    total = sum(c.size for c in mine) + sum(parts.nbytes(p) for p in my_parts)
    with _progress_bar(total, world, progress) as bar:
        _stage_chunks(origin, location.chunks_at(index), local, mine, bar, report)
        _stage_parts(origin, location.chunks_at(index), parts, my_parts, bar, report)
    parts.close()
    # Every chunk this rank stages is whole and verified again: no mark of a punch stands.
    shutil.rmtree(punched_dir(local, world.rank), ignore_errors=True)
    _close_origin(origin, report)
    index.close()
    report.rank_bytes_copied, report.seconds = report.bytes_copied, time.monotonic() - started
    return _job_total(report, comm)


def _world_of(world: World | None, comm: Comm | None) -> World:
    """The world given, else the group's, else one process; it must match the group's size."""
    world = world or (comm.world() if comm is not None else World())
    if comm is not None and comm.world_size != world.world_size:
        raise ConfigError(f"world of {world.world_size} ranks but the group has {comm.world_size}")
    return world


def _holdings(index: Index, plan: PlanSpec | str, world: World) -> SampleHolders:
    """Who stages what under ``plan``: partition plans stage each rank's partition."""
    spec = PlanSpec.parse(plan) if isinstance(plan, str) else plan
    return SampleHolders.of(plan_for(index, spec).shape, np.asarray(index.chunk_size), spec, world)


def _share_of(
    index: Index, local: Path, holdings: SampleHolders, rank: int
) -> tuple[list[ChunkInfo], StagedParts, list[Part]]:
    """The chunks ``rank`` stages whole, its parts directory (parts it no longer stages
    removed) and the parts of split chunks it stages."""
    chunks = index.chunks()
    mine = [chunks[int(c)] for c in holdings.staged_by(rank)]
    parts = StagedParts(index, parts_dir(local, rank))
    my_parts = holdings.parts_of(rank)
    parts.keep_only(my_parts)
    return mine, parts, my_parts


def _progress_bar(total: int, world: World, progress: bool) -> tqdm[Any]:
    """A bar of this rank's bytes, shown on the node's local rank 0 only."""
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=f"stage rank {world.rank}",
        disable=not progress or world.local_rank != 0,
    )


def _stage_parts(
    origin: Driver,
    root: str,
    parts: StagedParts,
    my_parts: list[Part],
    bar: tqdm[Any],
    report: StageReport,
) -> None:
    """Copy the parts not already here and verified, one after another."""
    for part in my_parts:
        size, copied = parts.stage(origin, root, part, bar)
        report.parts_copied += copied
        report.parts_present += not copied
        report.bytes_copied += size if copied else 0
        report.bytes_present += 0 if copied else size


def _close_origin(origin: Driver, report: StageReport) -> None:
    """Count what the origin served into ``report``, then close it."""
    ops = origin.counters.snapshot()
    origin.close()
    report.origin_opens, report.origin_reads = ops["opens"], ops["reads"]
    report.origin_retries = ops["retries"]


def _job_total(report: StageReport, comm: Comm | None) -> StageReport:
    if comm is None:
        return report
    fields = ["chunks_copied", "chunks_present", "parts_copied", "parts_present"]
    fields += ["bytes_copied", "bytes_present"]
    fields += ["origin_opens", "origin_reads", "origin_retries"]
    totals = comm.sum([getattr(report, f) for f in fields], "stage-in report")
    for name, value in zip(fields, totals, strict=True):
        setattr(report, name, int(value))
    report.seconds = comm.max([report.seconds], "stage-in report")[0]
    return report


def check_stageable(index: Index, local: Path) -> None:
    """Raise if ``local`` is inside the origin store or the shards it names (stage-in must
    never write there)."""
    for origin in (index.path.parent, index.chunk_root):
        if local.resolve().is_relative_to(origin.resolve()):
            raise StorageError(
                f"stage-in target {local} lies inside the store {origin}: the origin is "
                "read-only; stage to node-local storage elsewhere"
            )
