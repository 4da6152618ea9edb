"""`tierfeed.Writer`: write a store from Python, one sample dict at a time, to a directory or a
URL."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from tierfeed.errors import DuplicateKeyError, PackError
from tierfeed.format.chunksink import ChunkRecord, ChunkSink
from tierfeed.format.encode import KEY_FIELD, encode_sample
from tierfeed.format.labels import load_classes
from tierfeed.format.pack import chunk_file_name
from tierfeed.format.storetarget import remove_chunks
from tierfeed.format.writer import Classes, WriteReport, check_options, finish_store
from tierfeed.loader.urldestination import destination_for

__all__ = ["Writer"]


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

    Durability (fsync), the default and not a switch: `close` returns once every chunk and the
    index are on disk. Each chunk is synced on a background thread as soon as it is whole,
    while the next one fills, so only the last chunk's sync and the index's are left for
    `close`. The index is the promise that the store opens: published before its chunks
    reached the disk, a power cut could leave an index naming lost bytes, a store that opens
    and then fails its reads. MosaicML Streaming, WebDataset and LitData leave their data in
    the page cache; docs/BENCHMARKS.md measures tierfeed both ways.

    Where the bytes go is the destination's (`tierfeed.format.storetarget.Destination`): a
    directory is written in place; a URL (``s3://``, ``gs://``, ``az://``, ``memory://``) is
    built in a local staging directory and uploaded by `close`, the index last
    (`tierfeed.loader.urldestination.UrlDestination`); both are claimed, built in and
    published as `pack` and `optimize` do theirs.

    Args:
        dst: the store directory (created if missing), or its URL.
        chunk_size: target chunk size in bytes, or as text (``"64MiB"``); a larger sample
            gets a chunk of its own.
        labels: ``auto``, ``cls`` (every sample needs a cls), ``folder`` or ``none``.
        classes: class names of ``cls`` labels: a list, or a ``classes.txt``-style file.
        overwrite: replace a store (or an interrupted write's chunks) at ``dst``.
        storage_options: for a URL, as for `tierfeed.open_store`.
        image_quality: of the images given for jpg and webp fields (1-100; pillow's scale).

    Raises:
        PackError: ``dst`` holds a store or leftover chunks (without ``overwrite``), is locked
            by another writer, or cannot be written.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        chunk_size: int | str = 64 * 2**20,
        labels: str = "auto",
        classes: Classes = None,
        overwrite: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        image_quality: int = 95,
    ) -> None:
        size = check_options(chunk_size, labels, image_quality)
        self.image_quality = image_quality
        self.destination = destination_for(dst, storage_options, overwrite)
        self.labels, self.chunk_size = labels, size
        self.classes = None if classes is None else load_classes(classes)
        self._started = time.perf_counter()
        self._records: list[ChunkRecord] = []
        self._keys: set[bytes] = set()
        with self.destination.building():
            self.destination.check()
            self.dst = self.destination.claim()  # the directory the store is built in
        self._sink = ChunkSink(self.dst, size, chunk_file_name, self._records.append)
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
            with self.destination.building():
                self._sink.add(encoded)
        except BaseException:
            self.abort()  # a chunk write failed (disk full, ...): nothing half-written stays
            raise
        self._keys.add(encoded.key)

    def close(self) -> WriteReport:
        """Finish the last chunk and write the index (then upload the store, for a URL); the
        store then opens.

        Raises:
            EmptySourceError: no sample was written (no index is written).
        """
        if self.report is not None:
            return self.report
        if self._closed:
            raise PackError(f"{self.dst}: this Writer was aborted; no index was written")
        try:
            with self.destination.building():
                self._sink.finish()
                content = finish_store(
                    self.dst, self._records, self.labels, self.classes, self.chunk_size, False
                )
        except BaseException:
            self.abort()
            raise
        self._release()
        self.destination.publish(self.dst)
        self.report = WriteReport.of(
            self.destination.store, content, len(self._records), self._started
        )
        return self.report

    def abort(self) -> None:
        """Stop without an index: remove this Writer's chunks (whole and partial)."""
        if self._closed:
            return
        self._sink.abort()
        remove_chunks(self.dst / "chunks")  # claimed empty: every chunk there is ours
        self._release()

    def _release(self) -> None:
        self._closed = True
        self.destination.release()

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
