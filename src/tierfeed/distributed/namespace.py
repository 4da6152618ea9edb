"""One namespace over node-local storage: a ChunkSource that reads what the node staged and
what peers sent into the rank's inbox, never the origin.

A read of a member first looks in the inbox (a sample that moved here, possibly back into a
chunk this rank staged but later sent away), then in the node's staged chunks. A member
neither holds is on its way from a peer: the read waits for the exchange to publish it,
failing at once if the exchange failed, or after ``timeout_s``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.inbox import InboxView
from tierfeed.errors import ExchangeError, StorageError
from tierfeed.format.chunkfiles import DirectoryChunks
from tierfeed.format.chunkref import ChunkSource, checksum_bytes
from tierfeed.format.index import Index

__all__ = ["NamespaceSource", "inbox_dir", "member_locator"]

_POLL_S = 0.002


def inbox_dir(local_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` keeps the samples peers send it."""
    return Path(local_dir) / "inbox" / f"rank{rank}"


def member_locator(index: Index) -> npt.NDArray[np.int64]:
    """Members keyed by (chunk, offset) in ascending order: ``searchsorted`` finds a member."""
    key = (np.asarray(index.member_chunk, dtype=np.int64) << 40) | np.asarray(
        index.member_offset, dtype=np.int64
    )
    if len(key) > 1 and not bool(np.all(key[1:] > key[:-1])):
        raise StorageError(f"{index.path}: members are not in chunk order; re-index the store")
    return key


class NamespaceSource(ChunkSource):
    """Chunk ranges for one rank: from its node's staged chunks, or from its inbox.

    Args:
        index: the store's index (the node-local copy).
        local: per chunk, whether this rank may read it from the node's local directory.
        inbox: the rank's inbox directory.
        timeout_s: how long a read waits for a member a peer has not sent yet.
        verify_local: check members read from staged chunks, and wait for the inbox when one
            fails (partial plans: a sample can come back to a chunk it had left).
    """

    def __init__(
        self,
        index: Index,
        local: npt.NDArray[np.bool_],
        inbox: str | os.PathLike[str],
        timeout_s: float = 120.0,
        verify_local: bool = False,
    ) -> None:
        self.index = index
        self.local = np.asarray(local, dtype=bool)
        self.timeout_s = timeout_s
        self.chunks = DirectoryChunks(index.path.parent, index.chunks(), index.path)
        self.view = InboxView(inbox)
        self._key = member_locator(index)
        self._checksum = index.member_checksum
        self.verify_local = verify_local
        self._mutex = threading.Lock()

    def begin_epoch(self) -> None:
        """Load what arrived since the last look (samples moved here for this epoch)."""
        with self._mutex:
            self.view.refresh()

    def _member(self, chunk: int, offset: int) -> int:
        i = int(np.searchsorted(self._key, (chunk << 40) | offset))
        if i >= len(self._key) or int(self._key[i]) != (chunk << 40) | offset:
            raise StorageError(
                f"{self.index.path}: no member starts at offset {offset} of chunk {chunk}"
            )
        return i

    def read_range(self, chunk: int, offset: int, length: int) -> bytes:
        """``length`` bytes of a member: from the inbox, the node's chunks, or (waiting) a peer."""
        member = self._member(chunk, offset)
        with self._mutex:
            data = self.view.read(member, length)
        if data is not None:
            return data
        if self.local[chunk]:
            data = self.chunks.read_range(chunk, offset, length)
            if not self.verify_local or checksum_bytes(data) == int(self._checksum[member]):
                return data
            # Sent away earlier (its range punched out) and on its way back from a peer.
        return self._wait(member, chunk, length)

    def _wait(self, member: int, chunk: int, length: int) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while True:
            with self._mutex:
                self.view.refresh()
                data = self.view.read(member, length)
                failure = self.view.failure()
            if data is not None:
                return data
            if failure is not None:
                raise ExchangeError(failure)
            if time.monotonic() > deadline:
                key = self.index.key(self.index.member_owner(member))
                raise ExchangeError(
                    f"sample {key!r} (chunk {self.index.chunk_name(chunk)}) has not arrived "
                    f"from its holder within {self.timeout_s:g} s: the exchange is behind or "
                    f"stuck; see {self.view.root} and the other ranks' logs"
                )
            time.sleep(_POLL_S)

    def close(self) -> None:
        """Close chunk and segment files."""
        self.chunks.close()
        self.view.close()
