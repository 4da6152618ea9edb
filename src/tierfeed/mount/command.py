"""CLI subcommands `tierfeed mount` and `tierfeed umount`."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from tierfeed.errors import ConfigError

__all__ = ["register_mount", "register_umount", "serve"]


def serve(store_path: str, mountpoint: str, allow_other: bool = False) -> None:
    """Serve the store at ``mountpoint`` in this process until unmounted or signalled."""
    import logging

    import mfusepy

    from tierfeed.format.store import open_store
    from tierfeed.mount.view import StoreView

    logging.basicConfig(format="tierfeed mount: %(message)s", level=logging.WARNING)
    store = open_store(store_path)
    try:
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
    if args.foreground:
        serve(args.store, args.mountpoint, args.allow_other)
        return 0
    from tierfeed.format.index import Index
    from tierfeed.mount.lifecycle import FuseProcess

    Index(args.store).close()  # a bad store fails here, with its own message
    argv = [sys.executable, "-m", "tierfeed", "mount", args.store, args.mountpoint, "--foreground"]
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
