"""A DataLoader worker keeps the heap memory it frees, instead of handing it back and faulting
it in again for the next batch.

A worker reads each sample into fresh memory (a bytes object per member), decodes it, collates
the batch and frees it all, batch after batch. glibc's malloc gives the top of its heap back
to the kernel once more than its trim threshold is free there, and that threshold follows the
largest block it has freed through ``mmap`` (twice its size, from 128 KiB): a few hundred KiB
in a worker whose samples are tens of KiB. So each batch's freed samples were handed back and
the next batch's reads faulted every page in again: a read into memory handed back took
several times as long as one into a kept heap, and warm epochs were bimodal per run
(`bench/worker_heap.py` gives the figures; docs/BENCHMARKS.md, "The worker's heap kept").

`keep_worker_heap` sets, once per worker process, what glibc's own adaptive rule arrives at
after freeing its largest ``mmap`` block (32 MiB): blocks up to 32 MiB come from the heap,
and up to 64 MiB free at a heap's top is kept. A worker then holds on to about what its
largest batches and read-ahead used, which it uses again at the next batch. Only a worker's
process is changed, never the training process; nothing is done where the C library is not
glibc, where the environment tunes malloc itself (``MALLOC_*_`` variables, ``GLIBC_TUNABLES``
naming malloc, an allocator in ``LD_PRELOAD``), or where ``TIERFEED_WORKER_HEAP=0``
(`tierfeed.config.worker_heap_wanted`).
"""

from __future__ import annotations

import ctypes
import os
import platform

from tierfeed.config import worker_heap_wanted

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_worker_heap"]

MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: its rule's ceiling
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what its rule sets beside it
_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3

_kept_in: int | None = None  # the process that set them


def keep_worker_heap() -> bool:
    """In a DataLoader worker, once per process: keep freed heap memory for reuse (see the
    module). Returns whether this process has it set (False: left to the C library)."""
    global _kept_in
    if _kept_in == os.getpid():
        return True
    if not worker_heap_wanted() or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # Either call ends glibc's adaptive rule: both are set, so neither stays where it was.
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return False
    if mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return False
    _kept_in = os.getpid()
    return True
