"""The head of a worker's reads, read at once: each sample it delivers first, as one exact
range, all in parallel, while the copies of their chunks begin.

A cold epoch's first batch touches as many chunks as it has samples, up to all of a store's;
copies start a few at a time, and a read whose chunk waits for a copy thread would wait for
it, then for its piece behind the other copies'. A head read asks the origin for one sample's
bytes alone; the reads of that sample's members are then served from it (each member still
checked against its checksum by the store). Its bytes are origin bytes beside the copies'
(counted with them), so a head is a batch, not more.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future

from tierfeed.daemonpool import DaemonPool
from tierfeed.format.chunkref import ChunkInfo
from tierfeed.storage.originfetch import OriginFetch

__all__ = ["HEAD_GETS", "HEAD_THREADS", "HeadReads"]

HEAD_THREADS = 16  # head reads in flight at once from a file system
# From an object store: a batch's GETs in flight at once. A GET waits out its request's
# latency; 16 at a time, in a worker whose copies keep its other threads busy, spread a
# head's 64 GETs over seconds (docs/BENCHMARKS.md, "The first batch from a user-sized object
# store").
HEAD_GETS = 64


class _Span:
    """One sample's bytes in its chunk, read (or being read), and its members not yet served."""

    __slots__ = ("end", "future", "members", "start")

    def __init__(self, start: int, end: int, members: int, future: Future[bytes]) -> None:
        self.start, self.end, self.members, self.future = start, end, members, future


class HeadReads:
    """Exact-range reads of the samples a process reads first (`start`), served once each
    (`take`)."""

    def __init__(self, fetch: OriginFetch) -> None:
        self._fetch = fetch
        width = HEAD_GETS if fetch.origin.costly_requests else HEAD_THREADS
        self._pool = DaemonPool(width, "tierfeed-head")  # a stuck read holds no close
        self._lock = threading.Lock()
        self._spans: dict[int, list[_Span]] = {}  # chunk -> its samples read ahead
        self._closed = False

    def start(
        self,
        infos: Sequence[ChunkInfo],
        starts: Sequence[int],
        ends: Sequence[int],
        members: Sequence[int],
        first: bool = True,
    ) -> int:
        """Read each sample's span (``starts[i]`` to ``ends[i]`` of chunk ``infos[i]``, which
        holds ``members[i]`` members) from the origin, in parallel, ahead of the copies' pieces
        (a bounded wait: `OriginFetch.heads_begin`) unless not ``first``; returns how many
        began."""
        began = 0
        with self._lock:
            if self._closed:
                return 0
            for info, start, end, count in zip(infos, starts, ends, members, strict=True):
                spans = self._spans.setdefault(info.id, [])
                if any(s.start <= start and end <= s.end for s in spans):
                    continue  # read ahead already (a sample twice in a head)
                if first:  # the copies' pieces wait for it (a bounded time)
                    self._fetch.heads_begin(1)
                # The way a copy's pieces go (`Driver.read_block`): past the page cache on a
                # file system (no readahead around the range), on the threads' own client
                # on S3 (not behind the event loop of fsspec).
                future = self._pool.submit(self._fetch.read, info, start, end - start, block=True)
                if first:
                    future.add_done_callback(lambda _: self._fetch.heads_end())
                spans.append(_Span(start, end, count, future))
                began += 1
        return began

    def take(self, chunk: int, offset: int, length: int) -> bytes | None:
        """The range, from a head read that covers it (waiting for it: a read the origin
        bounds, as any); None when none covers it, or its read failed (the caller then reads
        as it would have)."""
        with self._lock:
            spans = self._spans.get(chunk, [])
            span = next((s for s in spans if s.start <= offset and offset + length <= s.end), None)
            if span is None:
                return None
            span.members -= 1
            if span.members <= 0:  # every member served: let its bytes go
                spans.remove(span)
                if not spans:
                    del self._spans[chunk]
        try:
            data = span.future.result()
        except Exception:  # the ordinary read path reads it again, and reports its failure
            return None
        begin = offset - span.start
        return data[begin : begin + length]

    def drop(self, chunk: int) -> bool:
        """Serve no more of ``chunk``'s head reads (bytes served from it failed their check);
        True if there were any."""
        with self._lock:
            return self._spans.pop(chunk, None) is not None

    @property
    def pending(self) -> int:
        """Samples read ahead and not yet served."""
        with self._lock:
            return sum(len(s) for s in self._spans.values())

    def close(self) -> None:
        """Cancel head reads not begun and wait a bounded time for the running ones;
        idempotent."""
        with self._lock:
            self._closed = True
            self._spans.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
