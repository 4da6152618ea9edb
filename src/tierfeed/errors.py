"""The one exception tree of tierfeed: every error a user can see derives from TierfeedError."""

from __future__ import annotations

__all__ = [
    "BadMemberError",
    "ChunkCorruptError",
    "ConfigError",
    "DuplicateKeyError",
    "EmptySourceError",
    "ExchangeError",
    "FormatError",
    "IndexFormatError",
    "LoaderError",
    "NotFoundError",
    "PackError",
    "QuotaExceededError",
    "ReadOnlyError",
    "StorageError",
    "StuckReadError",
    "TierfeedError",
    "UnreadableFileError",
]


class TierfeedError(Exception):
    """Base class of every error tierfeed raises on purpose."""


class ConfigError(TierfeedError, ValueError):
    """An option or environment variable has a value tierfeed cannot use."""


# --- data format -------------------------------------------------------------


class FormatError(TierfeedError):
    """Stored data (an index or a chunk) is not what the format says it must be."""


class IndexFormatError(FormatError):
    """The index file is missing, of another format version, truncated or inconsistent."""


class ChunkCorruptError(FormatError):
    """A chunk is truncated, altered (checksum mismatch), or shorter than the index says."""


class BadMemberError(FormatError):
    """A tar member name is unsafe (absolute, `..`, NUL) or repeats another (tar-slip guard)."""


# --- packing -------------------------------------------------------------------


class PackError(TierfeedError):
    """The source of a pack cannot be packed as asked."""


class UnreadableFileError(PackError):
    """A source file cannot be read (permissions, I/O error, vanished, symlink loop)."""


class EmptySourceError(PackError):
    """The source holds no file to pack."""


class DuplicateKeyError(PackError):
    """Two source files map to the same sample key and extension."""


# --- storage --------------------------------------------------------------------


class StorageError(TierfeedError, OSError):
    """A storage driver failed; the message names the driver and the path."""


class NotFoundError(StorageError, FileNotFoundError):
    """The path does not exist in that storage."""


class ReadOnlyError(StorageError):
    """A write or delete was attempted on read-only storage (the origin)."""


class QuotaExceededError(StorageError):
    """An entry does not fit into a tier's byte quota."""


# --- loading -------------------------------------------------------------------


class StuckReadError(TierfeedError, TimeoutError):
    """A read has not completed within the hard timeout; names the chunk and sample."""


class LoaderError(TierfeedError, RuntimeError):
    """The Loader's workers ended an iteration before the epoch was complete."""


# --- distributed ---------------------------------------------------------------


class ExchangeError(TierfeedError, RuntimeError):
    """A collective between ranks failed or timed out; names the rank, epoch and window."""
