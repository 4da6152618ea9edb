"""Kernel caching and threading choices of a slowfs mount, and their command-line form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tierfeed.errors import ConfigError

__all__ = ["CACHE_MODES", "SLOWFS_SUBTYPE", "CacheMode", "SlowFSOptions"]

SLOWFS_SUBTYPE = "slowfs"  # the mount table's fuse.slowfs: what `tierfeed umount` also stops

CacheMode = Literal["none", "keep", "direct"]
CACHE_MODES: tuple[CacheMode, ...] = ("none", "keep", "direct")


@dataclass(frozen=True)
class SlowFSOptions:
    """How much the kernel may cache in front of the slowed origin.

    The default models a cold client of a shared file system under memory pressure: the
    kernel may cache attributes and names for about a second (like NFS ``actimeo``), but
    file data survives only while a file stays open, so every epoch of a per-file loader
    pays every open and every byte again.

    Attributes:
        cache: file data caching.
            ``"none"`` (default): pages are dropped at every open (no FOPEN_KEEP_CACHE);
            readahead and re-reads within one open are cached; mmap works.
            ``"keep"``: pages are kept across opens (a warm local file system): a second
            epoch may be served entirely from the page cache and never reach the origin.
            ``"direct"``: direct_io, no page cache and no readahead at all; every read()
            reaches the server with the caller's size; mmap of files is refused.
        attr_timeout: seconds the kernel caches a file's attributes (libfuse default 1).
        entry_timeout: seconds the kernel caches a name lookup (libfuse default 1).
        negative_timeout: seconds the kernel remembers that a name does not exist.
        threads: most requests served at once (libfuse ``max_threads``, and the kernel's
            ``max_background`` for readahead); delays of concurrent requests overlap up to
            this many, as on a shared file system serving many clients.
        shared_bandwidth: the model's ``bandwidth_mbps`` caps the whole mount, as one
            link shared by all concurrent reads (default). False caps each read request
            on its own, as the ``slow`` storage driver does; concurrent readahead then
            multiplies the effective bandwidth.
        single_threaded: serve one request at a time (FUSE ``-s``); delays then add up.
        allow_other: let users other than the one who mounted read the mount.
    """

    cache: CacheMode = "none"
    attr_timeout: float = 1.0
    entry_timeout: float = 1.0
    negative_timeout: float = 0.0
    threads: int = 32
    shared_bandwidth: bool = True
    single_threaded: bool = False
    allow_other: bool = False

    def __post_init__(self) -> None:
        if self.cache not in CACHE_MODES:
            raise ConfigError(f"slowfs cache mode {self.cache!r} is not one of {CACHE_MODES}")
        for name in ("attr_timeout", "entry_timeout", "negative_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"slowfs {name} must be >= 0 seconds, got {getattr(self, name)}")
        if not 1 <= self.threads <= 1024:
            raise ConfigError(f"slowfs threads must lie in [1, 1024], got {self.threads}")

    def to_argv(self) -> list[str]:
        """The ``tierfeed slowfs`` flags that reproduce these options."""
        argv = [
            "--cache",
            self.cache,
            "--attr-timeout",
            repr(self.attr_timeout),
            "--entry-timeout",
            repr(self.entry_timeout),
            "--negative-timeout",
            repr(self.negative_timeout),
            "--threads",
            str(self.threads),
        ]
        if not self.shared_bandwidth:
            argv.append("--per-request-bandwidth")
        if self.single_threaded:
            argv.append("--single-threaded")
        if self.allow_other:
            argv.append("--allow-other")
        return argv

    def fuse_kwargs(self) -> dict[str, bool | float | str]:
        """Mount options for mfusepy's ``FUSE(...)`` (``ro``: the kernel refuses writes too)."""
        kwargs: dict[str, bool | float | str] = {
            "foreground": True,
            "ro": True,
            "default_permissions": True,
            "fsname": "slowfs",
            "subtype": SLOWFS_SUBTYPE,
            "attr_timeout": self.attr_timeout,
            "entry_timeout": self.entry_timeout,
            "negative_timeout": self.negative_timeout,
            # libfuse 3.14 otherwise caps the pool at 10 threads (and warns about it).
            "max_threads": self.threads,
            "max_idle_threads": self.threads,
        }
        if self.single_threaded:
            kwargs["nothreads"] = True
        if self.allow_other:
            kwargs["allow_other"] = True
        return kwargs
