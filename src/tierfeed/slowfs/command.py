"""`tierfeed slowfs SRC MOUNTPOINT`: serve SRC read-only and slowed until unmounted or signalled."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from tierfeed.errors import StorageError
from tierfeed.latency import LatencyModel
from tierfeed.slowfs.options import CACHE_MODES, SlowFSOptions

__all__ = ["register"]

_EPILOG = """\
latency presets: none (plain pass-through); nfs (median 1 ms lognormal, sigma 0.5,
400 MB/s); heavy-tail (nfs plus a 1 s stall on 1 op in 1000); stalls (nfs plus a 2 s
stall on 1 op in 10,000 and 150 ms on 1 open in 100). Or give the fields, e.g.
--latency median_ms=5,sigma=0.5,tail_prob=1e-3,stall_ms=2000,bandwidth_mbps=200
(open_tail_prob and open_stall_ms: the opens' own stalls).
Live counters: MOUNTPOINT/.slowfs/stats.json. Stop with Ctrl-C, SIGTERM,
`tierfeed umount MOUNTPOINT` or `fusermount3 -u MOUNTPOINT`; with --background the
command returns once the mount is live and `tierfeed umount MOUNTPOINT` stops it.
"""

# The options a --background server is started with again (name, attribute).
_PASSED = (
    ("--latency", "latency"),
    ("--seed", "seed"),
    ("--cache", "cache"),
    ("--attr-timeout", "attr_timeout"),
    ("--entry-timeout", "entry_timeout"),
    ("--negative-timeout", "negative_timeout"),
    ("--threads", "threads"),
    ("--stats-file", "stats_file"),
)
_FLAGS = (
    ("--per-request-bandwidth", "per_request_bandwidth"),
    ("--single-threaded", "single_threaded"),
    ("--allow-other", "allow_other"),
    ("-q", "quiet"),
)


def _background(args: argparse.Namespace) -> int:
    """Serve in a process of its own session, as `tierfeed mount` does; return once the
    mount is live (a bad option or path fails as in the foreground, in one line)."""
    from tierfeed.fuse.process import FuseProcess

    argv = [sys.executable, "-m", "tierfeed", "slowfs", args.src, args.mountpoint]
    for flag, name in _PASSED:
        value = getattr(args, name)
        if value is not None:
            argv += [flag, str(os.path.abspath(value) if name == "stats_file" else value)]
    argv += [flag for flag, name in _FLAGS if getattr(args, name)]
    FuseProcess(argv, args.mountpoint, name="tierfeed slowfs", detachable=True).start().detach()
    print(
        f"slowfs: serving {args.src} at {args.mountpoint}; `tierfeed umount {args.mountpoint}` "
        "to stop"
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    model = LatencyModel.parse(args.latency)  # (a bad spec fails here, before any start)
    if args.background:
        return _background(args)
    if args.seed is not None:
        model = dataclasses.replace(model, seed=args.seed)
    options = SlowFSOptions(
        cache=args.cache,
        attr_timeout=args.attr_timeout,
        entry_timeout=args.entry_timeout,
        negative_timeout=args.negative_timeout,
        threads=args.threads,
        shared_bandwidth=not args.per_request_bandwidth,
        single_threaded=args.single_threaded,
        allow_other=args.allow_other,
    )
    try:
        # Imported here: mfusepy loads libfuse3 on import, and `tierfeed --help` must not need it.
        from tierfeed.slowfs.passthrough import serve
    except ImportError as exc:
        raise StorageError(
            f"slowfs needs mfusepy ({exc}); install it with `pip install 'tierfeed[fuse]'`"
        ) from None
    except OSError as exc:
        raise StorageError(f"slowfs needs libfuse3 ({exc}); install fuse3 (make sysdeps)") from None
    if not args.quiet:
        print(f"slowfs: serving {args.src} at {args.mountpoint} with {model}", file=sys.stderr)
    stats = serve(args.src, args.mountpoint, model, options, args.stats_file)
    if not args.quiet:
        print(
            f"slowfs: unmounted; {stats.opens} opens, {stats.stats} stats, {stats.reads} reads "
            f"({stats.bytes_read} bytes), {stats.readdirs} listings, {stats.stalls} stalls, "
            f"{stats.delay_s:.3f} s injected",
            file=sys.stderr,
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `tierfeed slowfs`."""
    p = sub.add_parser(
        "slowfs",
        help="mount a directory read-only through FUSE with a seeded latency model",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", help="source directory (only ever read)")
    p.add_argument("mountpoint", help="empty directory to mount on")
    p.add_argument("--latency", default="none", help="preset or NAME=VALUE list (default none)")
    p.add_argument("--seed", type=int, help="seed of the latency sequence (overrides --latency)")
    p.add_argument(
        "--cache",
        choices=CACHE_MODES,
        default="none",
        help="kernel data caching: none = dropped at every open (default), keep = kept "
        "across opens, direct = no page cache at all",
    )
    p.add_argument("--attr-timeout", type=float, default=1.0, help="seconds (default 1)")
    p.add_argument("--entry-timeout", type=float, default=1.0, help="seconds (default 1)")
    p.add_argument("--negative-timeout", type=float, default=0.0, help="seconds (default 0)")
    p.add_argument("--threads", type=int, default=32, help="requests served at once (default 32)")
    p.add_argument(
        "--per-request-bandwidth",
        action="store_true",
        help="cap each read request's bandwidth on its own instead of the whole mount's",
    )
    p.add_argument("--single-threaded", action="store_true", help="serve one request at a time")
    p.add_argument("--allow-other", action="store_true", help="let other users read the mount")
    p.add_argument("--stats-file", help="write the final counters here as JSON at unmount")
    p.add_argument(
        "--background",
        action="store_true",
        help="serve in a process of its own and return once mounted (`tierfeed umount` stops it)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no start and summary lines")
    p.set_defaults(func=_run)
