"""`tierfeed.optimize`: run ``fn`` over inputs in N processes and write one store, like
LitData's ``optimize``.

Worker ``w`` takes the ``w``-th contiguous slice of the inputs, fed through its own bounded
queue, calls ``fn`` on each input in order and writes its own chunks into the destination
(``chunks/wWWW-NNNNNN.tar``, each under a temporary name first). It sends the record of every
finished chunk to the parent over a bounded queue. The parent renames the chunks to
``NNNNNN.tar`` in worker order and writes ONE index last, so the store holds the samples in
input order whatever the number of workers or their speed, and an interrupted run leaves no
store that opens.

Workers start by ``spawn`` unless told otherwise, or by ``fork`` where a spawned worker could
not load ``fn`` (a program read from stdin, a notebook: `tierfeed.format.workerstart`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from tierfeed.errors import ConfigError, DuplicateKeyError, PackError, TierfeedError
from tierfeed.format import workerstart
from tierfeed.format.chunksink import ChunkRecord, ChunkSink
from tierfeed.format.encode import encode_sample
from tierfeed.format.indexwrite import IndexContent
from tierfeed.format.labels import load_classes
from tierfeed.format.pack import chunk_file_name
from tierfeed.format.storetarget import Destination, as_destination, claimed, remove_chunks
from tierfeed.format.workerstart import Fn, load_fn
from tierfeed.format.writer import Classes, WriteReport, check_options, finish_store

__all__ = ["Fn", "optimize"]  # Fn: of workerstart, named by tierfeed.loader.upload

_QUEUE_ITEMS = 64  # inputs waiting per worker; chunk records waiting for the parent
_POLL_S = 0.2


def _samples_of(result: object, index: int) -> list[tuple[str, Mapping[str, Any]]]:
    """(default key, sample) for what ``fn`` returned for input ``index``."""
    if isinstance(result, Mapping):
        return [(f"{index:09d}", result)]
    if isinstance(result, Iterable) and not isinstance(result, str | bytes):
        return [(f"{index:09d}_{j:04d}", s) for j, s in enumerate(result)]
    raise PackError(
        f"optimize: fn returned a {type(result).__name__} for input {index}; return a sample "
        "dict, or an iterable of them"
    )


def _work(
    worker: int,
    sent: Fn | bytes,
    inputs: Any,
    results: Any,
    root: str,
    chunk_size: int,
    want_cls: bool,
    quality: int,
) -> None:
    """One worker process: encode fn's samples of its inputs into its own chunks."""
    try:
        fn = load_fn(sent, worker)
    except PackError as exc:  # else the worker would die of it, its cause on stderr only
        results.put(("error", worker, exc))
        return
    sink = ChunkSink(
        Path(root),
        chunk_size,
        lambda n: f"chunks/w{worker:03d}-{n:06d}.tar",
        lambda record: results.put(("chunk", worker, record)),
    )
    keys: set[bytes] = set()
    index = -1
    try:
        while (item := inputs.get()) is not None:
            index, value = pickle.loads(item)
            for default_key, sample in _samples_of(fn(value), index):
                encoded = encode_sample(sample, default_key, want_cls, quality)
                if encoded.key in keys:
                    raise DuplicateKeyError(
                        f"sample key {os.fsdecode(encoded.key)!r} is written twice"
                    )
                keys.add(encoded.key)
                sink.add(encoded)
        sink.finish()
        results.put(("done", worker, sink.samples))
    except BaseException as exc:
        sink.abort()
        if isinstance(exc, TierfeedError):
            results.put(("error", worker, type(exc)(f"optimize, input {index}: {exc}")))
        else:
            text = "".join(traceback.format_exception(exc)).rstrip()
            results.put(
                ("error", worker, PackError(f"optimize: fn failed on input {index}:\n{text}"))
            )


class _Run:
    """The parent's side: feeder threads, the worker processes, and their chunk records."""

    def __init__(self, ctx: BaseContext, workers: int, inputs: Sequence[Any]) -> None:
        self.ctx, self.inputs = ctx, inputs
        self.stop = threading.Event()
        self.queues = [ctx.Queue(_QUEUE_ITEMS) for _ in range(workers)]
        self.results = ctx.Queue(_QUEUE_ITEMS * workers)
        n = len(inputs)
        self.slices = [range(w * n // workers, (w + 1) * n // workers) for w in range(workers)]
        self.records: list[list[ChunkRecord]] = [[] for _ in range(workers)]
        self.procs: list[BaseProcess] = []
        self.feeders: list[threading.Thread] = []
        self.feed_error: TierfeedError | None = None

    def _items(self, worker: int) -> Iterator[bytes | None]:
        """The worker's inputs, pickled here: a Queue that cannot pickle an item drops it."""
        for i in self.slices[worker]:
            try:
                yield pickle.dumps((i, self.inputs[i]))
            except Exception as exc:
                self.feed_error = PackError(
                    f"optimize: input {i} cannot be sent to a worker ({type(exc).__name__}: {exc})"
                )
                break
        yield None

    def _feed(self, worker: int) -> None:
        q = self.queues[worker]
        for item in self._items(worker):
            while not self.stop.is_set():
                try:
                    q.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue

    def start(
        self, fn: Fn | bytes, root: Path, chunk_size: int, want_cls: bool, quality: int
    ) -> None:
        """Start the workers, then the threads that feed them: every process first, so that a
        forked one copies no thread of this run (nor a lock such a thread held)."""
        for w in range(len(self.queues)):
            args = (w, fn, self.queues[w], self.results, str(root), chunk_size, want_cls, quality)
            proc = self.ctx.Process(  # type: ignore[attr-defined]
                target=_work, args=args, name=f"tierfeed-optimize-{w}", daemon=True
            )
            proc.start()
            self.procs.append(proc)
        for w in range(len(self.queues)):
            feeder = threading.Thread(
                target=self._feed, args=(w,), name=f"tierfeed-optimize-feed-{w}", daemon=True
            )
            feeder.start()
            self.feeders.append(feeder)

    def collect(self) -> int:
        """Gather every worker's chunk records; raise the first worker's error."""
        done: dict[int, int] = {}
        dead: dict[int, int] = {}  # empty polls since a worker was seen ended without "done"
        while len(done) < len(self.procs):
            if self.feed_error is not None:
                raise self.feed_error
            try:
                kind, worker, payload = self.results.get(timeout=_POLL_S)
            except queue.Empty:
                for w, proc in enumerate(self.procs):
                    if w in done or proc.exitcode is None:
                        continue
                    dead[w] = dead.get(w, 0) + 1
                    if dead[w] > 2:  # its last messages had time to arrive: it died
                        raise _died(w, proc.exitcode) from None
                continue
            if kind == "chunk":
                self.records[worker].append(payload)
            elif kind == "done":
                done[worker] = payload
            else:
                raise payload
        for feeder in self.feeders:  # every input was handed over, or its error is known
            feeder.join()
        if self.feed_error is not None:
            raise self.feed_error
        return sum(done.values())

    def close(self, failed: bool) -> None:
        """Stop feeding, end the workers (at once when the run failed) and join everything."""
        self.stop.set()
        for proc in self.procs:
            proc.join(timeout=0 if failed else 10)
            if proc.exitcode is None:
                proc.terminate()
                proc.join()
        for feeder in self.feeders:
            feeder.join()
        for q in [*self.queues, self.results]:
            q.close()
            q.cancel_join_thread()


def _died(worker: int, code: int) -> PackError:
    """A worker that ended without "done" or an error of its own: what its exit code tells."""
    cause = ""
    if code < 0:  # killed by a signal
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        cause = f", killed by {name}" + (": out of memory?" if name == "SIGKILL" else "")
    return PackError(
        f"optimize: worker {worker} died (exit code {code}{cause}) before it finished and sent "
        "no error (os._exit, a crash, or a failure to start, which it printed to stderr); no "
        "index was written"
    )


def _prepare(
    fn: Fn,
    inputs: Sequence[Any],
    workers: int,
    chunk_size: int | str,
    labels: str,
    start_method: str,
    quality: int,
) -> tuple[str, Fn | bytes, int]:
    """Check the arguments before anything is written (a ConfigError); the start method,
    ``fn`` as the workers get it (`tierfeed.format.workerstart`) and the chunk size in bytes."""
    size = check_options(chunk_size, labels, quality)
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if start_method not in mp.get_all_start_methods():
        raise ConfigError(
            f"start_method {start_method!r} is not available here; use one of "
            f"{', '.join(mp.get_all_start_methods())}"
        )
    if not isinstance(inputs, Sequence):
        raise ConfigError(f"inputs must be a sequence (a list), not {type(inputs).__name__}")
    method = workerstart.start_method(fn, start_method)
    return method, workerstart.sendable(fn, method), size


def _run_workers(
    run: _Run, fn: Fn | bytes, root: Path, chunk_size: int, labels: str, quality: int
) -> list[ChunkRecord]:
    """Run the workers to the end; the records of their chunks, in worker order."""
    failed = True
    try:
        run.start(fn, root, chunk_size, labels in ("auto", "cls"), quality)
        run.collect()
        failed = False
    finally:
        run.close(failed)
    return [r for per_worker in run.records for r in per_worker]


def _number_chunks(root: Path, records: list[ChunkRecord]) -> None:
    """Rename the workers' chunks to the store's chunk names, in order."""
    for number, record in enumerate(records):
        final = chunk_file_name(number)
        os.replace(root / record.name, root / final)
        record.name = final


def _finish(
    root: Path, records: list[ChunkRecord], labels: str, names: list[str] | None, chunk_size: int
) -> IndexContent:
    """Name the workers' chunks in order and write the index (`finish_store`)."""
    _number_chunks(root, records)
    return finish_store(root, records, labels, names, chunk_size, check_unique=True)


def optimize(
    fn: Fn,
    inputs: Sequence[Any],
    dst: str | os.PathLike[str] | Destination,
    workers: int = 2,
    chunk_size: int | str = 64 * 2**20,
    labels: str = "auto",
    classes: Classes = None,
    overwrite: bool = False,
    start_method: str = "spawn",
    image_quality: int = 95,
) -> WriteReport:
    """Run ``fn`` over ``inputs`` in ``workers`` processes and write one store at ``dst``.

    ``fn(input)`` returns a sample dict (as `Writer.write` takes it) or an iterable of them.
    The store holds them in input order, as a `Writer` given ``fn(x)`` for each ``x`` would
    (only where chunks end differs); a sample without ``__key__`` is keyed by its input's
    index (``"000000042"``, ``_JJJJ`` added for an input's ``j``-th). Crash safety as `Writer`.

    Args:
        fn: called in the worker processes (with ``spawn``, a module-level function).
        inputs: a sequence (its length decides each worker's slice).
        dst: the store directory, or a `Destination` (``overwrite`` is then its own).
        workers: worker processes.
        chunk_size, labels, classes, overwrite, image_quality: as for `Writer`.
        start_method: ``spawn`` (default; safe beside threads), ``forkserver`` or ``fork``.

    Raises:
        PackError: an error in ``fn`` (with its traceback) or in a sample, a worker that could
            not load ``fn`` or died; no index is written and the chunks are removed.
        DuplicateKeyError: a key is written twice.
    """
    method, sent, size = _prepare(
        fn, inputs, workers, chunk_size, labels, start_method, image_quality
    )
    names = None if classes is None else load_classes(classes)
    destination = as_destination(dst, overwrite)
    started = time.perf_counter()
    with destination.building():
        destination.check()
        with claimed(destination) as root:
            run = _Run(mp.get_context(method), workers, inputs)
            try:
                records = _run_workers(run, sent, root, size, labels, image_quality)
                content = _finish(root, records, labels, names, size)
            except BaseException:
                remove_chunks(root / "chunks")
                raise
    destination.publish(root)
    return WriteReport.of(destination.store, content, len(records), started)
