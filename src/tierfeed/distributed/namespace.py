"""One namespace over node-local storage: a read-only origin `Driver`, keyed by chunk name,
over what the node staged and what peers sent into the rank's inbox, never the real origin.

A `TierStack` sits on it like on any origin, so a distributed job has RAM and disk tiers.
A chunk staged whole on this node serves any byte range, and a tier may copy it; under
partition plans, whose ranks punch out the samples they send away, only until the rank marks
it punched (a whole-chunk read: once it matches the chunk's checksum; a tier's piece: the
tier checks its copy whole before placing it). A chunk held in part (samples
moved here, a punched staged chunk, the rank's part of a chunk split between partitions)
serves ranges inside one member: from the inbox, from the rank's part or the staged file
(both checked), or, for a member on its way from a peer, once the exchange publishes it,
failing at once if the exchange failed, or after ``timeout_s``. A range it cannot serve
raises `NotFoundError`, never wrong bytes: that is what makes a tier skip copying the chunk.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tierfeed.distributed.inbox import InboxView, is_punched, parts_dir, punched_dir
from tierfeed.errors import ExchangeError, NotFoundError, ReadOnlyError, StorageError
from tierfeed.format.chunkref import checksum_bytes
from tierfeed.format.index import Index
from tierfeed.storage import DirectoryChunks
from tierfeed.storage.driver import Driver

__all__ = ["NamespaceDriver", "inbox_dir", "member_locator", "parts_dir", "punched_dir"]

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


class NamespaceDriver(Driver):
    """Chunk bytes for one rank, by chunk name: from its node's staged chunks or its inbox.

    Args:
        index: the store's index (the node-local copy).
        local: per chunk, whether this rank may read it from the node's local directory.
        inbox: the rank's inbox directory.
        parts: the rank's parts directory (its members of split chunks), if any.
        punched: where the rank's exchanger marks the staged chunks it punched samples out
            of (with ``verify_local``), if anywhere.
        timeout_s: how long a read waits for a member a peer has not sent yet.
        verify_local: staged chunks may have holes (partition plans punch out the samples a
            rank sends away, and a sample can come back to a chunk it had left): serve ranges
            of a staged chunk only until the exchanger marks it punched (a tier checks its
            copy whole before placing it; a whole-chunk read is checked here), and check
            members read from it by theirs.
    """

    name = "namespace"

    def __init__(
        self,
        index: Index,
        local: npt.NDArray[np.bool_],
        inbox: str | os.PathLike[str],
        timeout_s: float = 120.0,
        verify_local: bool = False,
        parts: str | os.PathLike[str] | None = None,
        punched: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(read_only=True)
        self.index = index
        self.local = np.asarray(local, dtype=bool)
        self.timeout_s = timeout_s
        self.verify_local = verify_local
        infos = index.chunks()
        self.chunks = DirectoryChunks(index.path.parent, infos, index.path)
        self.view = InboxView(inbox)
        self.parts = InboxView(parts) if parts is not None else None
        self.punched = Path(punched) if punched is not None else None
        self._ids = {c.name: c.id for c in infos}
        self._sizes = [c.size for c in infos]
        self._key = member_locator(index)
        self._offset = np.asarray(index.member_offset, dtype=np.int64)
        self._length = np.asarray(index.member_length, dtype=np.int64)
        self._checksum = index.member_checksum
        self._checksums = [c.checksum for c in infos]
        self._punched: set[int] = set()  # staged chunks seen with holes (they stay so)
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"NamespaceDriver({self.index.path.parent}, inbox {self.view.root})"

    # --- what this node holds ---------------------------------------------------------------

    def _chunk(self, path: str) -> int:
        chunk = self._ids.get(path)
        if chunk is None:
            raise NotFoundError(f"{self!r}: no chunk {path!r} in the index")
        return chunk

    def holds_whole(self, path: str) -> bool:
        """Whether chunk ``path`` lies whole on this node: tiers copy only such chunks."""
        chunk = self._ids.get(path)
        return chunk is not None and self._whole(chunk)

    def _whole(self, chunk: int) -> bool:
        """Whether chunk ``chunk`` lies whole on this node (any range of it can be served):
        staged here, and where samples may have been punched out, not marked punched."""
        if not self.local[chunk]:
            return False
        with self._mutex:
            if chunk in self._punched:
                return False
        return not self.verify_local or self._intact(chunk)

    def _intact(self, chunk: int) -> bool:
        """No sample punched out of the staged file: the rank's exchanger leaves a mark
        before it punches (`tierfeed.distributed.inbox.mark_punched`), and stage-in clears
        the marks of the chunks it verified whole again."""
        if self.punched is not None and is_punched(self.punched, chunk):
            with self._mutex:
                self._punched.add(chunk)  # samples were sent away: it stays in part
            return False
        return True

    def _member_holding(self, chunk: int, offset: int, length: int) -> int | None:
        """The member whose bytes contain the range, or None."""
        i = int(np.searchsorted(self._key, (chunk << 40) | offset, side="right")) - 1
        if i < 0 or int(self._key[i]) >> 40 != chunk:
            return None
        start = int(self._offset[i])
        return i if offset + length <= start + int(self._length[i]) else None

    # --- primitives -----------------------------------------------------------------------

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Bytes of chunk ``path``: any range of a chunk held whole; else a range inside one
        member (waiting for one a peer is sending). Raises NotFoundError for any other."""
        chunk = self._chunk(path)
        length = max(0, min(length, self._sizes[chunk] - offset))
        member = self._member_holding(chunk, offset, length)
        if member is None or (not self.verify_local and self.local[chunk]):
            data = self._read_whole(chunk, path, offset, length)
        else:
            start = offset - int(self._offset[member])
            data = self._read_member(member, chunk)[start : start + length]
        self.counters.add(reads=1, bytes_read=len(data))
        return data

    def _read_whole(self, chunk: int, path: str, offset: int, length: int) -> bytes:
        """A range of a chunk held whole. Where samples may have been punched out, a whole
        read is checked here (a punched range reads as zeros, never to be served), and a
        tier's piece is checked with the rest of its copy before the copy is placed."""
        if self._whole(chunk):
            if not self.verify_local or offset != 0 or length != self._sizes[chunk]:
                return self.chunks.read_range(chunk, offset, length)  # a piece: checked whole
            data = self.chunks.read_range(chunk, offset, length)
            if checksum_bytes(data) == self._checksums[chunk]:
                return data
            with self._mutex:
                self._punched.add(chunk)  # samples were sent away: it stays in part
        raise NotFoundError(
            f"{self!r}: bytes {offset}..{offset + length} of chunk {path} are not on this node "
            "whole: it holds only some of the chunk's samples, so it serves only ranges inside "
            "one sample member (a tier cannot copy this chunk; the origin copy is not read)"
        )

    def _read_member(self, member: int, chunk: int) -> bytes:
        """A member's bytes: from the inbox, the rank's part or the node's chunk (both
        checked), or (waiting) a peer."""
        length = int(self._length[member])
        with self._mutex:
            data = self.view.read(member, length)
            held = None
            if data is None and self.parts is not None:
                held = self.parts.read(member, length)
        if data is not None:
            return data
        if held is None and self.local[chunk]:
            held = self.chunks.read_range(chunk, int(self._offset[member]), length)
        if held is not None and checksum_bytes(held) == int(self._checksum[member]):
            return held
        # Not held here, or sent away earlier (its range punched out) and on its way back.
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

    def size(self, path: str) -> int:
        """Size of a chunk held whole. Raises NotFoundError for one held in part or not at all
        (a tier copies only chunks it can read whole)."""
        chunk = self._chunk(path)
        if not self._whole(chunk):
            raise NotFoundError(f"{self!r}: chunk {path} is not held whole on this node")
        return self._sizes[chunk]

    def list(self, prefix: str = "") -> list[str]:
        """Names of the chunks held whole on this node under ``prefix``, sorted."""
        return sorted(
            name
            for name, chunk in self._ids.items()
            if name.startswith(prefix) and self._whole(chunk)
        )

    def _write(self, path: str, data: bytes) -> None:
        raise ReadOnlyError(f"{self!r}: read-only; refusing to write {path}")

    def _delete(self, path: str) -> None:
        raise ReadOnlyError(f"{self!r}: read-only; refusing to delete {path}")

    # --- optional abilities ---------------------------------------------------------------

    def open_ahead(self, paths: Sequence[str], blocks: bool = False) -> None:
        """Open the staged files of these chunks in the background (others are not files)."""
        chunks = [self._ids[p] for p in paths if p in self._ids]
        self.chunks.open_ahead([c for c in chunks if self.local[c]])

    def begin_epoch(self) -> None:
        """A new epoch: load the samples peers moved here for it."""
        self.refresh()

    def refresh(self) -> None:
        """Load what arrived in the inbox since the last look."""
        with self._mutex:
            self.view.refresh()

    def close(self) -> None:
        """Close chunk and segment files; idempotent."""
        self.chunks.close()
        with self._mutex:
            self.view.close()
            if self.parts is not None:
                self.parts.close()
