"""`tierfeed.Writer`: write a store from Python, one sample dict at a time.

The same crash safety as `tierfeed pack`: each chunk is written under a temporary name
(``.tmp.<pid>.NNNNNN.tar``, see `tierfeed.publish`) and renamed when whole, and the index is
written last (fsynced, atomic rename), so an interrupted write leaves no store that opens. A
Writer cannot resume (it does not own its input): a destination holding chunks but no index is
refused unless ``overwrite=True``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from tierfeed.errors import (
    BadMemberError,
    ConfigError,
    DuplicateKeyError,
    EmptySourceError,
    PackError,
)
from tierfeed.format.chunksink import ChunkRecord, ChunkSink
from tierfeed.format.destination import already_holds_a_store
from tierfeed.format.encode import KEY_FIELD, encode_sample
from tierfeed.format.index import IndexContent, write_index
from tierfeed.format.labels import LABEL_MODES, load_classes, resolve_labels
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import check_chunk_size, chunk_file_name
from tierfeed.format.packstate import JOURNAL, lock_destination
from tierfeed.format.tarchunk import cannot_write, sync_files
from tierfeed.publish import is_temporary

__all__ = ["WriteReport", "Writer", "claim_destination", "finish_store"]

Classes = str | os.PathLike[str] | Sequence[str] | None


@dataclass
class WriteReport:
    """What a `Writer` (or `optimize`) wrote."""

    store: Path | str  # the directory, or the URL the store was uploaded to
    samples: int
    members: int
    chunks: int
    data_bytes: int
    seconds: float


def check_options(chunk_size: int, labels: str, image_quality: int = 95) -> None:
    """ConfigError for a chunk size, label mode or image quality tierfeed cannot use."""
    check_chunk_size(chunk_size)
    if not (isinstance(image_quality, int) and 1 <= image_quality <= 100):
        raise ConfigError(f"image_quality must be an int in 1..100, got {image_quality!r}")
    if labels not in LABEL_MODES:
        raise ConfigError(f"labels must be one of {', '.join(LABEL_MODES)}, got {labels!r}")


def _is_chunk_file(name: str) -> bool:
    """A chunk, whole or still under its temporary name."""
    return name.endswith(".tar") or is_temporary(name)


def _remove_chunks(chunks: Path) -> None:
    """Remove the chunk files (whole or partial) in ``chunks``; nothing else is touched."""
    with contextlib.suppress(FileNotFoundError):
        for path in chunks.iterdir():
            if _is_chunk_file(path.name) and path.is_file():
                path.unlink()


def claim_destination(dst: Path, overwrite: bool) -> int:
    """Lock ``dst`` for one writer and make sure it holds no store; returns the lock's fd.

    A store already there (an index), or chunks left by an interrupted write or pack, is
    refused unless ``overwrite``: then the index goes first, then the chunks.
    """
    if dst.exists() and not dst.is_dir():
        raise PackError(f"{dst}: not a directory; choose another destination")
    try:
        (dst / "chunks").mkdir(parents=True, exist_ok=True)
        fd = lock_destination(dst)
    except OSError as exc:
        raise cannot_write(dst, exc) from None
    try:
        if (dst / INDEX_NAME).exists() and not overwrite:
            raise already_holds_a_store(dst, "overwrite=True")
        names = sorted(p.name for p in (dst / "chunks").iterdir())
        left = [f"chunks/{n}" for n in names if _is_chunk_file(n)]
        left += [JOURNAL] if (dst / JOURNAL).exists() else []
        if left and not overwrite:
            raise PackError(
                f"{dst}: holds chunks but no index ({left[0]}, {len(left)} in all): an earlier "
                "write or pack was interrupted. A Writer cannot resume it, since its input is "
                "yours: pass overwrite=True to write the store again from the start"
            )
        with contextlib.suppress(FileNotFoundError):
            (dst / INDEX_NAME).unlink()  # first: an interrupted rewrite leaves no store
        with contextlib.suppress(FileNotFoundError):
            (dst / JOURNAL).unlink()
        _remove_chunks(dst / "chunks")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_tree(keys: list[bytes], exts: list[bytes], counts: np.ndarray[Any, Any]) -> None:
    """Refuse a member path that is also a directory of another key (``a.jpg`` and
    ``a.jpg/b``, or ``a`` with the field ``""`` and ``a/b``), or the path of another member
    (``a.b`` + ``.c`` and ``a`` + ``.b.c``): the store's tree could not show both.

    Only a dot in a key's last component, or a member without an extension, can make either:
    keys without them (WebDataset's) skip the O(members) walk."""
    if b"" not in exts and not any(b"." in k for k in keys):
        return
    dotted_keys = any(b"." in k[k.rfind(b"/") + 1 :] for k in keys)
    dirs = {
        b"/".join(parts[:i])
        for parts in (k.split(b"/") for k in keys if b"/" in k)
        for i in range(1, len(parts))
    }
    owner = np.repeat(np.arange(len(keys)), counts.astype(np.int64))
    seen: set[bytes] = set()
    for o, ext in zip(owner.tolist(), exts, strict=True):
        path = keys[o] + ext
        if path in dirs:
            raise BadMemberError(
                f"sample {os.fsdecode(keys[o])!r}: its member {os.fsdecode(path)!r} is "
                "also a directory of another sample's key; rename one of them"
            )
        if dotted_keys:
            if path in seen:
                raise BadMemberError(
                    f"sample {os.fsdecode(keys[o])!r}: its member {os.fsdecode(path)!r} is "
                    "written twice (another sample's key and field name the same path); "
                    "rename one of them"
                )
            seen.add(path)


def _refuse_duplicate(dst: Path, keys: list[bytes]) -> None:
    """DuplicateKeyError naming the first key of ``keys`` that is written twice."""
    seen: set[bytes] = set()
    for k in keys:
        if k in seen:
            raise DuplicateKeyError(f"{dst}: sample key {os.fsdecode(k)!r} is written twice")
        seen.add(k)


def _content(
    records: list[ChunkRecord],
    keys: list[bytes],
    ext: list[bytes],
    counts: np.ndarray[Any, Any],
    label_of: list[int],
    names: list[str],
    chunk_size: int,
) -> IndexContent:
    """The index of the members of ``records``, one chunk per record."""
    exts = sorted(set(ext))
    ext_id = {e: i for i, e in enumerate(exts)}
    start = np.zeros(len(keys) + 1, dtype=np.uint64)
    np.cumsum(counts, out=start[1:])
    return IndexContent(
        keys=keys,
        labels=np.asarray(label_of, dtype=np.int32),
        member_start=start,
        member_chunk=np.concatenate(
            [np.full(len(r.ext), c, dtype=np.uint32) for c, r in enumerate(records)]
        ),
        member_offset=np.concatenate([r.offset for r in records]),
        member_length=np.concatenate([r.length for r in records]),
        member_checksum=np.concatenate([r.member_checksum for r in records]),
        member_ext=np.asarray([ext_id[e] for e in ext], dtype=np.uint16),
        exts=exts,
        chunk_names=[r.name for r in records],
        chunk_size=np.asarray([r.size for r in records], dtype=np.uint64),
        chunk_checksum=np.asarray([r.checksum for r in records], dtype=np.uint64),
        classes=names,
        extra={"writer": "tierfeed.Writer", "chunk_target_bytes": chunk_size},
    )


def finish_store(
    dst: Path,
    records: list[ChunkRecord],
    labels: str,
    classes: list[str] | None,
    chunk_size: int,
    check_unique: bool,
) -> IndexContent:
    """Write the index of ``records`` (in store order) last: sync every chunk, then publish."""
    keys = [k for r in records for k in r.keys]
    if not keys:
        raise EmptySourceError(f"{dst}: no sample was written; no index written")
    if check_unique and len(set(keys)) != len(keys):
        _refuse_duplicate(dst, keys)
    ext = [e for r in records for e in r.ext]
    counts = np.concatenate([r.member_count for r in records])
    _check_tree(keys, ext, counts)
    label_of, names = resolve_labels(
        keys, [c for r in records for c in r.cls], labels, classes, dst
    )
    content = _content(records, keys, ext, counts, label_of, names, chunk_size)
    try:
        sync_files([dst / r.name for r in records])
        write_index(dst / INDEX_NAME, content)
    except OSError as exc:
        raise cannot_write(Path(os.fsdecode(exc.filename or dst / INDEX_NAME)), exc) from None
    return content


class Writer:
    """Write a store from Python: ``with Writer(dst) as w: w.write({"__key__": ..., ...})``.

    A sample is a dict: ``__key__`` (a relative path such as ``"cat/x1"``) and fields, each
    stored as member ``key.field``; values are ``bytes``/``bytearray``/``memoryview`` (as they
    are), ``str`` (UTF-8), or what the field's extension encodes, as WebDataset's encoders do:
    an ``int`` in ``cls``/``cls2``/``txt`` (decimal text), a dict or list in ``json``, a PIL
    image or uint8 array in ``jpg``/``png``/``webp``, a numpy array in ``npy``, a tensor in
    ``pt`` (`tierfeed.format.codecs`). A sample without ``__key__`` gets its number in write
    order, nine digits (``"000000042"``). Samples keep their write order in the store.

    Labels (``labels="auto"``): a sample's ``cls`` (else ``cls2``) is its label when any sample
    has one; otherwise ImageFolder labels from the key's first directory, as `pack` gives them.
    ``classes`` names the classes of ``cls`` labels (a list, or a file with one name per line);
    without it class ``i`` is named ``"i"``.

    Crash safety: chunks are written under a temporary name and renamed when whole; the index
    is written by `close` only, after every chunk is synced, so an interrupted write leaves no
    store that opens. When the ``with`` block ends with an exception, no index is written, this
    Writer's chunks are removed and the exception says so. A Writer cannot resume: a destination
    holding a store, or chunks from an interrupted write, is refused unless ``overwrite=True``.

    Args:
        dst: the store directory (created if missing).
        chunk_size: target chunk size in bytes (a larger sample gets a chunk of its own).
        labels: ``auto``, ``cls`` (every sample needs a cls), ``folder`` or ``none``.
        classes: class names of ``cls`` labels: a list, or a ``classes.txt``-style file.
        overwrite: replace a store (or an interrupted write's chunks) at ``dst``.
        image_quality: of the images given for jpg and webp fields (1-100; pillow's scale).

    Raises:
        PackError: ``dst`` holds a store or leftover chunks (without ``overwrite``), is locked
            by another writer, or cannot be written.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        chunk_size: int = 64 * 2**20,
        labels: str = "auto",
        classes: Classes = None,
        overwrite: bool = False,
        image_quality: int = 95,
    ) -> None:
        check_options(chunk_size, labels, image_quality)
        self.image_quality = image_quality
        self.dst = Path(dst)
        self.labels, self.chunk_size = labels, chunk_size
        self.classes = None if classes is None else load_classes(classes)
        self._started = time.perf_counter()
        self._records: list[ChunkRecord] = []
        self._keys: set[bytes] = set()
        self._lock = claim_destination(self.dst, overwrite)
        self._sink = ChunkSink(self.dst, chunk_size, chunk_file_name, self._records.append)
        self._closed = False
        self.report: WriteReport | None = None

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample.

        Raises:
            BadMemberError: an unsafe key (absolute, ``..``, NUL) or field name (``/``, NUL).
            DuplicateKeyError: the key was written before.
            PackError: a value its field cannot store (bytes and str always; by extension an
                int, a JSON value, an image, an array or a tensor: `tierfeed.format.codecs`);
                a bad ``cls``.
        """
        if self._closed:
            raise PackError(f"{self.dst}: this Writer is closed; open a new one")
        encoded = encode_sample(
            sample,
            f"{self._sink.samples:09d}",
            want_cls=self.labels in ("auto", "cls"),
            quality=self.image_quality,
        )
        if encoded.key in self._keys:
            key = sample.get(KEY_FIELD, os.fsdecode(encoded.key))
            raise DuplicateKeyError(f"{self.dst}: sample key {key!r} is written twice")
        names = self.classes
        if names is not None and encoded.cls is not None and encoded.cls >= len(names):
            raise PackError(
                f"{self.dst}: sample {os.fsdecode(encoded.key)!r} has cls label "
                f"{encoded.cls}, but the classes map names only {len(names)} classes"
            )
        try:
            self._sink.add(encoded)
        except BaseException:
            self.abort()  # a chunk write failed (disk full, ...): nothing half-written stays
            raise
        self._keys.add(encoded.key)

    def close(self) -> WriteReport:
        """Finish the last chunk and write the index; the store then opens.

        Raises:
            EmptySourceError: no sample was written (no index is written).
        """
        if self.report is not None:
            return self.report
        if self._closed:
            raise PackError(f"{self.dst}: this Writer was aborted; no index was written")
        try:
            self._sink.flush()
            content = finish_store(
                self.dst, self._records, self.labels, self.classes, self.chunk_size, False
            )
        except BaseException:
            self.abort()
            raise
        self._release()
        self.report = WriteReport(
            store=self.dst,
            samples=len(content.keys),
            members=len(content.member_offset),
            chunks=len(self._records),
            data_bytes=int(content.member_length.sum()),
            seconds=time.perf_counter() - self._started,
        )
        return self.report

    def abort(self) -> None:
        """Stop without an index: remove this Writer's chunks (whole and partial)."""
        if self._closed:
            return
        self._sink.abort()
        _remove_chunks(self.dst / "chunks")  # claimed empty: every chunk there is ours
        self._release()

    def _release(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            os.close(self._lock)

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        self.abort()
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(
                f"tierfeed.Writer: no index was written to {self.dst} (the with block raised); "
                "its chunks were removed"
            )
