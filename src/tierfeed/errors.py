"""The one exception tree of tierfeed: every error a user can see derives from TierfeedError."""

from __future__ import annotations

from typing import Any

__all__ = [
    "INSTALL_TORCH",
    "BadMemberError",
    "ChunkCorruptError",
    "ConfigError",
    "DecodeError",
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
    "WriteError",
]


# What to do when the PyTorch face (tierfeed.torch, stage) is asked for without torch: the one
# wording every place that finds it missing gives.
INSTALL_TORCH = (
    "pip install 'tierfeed[torch]' (a CPU-only build: pip install torch --index-url "
    "https://download.pytorch.org/whl/cpu)"
)


class TierfeedError(Exception):
    """Base class of every error tierfeed raises on purpose."""


class ConfigError(TierfeedError, ValueError):
    """An option or environment variable has a value tierfeed cannot use."""


class MisuseError(ConfigError):
    """A tierfeed dataset used where it cannot work, found in a DataLoader worker: torch
    re-raises a worker's error in the main process as its type made from the worker's whole
    report (``Caught ... in DataLoader worker process 0.`` and the worker's traceback); this
    type keeps only the report's last line, the message itself, which says what to write
    instead: the user's mistake is in the main process's code, not in the worker."""

    def __init__(self, message: str) -> None:
        if message.startswith("Caught ") and "\nOriginal Traceback" in message:
            last = message.rstrip().rsplit("\n", 1)[-1]
            message = last.split(f"{type(self).__name__}: ", 1)[-1]
        super().__init__(message)


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


class WriteError(PackError):
    """A file of the store being written could not be written: ``path``, the OS's
    ``problem`` (disk full, read-only, ...), and ``advice``, what to do about it; a caller
    that knows better advice (where a URL's store is built first) gives it with `advised`."""

    def __init__(self, path: str, problem: str, advice: str) -> None:
        super().__init__(f"{path}: cannot write ({problem}); {advice}")
        self.path, self.problem, self.advice = path, problem, advice

    def advised(self, advice: str) -> WriteError:
        """The same failure, with ``advice`` in place of this one's."""
        return WriteError(self.path, self.problem, advice)


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


class DecodeError(TierfeedError, ValueError, OSError):
    """The user's decode failed on a sample; names the sample key and its chunk file.

    The decoder's own exception is ``__cause__``. Attributes (None when the error was
    re-created from its message, as DataLoader does for an error raised in a worker, whose
    message carries the original traceback instead):

    Attributes:
        key: the sample key.
        chunk: the path of the chunk file holding the sample.
    """

    def __init__(self, message: str, *, key: str | None = None, chunk: str | None = None) -> None:
        super().__init__(message)
        self.key, self.chunk = key, chunk

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (str(self), self.key, self.chunk))


def _rebuild(message: str, key: str | None, chunk: str | None) -> DecodeError:
    return DecodeError(message, key=key, chunk=chunk)


# --- distributed ---------------------------------------------------------------


class ExchangeError(TierfeedError, RuntimeError):
    """A collective between ranks failed or timed out; names the rank, epoch and window."""
