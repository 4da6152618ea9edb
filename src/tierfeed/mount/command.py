"""CLI subcommands `tierfeed mount` and `tierfeed umount`."""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
from typing import TYPE_CHECKING, Any

from tierfeed.errors import ConfigError, StorageError, TierfeedError
from tierfeed.slowfs.options import SLOWFS_SUBTYPE
from tierfeed.units import parse_size

if TYPE_CHECKING:  # imported where used: `tierfeed --help` must not load the loader
    from tierfeed.loader.tierconfig import TierConfig
    from tierfeed.mount.view import StoreView
    from tierfeed.storage.store import Store

__all__ = [
    "FUSE_SUBTYPE",
    "check_mountpoint",
    "is_tierfeed_mount",
    "mount_tiers",
    "register_mount",
    "register_umount",
    "serve",
]

# Mounts show up in the mount table as ``fuse.tierfeed`` with source ``tierfeed:<store>``:
# that is how `tierfeed umount` tells its own mounts from everything else.
FUSE_SUBTYPE = "tierfeed"
_FSNAME_PREFIX = "tierfeed:"
DEFAULT_TIMEOUT_S = 60.0  # a read through the mount, its retries included, answers EIO after


def is_tierfeed_mount(mountpoint: str | os.PathLike[str]) -> bool:
    """True when the topmost mount at ``mountpoint`` is a ``tierfeed mount`` or a ``tierfeed
    slowfs`` (live or stale)."""
    from tierfeed.fuse.process import mount_entry

    entry = mount_entry(mountpoint)
    if entry is None:
        return False
    if entry.fstype in (f"fuse.{FUSE_SUBTYPE}", f"fuse.{SLOWFS_SUBTYPE}"):
        return True
    # Mounted by a tierfeed that gave no subtype yet: plain `fuse`, source tierfeed:<store>.
    return entry.fstype == "fuse" and entry.source.startswith(_FSNAME_PREFIX)


def check_mountpoint(mountpoint: str, nonempty: bool = False) -> str:
    """Refuse a target that is not an empty directory with nothing mounted on it.

    Returns:
        The mountpoint with symlinks resolved (the mount table shows the resolved path).

    Raises:
        ConfigError: the target is mounted, missing, not a directory, or not empty (unless
            ``nonempty``); the message says what to do.
    """
    from tierfeed.fuse.process import is_stale_mount, mount_entry

    entry = mount_entry(mountpoint)
    if entry is not None:
        dead = " whose server is gone" if is_stale_mount(mountpoint) else ""
        raise ConfigError(
            f"{mountpoint}: already a mountpoint ({entry.fstype} {entry.source}{dead}); "
            "unmount it first, or pick another empty directory"
        )
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        raise ConfigError(
            f"{mountpoint}: no such directory; create an empty directory to mount on"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{mountpoint}: cannot be used as a mountpoint ({exc.strerror})"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{mountpoint}: not a directory; mount on an empty directory")
    if not nonempty:
        try:
            with os.scandir(mountpoint) as entries:
                occupied = next(entries, None) is not None
        except OSError as exc:
            raise ConfigError(
                f"{mountpoint}: cannot be listed ({exc.strerror}); mount on an empty directory"
            ) from None
        if occupied:
            raise ConfigError(
                f"{mountpoint}: directory is not empty; the mount would hide its contents. Mount "
                "on an empty directory, or pass --nonempty to hide them while mounted"
            )
    resolved = os.path.realpath(mountpoint)
    if resolved != os.path.abspath(mountpoint) and mount_entry(resolved) is not None:
        raise ConfigError(f"{mountpoint}: {resolved} is already a mountpoint; unmount it first")
    return resolved


def _tiered_store(store_path: str, tiers: TierConfig | None, timeout: float) -> Store:
    """The store read through ``tiers`` (RAM, local disk), or directly without; a URL's reads
    under the retry policy bounded by ``timeout`` seconds (which then says why a read failed:
    the tries and the last fault). A plain OSError escaping a driver still ends in one line
    naming the file."""
    from tierfeed.format.chunkroot import is_url
    from tierfeed.loader.compose import open_store
    from tierfeed.storage.retry import RetryPolicy

    # The store's own bound a little inside the view's (which holds whatever the store does):
    # its error, naming the tries and the last fault, is then the one logged.
    retry = RetryPolicy(deadline_s=0.9 * timeout)
    options = {"retry": retry} if is_url(store_path) else None
    try:
        return open_store(store_path, tiers, storage_options=options)
    except TierfeedError:
        raise
    except OSError as exc:
        name = exc.filename if exc.filename is not None else store_path
        raise StorageError(f"{name}: cannot open the store ({exc.strerror or exc})") from None


def mount_tiers(ram: int, disk: str | None, disk_bytes: int, policy: str) -> TierConfig | None:
    """The tiers of `tierfeed mount`'s options: none unless a RAM size or a disk directory is
    given (the disk size then applies), with four copy threads."""
    from tierfeed.loader.tierconfig import TierConfig

    if ram <= 0 and disk is None:
        return None
    return TierConfig(max(ram, 0), disk, disk_bytes if disk is not None else None, policy, 4)


def _view(store: Store, timeout: float) -> StoreView:
    """The FUSE view of ``store``, reading ahead the chunk after each one opened."""
    from tierfeed.mount.view import StoreView

    source = store.source
    last = len(store.chunks) - 1

    def readahead(chunk: int) -> None:
        # A sequential reader walks the tree in path order, which is chunk order: its
        # next chunk is this one's successor (a source without a cache queues nothing).
        source.schedule(chunk)
        source.schedule(min(chunk + 1, last))

    return StoreView(store, extra_stats=source.stats, on_open=readahead, timeout_s=timeout)


def serve(
    store_path: str,
    mountpoint: str,
    allow_other: bool = False,
    tiers: TierConfig | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Serve the store at ``mountpoint`` in this process until unmounted or signalled.

    Args:
        store_path: the store directory or URL.
        mountpoint: an existing empty directory.
        allow_other: let other users see the mount, as far as the modes shown let them.
        tiers: the RAM and local-disk tiers to read it through (`mount_tiers`); none by default.
        timeout: seconds a read through the mount may take, the store's retries included
            (then EIO, and one log line naming the file).
    """
    import logging

    try:
        # mfusepy loads libfuse3 on import, and `tierfeed --help` must not need it.
        import mfusepy
    except OSError as exc:
        raise StorageError(f"mount needs libfuse3 ({exc}); install fuse3 (make sysdeps)") from None

    logging.basicConfig(format="tierfeed mount: %(message)s", level=logging.WARNING)
    store = _tiered_store(store_path, tiers, timeout)
    try:
        view = _view(store, timeout)
        # SIGTERM unmounts cleanly: libfuse leaves its loop when the mount goes away.
        signal.signal(signal.SIGTERM, lambda *_: _unmount_quietly(mountpoint))
        try:
            mfusepy.FUSE(view, mountpoint, raw_fi=True, **_fuse_options(store_path, allow_other))
        except RuntimeError as exc:  # libfuse said why on stderr; mfusepy only gives a code
            raise StorageError(f"{mountpoint}: libfuse could not mount the store ({exc})") from None
        finally:
            view.close()
    finally:
        store.close()


def _fuse_options(store_path: str, allow_other: bool) -> dict[str, Any]:
    """libfuse's mount options: read-only, named after the store, long attribute caching, and
    the modes shown enforced by the kernel where other users may look."""
    options: dict[str, Any] = {
        "foreground": True,
        "ro": True,
        # libfuse splits options at commas; a backslash keeps one in the name.
        "fsname": _FSNAME_PREFIX + _named(store_path).replace(",", "\\,"),
        "subtype": FUSE_SUBTYPE,
        "attr_timeout": 3600.0,  # the tree never changes while mounted
        "entry_timeout": 3600.0,
    }
    if allow_other:
        options["allow_other"] = True
        # Others see the tree's modes under the mounting user's name; the kernel then checks
        # them as shown (a 0600 file, a 0700 directory), as it would the tree's own. Without
        # allow_other no one else gets in, and the mounting user reads all it could before.
        options["default_permissions"] = True
    return options


def _named(store_path: str) -> str:
    """The store as the mount table names it: its absolute path, or its URL."""
    from tierfeed.format.chunkroot import is_url

    return store_path if is_url(store_path) else os.path.abspath(store_path)


def _unmount_quietly(mountpoint: str) -> None:
    from tierfeed.fuse.process import unmount

    try:
        unmount(mountpoint)
    except OSError as exc:
        print(f"tierfeed mount: {exc}", file=sys.stderr)


def _run_mount(args: argparse.Namespace) -> int:
    tiers = mount_tiers(parse_size(args.ram), args.disk, parse_size(args.disk_size), args.policy)
    if not 0 < args.timeout <= 3600:
        raise ConfigError(f"--timeout must be between 0 and 3600 seconds, got {args.timeout:g}")
    if args.foreground:  # serve() opens the store once, with the same message for a bad one
        mountpoint = check_mountpoint(args.mountpoint, args.nonempty)
        serve(args.store, mountpoint, args.allow_other, tiers, args.timeout)
        return 0
    from tierfeed.fuse.process import FuseProcess
    from tierfeed.loader.compose import TierConfig
    from tierfeed.loader.location import StoreLocation

    # A bad store fails here, with its own message (a URL's index lands where serve looks).
    cache = TierConfig(disk_dir=args.disk).index_cache()
    StoreLocation.of(args.store).open_index(cache).close()
    mountpoint = check_mountpoint(args.mountpoint, args.nonempty)

    argv = [sys.executable, "-m", "tierfeed", "mount", args.store, mountpoint, "--foreground"]
    argv += ["--ram", args.ram, "--disk-size", args.disk_size, "--policy", args.policy]
    argv += ["--timeout", repr(args.timeout)]
    if args.disk:
        argv += ["--disk", args.disk]
    if args.allow_other:
        argv.append("--allow-other")
    if args.nonempty:
        argv.append("--nonempty")
    FuseProcess(argv, mountpoint, name="tierfeed mount", detachable=True).start().detach()
    print(f"mounted {args.store} at {mountpoint} (read-only); `tierfeed umount` to stop")
    return 0


def register_mount(sub: Any) -> None:
    """Add `tierfeed mount`."""
    p = sub.add_parser("mount", help="mount a store read-only as its original directory tree")
    p.add_argument("store", help="store directory, index file, or URL (s3://bucket/ds)")
    p.add_argument("mountpoint", help="an empty directory")
    p.add_argument(
        "--nonempty", action="store_true", help="mount even if the directory is not empty"
    )
    p.add_argument("--foreground", action="store_true", help="serve in this process")
    p.add_argument(
        "--allow-other",
        action="store_true",
        help="let other users read the mount as far as the packed tree's modes let them (needs "
        "root, or user_allow_other in /etc/fuse.conf)",
    )
    p.add_argument("--ram", default="0", help="RAM tier size, e.g. 4GiB (default: none)")
    p.add_argument("--disk", help="local-disk tier directory (shared by processes of a host)")
    p.add_argument("--disk-size", default="100GiB", help="local-disk tier quota")
    p.add_argument(
        "--policy",
        default="fill-top",
        choices=["fill-top", "lru", "clairvoyant"],
        help="placement of chunks in the RAM and disk tiers (default fill-top)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="a read that takes longer, retries of transient faults of the store included, is "
        f"answered EIO and logged (default {DEFAULT_TIMEOUT_S:g})",
    )
    p.set_defaults(func=_run_mount)


def _run_umount(args: argparse.Namespace) -> int:
    from tierfeed.fuse.process import mount_entry, unmount

    entry = mount_entry(args.mountpoint)
    if entry is None:
        raise ConfigError(f"{args.mountpoint}: nothing is mounted there")
    if not is_tierfeed_mount(args.mountpoint):
        raise ConfigError(
            f"{args.mountpoint}: a {entry.fstype} mount ({entry.source}), not a tierfeed mount; "
            "`tierfeed umount` only unmounts what `tierfeed mount` mounted (use umount or "
            "fusermount3 -u for anything else)"
        )
    unmount(args.mountpoint, lazy=args.lazy)
    print(f"unmounted {args.mountpoint}")
    return 0


def register_umount(sub: Any) -> None:
    """Add `tierfeed umount`."""
    p = sub.add_parser("umount", help="unmount a tierfeed mount")
    p.add_argument("mountpoint", help="where `tierfeed mount` mounted a store")
    p.add_argument("--lazy", action="store_true", help="detach even if files are open")
    p.set_defaults(func=_run_umount)
