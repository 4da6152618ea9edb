"""The fsspec driver: any fsspec URL (s3://, gs://, http://, file://) as storage."""

from __future__ import annotations

from typing import Any

from tierfeed.errors import ConfigError, NotFoundError, StorageError
from tierfeed.format.relpath import relative_parts
from tierfeed.storage.driver import Driver

__all__ = ["FsspecDriver"]


class FsspecDriver(Driver):
    """Objects under an fsspec URL; library errors become tierfeed errors here.

    Args:
        url: e.g. ``s3://bucket/datasets/imagenet.tf``.
        read_only: refuse writes and deletes.
        storage_options: passed to ``fsspec.url_to_fs`` (credentials, endpoint_url, ...).
    """

    def __init__(self, url: str, read_only: bool = False, **storage_options: Any) -> None:
        super().__init__(read_only)
        try:
            import fsspec
        except ImportError:
            raise ConfigError(
                "the fsspec driver needs fsspec (and s3fs for s3://): "
                "pip install 'tierfeed[fsspec]'"
            ) from None
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        self.name = f"fsspec:{url}"

    def _full(self, path: str) -> str:
        parts = relative_parts(
            path, lambda: StorageError(f"{self}: path {path!r} would leave the root")
        )
        return "/".join((self.root, *parts))

    def _fail(self, path: str, exc: Exception) -> StorageError:
        if isinstance(exc, FileNotFoundError):
            return NotFoundError(f"{self}: no object {path!r}")
        return StorageError(f"{self}: {path}: {type(exc).__name__}: {exc}")

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        try:
            data = bytes(self.fs.cat_file(self._full(path), start=offset, end=offset + length))
        except Exception as exc:  # library errors are translated at this boundary
            raise self._fail(path, exc) from None
        self.counters.add(reads=1, bytes_read=len(data))
        return data

    def size(self, path: str) -> int:
        self.counters.add(stats=1)
        try:
            return int(self.fs.size(self._full(path)))
        except Exception as exc:
            raise self._fail(path, exc) from None

    def list(self, prefix: str = "") -> list[str]:
        self.counters.add(lists=1)
        try:
            found = self.fs.find(self.root)
        except Exception as exc:
            raise self._fail(prefix or ".", exc) from None
        rel = (str(p)[len(self.root) + 1 :] for p in found)
        return sorted(p for p in rel if p.startswith(prefix))

    def _write(self, path: str, data: bytes) -> None:
        # Object stores publish a PUT whole or not at all; for file-like backends fsspec
        # writes through a temporary and moves it.
        try:
            self.fs.pipe_file(self._full(path), data)
        except Exception as exc:
            raise self._fail(path, exc) from None

    def _delete(self, path: str) -> None:
        if not self.exists(path):
            raise NotFoundError(f"{self}: no object {path!r}")
        try:
            self.fs.rm_file(self._full(path))
        except Exception as exc:
            raise self._fail(path, exc) from None
