"""slowfs: a read-only FUSE pass-through that slows every open, stat and read by a seeded model.

It is the common slowed origin of tierfeed's tests, demo and side-by-side benchmarks:
any program (a per-file PyTorch loader, MosaicML Streaming, LitData, WebDataset, ``tar``)
reads a directory through it as if it sat on a slow shared file system.

Command line::

    tierfeed slowfs SRC MOUNTPOINT --latency heavy-tail --seed 1
    cat MOUNTPOINT/.slowfs/stats.json        # live counters
    fusermount3 -u MOUNTPOINT                # or Ctrl-C / SIGTERM

Python::

    from tierfeed.slowfs import SlowFS
    from tierfeed.latency import LatencyModel

    with SlowFS("data", "mnt", LatencyModel.parse("nfs")) as fs:
        before = fs.stats()
        ...                                   # read files under fs.mountpoint
        print((fs.stats() - before).opens)

Latency model (``tierfeed.latency.LatencyModel``), one draw per operation that
reaches the server — getattr (stat/lookup), open, readdir, readlink and each read
request (the kernel sizes them, 128 KiB or more): a lognormal latency with median
``median_ms`` and shape ``sigma``, plus ``stall_ms`` with probability ``tail_prob``;
a read adds ``nbytes / bandwidth_mbps``. Presets: ``none`` (plain pass-through: FUSE
alone), ``nfs`` (median 1 ms, sigma 0.5, 400 MB/s), ``heavy-tail`` (``nfs`` plus a 1 s
stall on one operation in a thousand). Delays are slept in FUSE's worker threads
(``--threads``, default 32), so concurrent requests overlap as on a real server;
``--single-threaded`` serialises them. The bandwidth cap
is one link shared by the whole mount (``--per-request-bandwidth``: per request, as the
``slow`` storage driver). The k-th draw is fixed by the seed, so ``delay_s`` is the sum
of the first ``ops`` draws; which operation gets which draw depends on arrival order.

Kernel caching (``SlowFSOptions``): attributes and names are cached for 1 s, file data
only while a file is open (``--cache none``), so every epoch pays every open and byte
again, like a cold NFS/Lustre client under memory pressure. ``--cache keep`` keeps pages
across opens (epoch 2 may never reach the origin); ``--cache direct`` disables the page
cache and readahead (every read() reaches the server; mmap is refused).

Writes of any kind fail with EROFS; the source tree is never modified (opened
``O_RDONLY|O_NOATIME``). ``MOUNTPOINT/.slowfs/stats.json`` is not listed in the root.
A server killed with SIGKILL leaves a stale mount; ``cleanup_stale_mount`` (called by
``SlowFS.start`` too) removes it.
"""

from __future__ import annotations

from tierfeed.fuse.process import FuseProcess, cleanup_stale_mount, is_stale_mount, unmount
from tierfeed.slowfs.mounted import SlowFS, latency_spec
from tierfeed.slowfs.options import SlowFSOptions
from tierfeed.slowfs.stats import SlowFSStats

__all__ = [
    "FuseProcess",
    "SlowFS",
    "SlowFSOptions",
    "SlowFSStats",
    "cleanup_stale_mount",
    "is_stale_mount",
    "latency_spec",
    "unmount",
]
