"""CLI subcommands `tierfeed mount` and `tierfeed umount`."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from tierfeed.errors import ConfigError
from tierfeed.units import parse_size

__all__ = ["register_mount", "register_umount", "serve"]


def _tiered_store(store_path: str, ram: int, disk: str | None, disk_bytes: int, policy: str) -> Any:
    """The store read through RAM and local-disk tiers, or directly when none is asked."""
    from tierfeed.format.index import Index
    from tierfeed.format.store import Store, open_store
    from tierfeed.storage import MemoryDriver, PosixDriver, Tier, TierStack, disk_tier

    if ram <= 0 and disk is None:
        return open_store(store_path)
    index = Index(store_path)
    tiers = [Tier(MemoryDriver(ram), ram, name="ram")] if ram > 0 else []
    if disk is not None:
        tiers.append(disk_tier(disk, disk_bytes))
    origin = PosixDriver(index.path.parent, read_only=True)
    return Store(index, TierStack(index.chunks(), origin, tiers, policy))


def serve(
    store_path: str,
    mountpoint: str,
    allow_other: bool = False,
    tiers: tuple[int, str | None, int, str] = (0, None, 0, "fill-top"),
) -> None:
    """Serve the store at ``mountpoint`` in this process until unmounted or signalled.

    Args:
        store_path: the store directory.
        mountpoint: an existing empty directory.
        allow_other: let other users see the mount.
        tiers: (RAM bytes, disk directory or None, disk bytes, placement policy).
    """
    import logging

    import mfusepy

    from tierfeed.mount.view import StoreView
    from tierfeed.storage import TierStack

    logging.basicConfig(format="tierfeed mount: %(message)s", level=logging.WARNING)
    store = _tiered_store(store_path, *tiers)
    try:
        source = store.source
        if isinstance(source, TierStack):
            last = len(store.chunks) - 1

            def readahead(chunk: int) -> None:
                # A sequential reader walks the tree in path order, which is chunk order:
                # its next chunk is this one's successor.
                source.schedule(chunk)
                source.schedule(min(chunk + 1, last))

            view = StoreView(store, extra_stats=source.stats, on_open=readahead)
        else:
            view = StoreView(store)
        # SIGTERM unmounts cleanly: libfuse leaves its loop when the mount goes away.
        signal.signal(signal.SIGTERM, lambda *_: _unmount_quietly(mountpoint))
        options: dict[str, Any] = {
            "foreground": True,
            "ro": True,
            "fsname": f"tierfeed:{store_path}",
            "attr_timeout": 3600.0,  # the tree never changes while mounted
            "entry_timeout": 3600.0,
        }
        if allow_other:
            options["allow_other"] = True
        mfusepy.FUSE(view, mountpoint, raw_fi=True, **options)
    finally:
        store.close()


def _unmount_quietly(mountpoint: str) -> None:
    from tierfeed.mount.lifecycle import unmount

    try:
        unmount(mountpoint)
    except OSError as exc:
        print(f"tierfeed mount: {exc}", file=sys.stderr)


def _run_mount(args: argparse.Namespace) -> int:
    tiers = (parse_size(args.ram), args.disk, parse_size(args.disk_size), args.policy)
    if args.foreground:
        serve(args.store, args.mountpoint, args.allow_other, tiers)
        return 0
    from tierfeed.format.index import Index
    from tierfeed.mount.lifecycle import FuseProcess

    Index(args.store).close()  # a bad store fails here, with its own message
    argv = [sys.executable, "-m", "tierfeed", "mount", args.store, args.mountpoint, "--foreground"]
    argv += ["--ram", args.ram, "--disk-size", args.disk_size, "--policy", args.policy]
    if args.disk:
        argv += ["--disk", args.disk]
    if args.allow_other:
        argv.append("--allow-other")
    FuseProcess(argv, args.mountpoint, name="tierfeed mount", detachable=True).start().detach()
    print(f"mounted {args.store} at {args.mountpoint} (read-only); `tierfeed umount` to stop")
    return 0


def register_mount(sub: Any) -> None:
    """Add `tierfeed mount`."""
    p = sub.add_parser("mount", help="mount a store read-only as its original directory tree")
    p.add_argument("store", help="store directory or index file")
    p.add_argument("mountpoint", help="an empty directory")
    p.add_argument("--foreground", action="store_true", help="serve in this process")
    p.add_argument(
        "--allow-other", action="store_true", help="let other users see the mount (needs root)"
    )
    p.add_argument("--ram", default="0", help="RAM tier size, e.g. 4GiB (default: none)")
    p.add_argument("--disk", help="local-disk tier directory (shared by processes of a host)")
    p.add_argument("--disk-size", default="100GiB", help="local-disk tier quota")
    p.add_argument("--policy", default="fill-top", choices=["fill-top", "lru", "clairvoyant"])
    p.set_defaults(func=_run_mount)


def _run_umount(args: argparse.Namespace) -> int:
    from tierfeed.mount.lifecycle import is_mounted, unmount

    if not is_mounted(args.mountpoint):
        raise ConfigError(f"{args.mountpoint}: nothing is mounted there")
    unmount(args.mountpoint, lazy=args.lazy)
    print(f"unmounted {args.mountpoint}")
    return 0


def register_umount(sub: Any) -> None:
    """Add `tierfeed umount`."""
    p = sub.add_parser("umount", help="unmount a tierfeed mount")
    p.add_argument("mountpoint")
    p.add_argument("--lazy", action="store_true", help="detach even if files are open")
    p.set_defaults(func=_run_umount)
