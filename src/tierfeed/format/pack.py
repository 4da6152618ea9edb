"""`tierfeed pack`: read a source tree with parallel readers into tar chunks and one index.

Publishing is atomic: each chunk is written under a temporary name and renamed when whole, a
journal records finished chunks, and the index is written last. An interrupted pack leaves no
store that opens; running it again keeps the finished chunks whose source is unchanged.

Up to ``PackOptions.workers`` threads read the source files ahead of the writer, in runs of
consecutive files (`tierfeed.format.packreads`): as many as the cores to begin with, more
while the reads wait on storage; the writer takes them in store order, so the
store is the same bytes whatever the readers' timing. Durable by default, and not a switch, as
`tierfeed.Writer` is: every chunk is synced on a background thread while the next one is
written, the journal records it once it is on disk, and the index is published only after all
of them, so that no index ever names bytes a power cut lost. The peers leave their data in the
page cache; docs/BENCHMARKS.md measures tierfeed both ways.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tierfeed.errors import (
    ConfigError,
    EmptySourceError,
    TierfeedError,
    UnreadableFileError,
)
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.chunksync import ChunkSyncer
from tierfeed.format.destination import check_destination
from tierfeed.format.index import IndexContent, write_index
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.names import GROUPINGS
from tierfeed.format.packplan import PackPlan, plan_pack
from tierfeed.format.packreads import ReadRun, read_ahead, read_source_into
from tierfeed.format.packstate import JOURNAL, append_journal, read_journal, remove_leftovers
from tierfeed.format.packstate import LOCK as LOCK  # re-exported: it lived here
from tierfeed.format.source import (
    SourceDir,
    SourceTree,
    group_samples,
    list_files,
    tree_content,
    walk_tree,
)
from tierfeed.format.storetarget import Destination, as_destination, claimed
from tierfeed.format.tarchunk import ChunkWriter, cannot_write, sync_files
from tierfeed.units import byte_count, count

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["PackOptions", "PackReport", "chunk_file_name", "pack", "source_tree", "write_store"]


def check_chunk_size(chunk_size: int | str) -> int:
    """The chunk size in bytes (a count, or ``"64MiB"``); ConfigError for one tierfeed cannot
    use (pack and Writer alike)."""
    size = byte_count(chunk_size, "chunk_size=...")
    if size < 4096:
        raise ConfigError(f"chunk size {size} is too small (at least 4 KiB)")
    return size


@dataclass(frozen=True)
class PackOptions:
    """How to pack.

    Attributes:
        chunk_size: target bytes per chunk, or as text (``"64MiB"``); a larger sample: its own.
        workers: the most parallel file readers: pack starts with as many as the cores and
            adds readers while the reads wait on storage (a shared file system's latency).
        labels: ``auto`` (ImageFolder classes: the top-level directories; a file at the top
            level gets label -1 and is counted), ``folder`` (every file in a class directory)
            or ``none``.
        group_by: ``file`` (each file is a sample, whatever dots its name holds; files that
            differ only in their extension are one) or ``key`` (WebDataset's rule: files
            sharing the path up to the first dot of their name are one sample).
        skip_unreadable: skip unreadable files (counted and listed) instead of failing.
        overwrite: replace a store already at the destination.
        progress: show a progress bar on stderr.
    """

    chunk_size: int = 64 * 2**20
    workers: int = 16
    labels: str = "auto"
    group_by: str = "file"
    skip_unreadable: bool = False
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_size", check_chunk_size(self.chunk_size))
        object.__setattr__(self, "workers", count(self.workers, "PackOptions(workers=...)", 1))
        if self.group_by not in GROUPINGS:
            raise ConfigError(f"group_by must be one of {GROUPINGS}, got {self.group_by!r}")
        if self.labels not in ("auto", "folder", "none"):
            raise ConfigError(f"labels must be auto, folder or none, got {self.labels!r}")


@dataclass
class PackReport:
    """What a pack did."""

    store: Path | str  # the directory, or the URL the store was uploaded to
    samples: int
    members: int
    chunks: int
    data_bytes: int
    chunk_bytes: int
    seconds: float
    resumed_chunks: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    classes: int = 0
    unlabelled: int = 0  # samples outside every class directory (label -1) while classes exist


def chunk_file_name(chunk: int) -> str:
    """Store-relative name of packed chunk ``chunk``."""
    return f"chunks/{chunk:06d}.tar"


class _Packer:
    """Writes the planned chunks, keeping those an earlier run finished."""

    def __init__(self, dst: Path, plan: PackPlan, options: PackOptions, tree: SourceTree):
        self.dst, self.plan, self.options, self.tree = dst, plan, options, tree
        n = plan.num_chunks
        self.offset = np.full(len(plan.files), -1, dtype=np.int64)  # -1: skipped
        self.member_sum = np.zeros(len(plan.files), dtype=np.uint64)
        self.chunk_size = np.zeros(n, dtype=np.uint64)
        self.chunk_checksum = np.zeros(n, dtype=np.uint64)
        self.journal = read_journal(dst)
        self.resumed = 0
        self.files_done = 0
        self.syncer = ChunkSyncer()  # each written chunk is synced while the next fills

    def _reuse(self, chunk: int) -> bool:
        """Keep a chunk finished by an earlier run if its source is unchanged and it verifies."""
        entry = self.journal.get(chunk)
        if entry is None or entry.get("fingerprint") != self.plan.fingerprint(chunk):
            return False
        skipped = set(entry.get("skipped", []))
        members = [m for m in self.plan.chunk_members(chunk) if m not in skipped]
        offsets, size = self.plan.layout(members)
        path = self.dst / chunk_file_name(chunk)
        try:
            st = path.stat()
            if entry["size"] != size or st.st_size != size:
                return False
            if stat.S_IMODE(st.st_mode) & ~self.plan.file_mode(members):
                return False  # wider than the source allows now (a directory was closed)
            data = path.read_bytes()
        except (OSError, KeyError):
            return False
        if checksum_bytes(data) != entry["checksum"]:
            return False
        view = memoryview(data)
        for m, off in zip(members, offsets, strict=True):
            self.member_sum[m] = checksum_bytes(view[off : off + self.plan.files[m].size])
        self.offset[members] = offsets
        self.chunk_size[chunk], self.chunk_checksum[chunk] = size, entry["checksum"]
        self.tree.skipped.extend(
            (os.fsdecode(self.plan.files[m].rel), "unreadable (skipped by an earlier run)")
            for m in sorted(skipped)
        )
        self.resumed += 1
        return True

    def run(self, bar: tqdm[Any] | None) -> None:
        """Write every chunk that could not be kept from an earlier run."""
        todo_chunks = [c for c in range(self.plan.num_chunks) if not self._reuse(c)]
        members = [list(self.plan.chunk_members(c)) for c in todo_chunks]
        files = self.plan.files
        if bar is not None:
            bar.update(
                sum(f.size for f in files) - sum(files[m].size for ms in members for m in ms)
            )
        with ThreadPoolExecutor(self.options.workers, thread_name_prefix="tierfeed-pack") as pool:
            runs = read_ahead(pool, members, self.plan, self.options.workers, read_source_into)
            try:
                for chunk, chunk_members in zip(todo_chunks, members, strict=True):
                    self._write_chunk(chunk, len(chunk_members), runs, bar)
                self.syncer.wait()
            finally:
                self.syncer.close()
                for _ in runs:  # let queued reads finish before the pool shuts down
                    pass

    def _write_chunk(
        self, chunk: int, count: int, runs: Iterator[ReadRun], bar: tqdm[Any] | None
    ) -> None:
        """Write ``chunk`` (``count`` members) from the runs read ahead, journalled once synced."""
        planned = self.plan.chunk_members(chunk)
        writer = ChunkWriter(self.dst / chunk_file_name(chunk), self.plan.file_mode(planned))
        skipped: list[int] = []
        try:
            while count:
                run = next(runs)
                base = writer.add_block(run.data)
                data_bytes = 0
                for read in run.members:
                    if len(read) == 2:  # unreadable
                        skipped.append(self._unreadable(*read))
                        continue
                    m, offset, self.member_sum[m] = read
                    self.offset[m] = base + offset
                    self.files_done += 1
                    data_bytes += self.plan.files[m].size
                count -= len(run.members)
                if bar is not None:
                    bar.set_postfix(files=self.files_done, refresh=False)
                    bar.update(data_bytes)
            size, checksum = writer.commit()
        except BaseException:
            writer.abort()
            raise
        if skipped:  # a skipped member's bits must not widen the others'
            self._narrow(writer.path, sorted(set(planned) - set(skipped)))
        self.chunk_size[chunk], self.chunk_checksum[chunk] = size, checksum
        entry = {
            "chunk": chunk,
            "fingerprint": self.plan.fingerprint(chunk),
            "size": size,
            "checksum": checksum,
            "skipped": skipped,
        }
        # journalled once the chunk is on disk, while the next chunk is written
        self.syncer.add(writer.path, lambda: append_journal(self.dst, entry))

    def _narrow(self, path: Path, members: list[int]) -> None:
        """Narrow a chunk this run wrote to the mode of the members it holds: it was created
        with its planned members' mode, since which one is unreadable shows only as it is read
        (the store is not published before its index)."""
        mode = self.plan.file_mode(members)
        if stat.S_IMODE(path.stat().st_mode) & ~mode:
            os.chmod(path, mode)

    def index_mode(self) -> int:
        """The index's mode: it names every file, so no wider than the widest one kept."""
        return self.plan.file_mode(np.flatnonzero(self.offset >= 0))

    def _unreadable(self, member: int, error: UnreadableFileError) -> int:
        """``member`` could not be read: raise its error, or (skipping) count and return it."""
        if not self.options.skip_unreadable:
            raise error
        self.tree.skipped.append((os.fsdecode(self.plan.files[member].rel), str(error)))
        return member

    def content(self) -> IndexContent:
        """The index of what was written (skipped members and emptied samples left out)."""
        plan, tree = self.plan, self.tree
        kept = self.offset >= 0
        if not kept.any():
            raise EmptySourceError(f"{self.dst}: every source file was skipped; nothing to index")
        member_sample = plan.member_sample[kept]
        samples, counts = np.unique(member_sample, return_counts=True)
        start = np.zeros(len(samples) + 1, dtype=np.uint64)
        np.cumsum(counts, out=start[1:])
        sizes = np.fromiter((f.size for f in plan.files), dtype=np.uint64, count=len(plan.files))
        return IndexContent(
            keys=[tree.samples[i].key for i in samples.tolist()],
            labels=np.asarray([tree.samples[i].label for i in samples.tolist()], dtype=np.int32),
            member_start=start,
            member_chunk=plan.member_chunk[kept].astype(np.uint32),
            member_offset=self.offset[kept].astype(np.uint64),
            member_length=sizes[kept],
            member_checksum=self.member_sum[kept],
            member_ext=plan.member_ext[kept],
            exts=plan.exts,
            chunk_names=[chunk_file_name(c) for c in range(plan.num_chunks)],
            chunk_size=self.chunk_size,
            chunk_checksum=self.chunk_checksum,
            classes=tree.classes,
            extra={"skipped": len(tree.skipped), "chunk_target_bytes": plan.chunk_size},
            **tree_content(plan.files, kept, tree.dirs),
        )


def _run_with_bar(packer: _Packer, total: int) -> None:
    """`_Packer.run` under a progress bar on stderr (tqdm imported only then)."""
    from tqdm import tqdm

    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="pack",
        dynamic_ncols=True,
    ) as bar:
        try:
            packer.run(bar)
        except BaseException:
            bar.leave = False  # an error is one line on stderr, without a stale bar above
            raise


def write_store(
    dst: Path, plan: PackPlan, options: PackOptions, tree: SourceTree, started: float
) -> PackReport:
    """Write the chunks of ``plan`` (the samples of ``tree``) in the claimed ``dst``, the index
    last; keep what an interrupted earlier run finished. A failed write names its file and says
    what to do. Returns what was written (``seconds`` since ``started``)."""
    try:
        packer = _Packer(dst, plan, options, tree)
        if options.progress:
            _run_with_bar(packer, sum(f.size for f in plan.files))
        else:
            packer.run(None)
        content = packer.content()
        remove_leftovers(dst, plan.num_chunks)
        mtimes = sync_files([dst / chunk_file_name(c) for c in range(plan.num_chunks)])
        if plan.part is not None:  # a part (`tierfeed.format.parts`): `merge` trusts a chunk
            content.extra["part"] = {**plan.part, "chunk_mtime_ns": mtimes}  # still as written
        write_index(dst / INDEX_NAME, content, mode=packer.index_mode())
        with contextlib.suppress(FileNotFoundError):
            (dst / JOURNAL).unlink()
    except TierfeedError:
        raise
    except OSError as exc:
        raise cannot_write(Path(os.fsdecode(exc.filename or dst)), exc) from None
    return PackReport(
        store=dst,
        samples=len(content.keys),
        members=len(content.member_offset),
        chunks=plan.num_chunks,
        data_bytes=int(content.member_length.sum()),
        chunk_bytes=int(packer.chunk_size.sum()),
        seconds=time.perf_counter() - started,
        resumed_chunks=packer.resumed,
        skipped=tree.skipped,
        classes=len(content.classes),
        unlabelled=int(np.count_nonzero(content.labels < 0)) if content.classes else 0,
    )


def source_tree(src: Path, dst: Path, options: PackOptions, files: Path | None) -> SourceTree:
    """The samples to pack: the files under ``src`` (``dst`` left out) or those ``files``
    lists, grouped into samples and labelled as ``options`` say, with what was skipped."""
    skipped: list[tuple[str, str]] | None = [] if options.skip_unreadable else None
    dirs: list[SourceDir] = []
    if files is not None:
        listing = list_files(src, files, skipped, dirs)
    else:
        listing = walk_tree(src, skipped, exclude=dst, dirs=dirs)
    tree = group_samples(listing, options.labels, src, options.group_by, dirs)
    tree.skipped = skipped or []
    tree.dirs = dirs
    return tree


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | Destination,
    options: PackOptions | None = None,
    files: str | os.PathLike[str] | None = None,
) -> PackReport:
    """Pack the files under ``src`` (or those listed in ``files``) into a store at ``dst``:
    the same bytes for the same tree, on disk (synced) before it returns (see the module).

    Args:
        src: the source directory; paths in the store are relative to it.
        dst: the store directory (created if missing), or a `Destination` (a URL's:
            `tierfeed.loader.upload.pack`; ``options.overwrite`` is then its own).
        options: chunk size, readers, labels, skipping.
        files: a file listing paths relative to ``src``, one per line, instead of a walk.

    Returns:
        What was packed, and what was skipped when skipping was asked for.

    Raises:
        PackError: the source or destination cannot be used (DST inside SRC, not a directory,
            read-only, full), or a write failed; nothing is ever written inside ``src``.
        UnreadableFileError: a source file cannot be read or is not a regular file (unless
            ``options.skip_unreadable``).
    """
    options = options or PackOptions()
    target = as_destination(dst, options.overwrite, "--overwrite")
    src_path, root, started = Path(src), target.directory, time.perf_counter()
    with target.building():
        # Everything is checked and the source listed before the first write.
        check_destination(src_path, root)
        target.check()
        tree = source_tree(src_path, root, options, None if files is None else Path(files))
        plan = plan_pack(tree, options.chunk_size)
        with claimed(target, resume=True):  # an interrupted pack's chunks are kept
            report = write_store(root, plan, options, tree, started)
    target.publish(root)
    return replace(report, store=target.store, seconds=time.perf_counter() - started)
