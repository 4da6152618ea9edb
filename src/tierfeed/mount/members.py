"""`VerifiedMembers`: the mount's small LRU of members that passed their checksum, read once."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from tierfeed.errors import ChunkCorruptError, StorageError

__all__ = ["RepeatedFailureError", "VerifiedMembers"]

# A member whose read of the origin failed (its retries' bound spent) answers EIO at once for
# this long, unlogged: the kernel asks again at once after a failed read (and splits one read
# into several requests); none of those may wait out another timeout of the origin, nor log the
# same failure again.
_FAILED_HOLD_S = 1.0


class RepeatedFailureError(StorageError):
    """A member's read that failed moments ago (or in the flight this request waited on),
    answered again without another read of the origin."""


class _Flight:
    """One member being read and checked; later requests for it wait on this one."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data = b""
        self.error: BaseException | None = None


class VerifiedMembers:
    """Members that passed their checksum, most recently used last, at most ``budget`` bytes.

    ``get`` reads a missing member once however many threads ask for it at the same time
    (single flight): FUSE splits one file read into many requests served by several threads.
    A member larger than the whole budget is kept alone (everything else is dropped for it):
    it had to be held whole to be checked anyway, and the requests that follow for the rest of
    the file are then served from it instead of reading and checking it again each time.

    Args:
        load: reads and checks one member (``Store.read_member``).
        budget: bytes of member data kept at most.
    """

    def __init__(self, load: Callable[[int], bytes], budget: int) -> None:
        self._load = load
        self.budget = budget
        self._kept: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0
        self._flights: dict[int, _Flight] = {}
        self._failed: dict[int, tuple[float, BaseException]] = {}  # member -> (when, error)
        self._mutex = threading.Lock()
        self.loads = 0  # members read from the store (each one checked)

    def get(self, member: int) -> bytes:
        """The checked bytes of ``member``; raises what ``load`` raised for it, or
        `RepeatedFailureError` where this request waited on a flight that failed, or came less than
        a second after the origin failed it (a checksum failure is read again: the bad copy is
        dropped by then)."""
        with self._mutex:
            kept = self._kept.get(member)
            if kept is not None:
                self._kept.move_to_end(member)
                return kept
            failed = self._failed.get(member)
            if failed is not None and time.monotonic() - failed[0] < _FAILED_HOLD_S:
                raise RepeatedFailureError(str(failed[1]))
            self._failed.pop(member, None)
            flight = self._flights.get(member)
            leader = flight is None
            if flight is None:
                flight = self._flights[member] = _Flight()
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise RepeatedFailureError(str(flight.error))
            return flight.data
        try:
            flight.data = self._load(member)
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._mutex:
                del self._flights[member]
                self.loads += 1
                if flight.error is None:
                    self._keep(member, flight.data)
                elif not isinstance(flight.error, ChunkCorruptError):  # the origin failed
                    self._failed[member] = (time.monotonic(), flight.error)
            flight.done.set()
        return flight.data

    def keep(self, member: int, data: bytes) -> None:
        """Keep checked bytes of ``member`` that arrived after its request gave up."""
        with self._mutex:
            if member not in self._kept:
                self._keep(member, data)

    def _keep(self, member: int, data: bytes) -> None:
        # Under the mutex. A member over the whole budget is kept alone (see the class doc).
        self._kept[member] = data
        self._bytes += len(data)
        while self._bytes > self.budget and len(self._kept) > 1:
            _, dropped = self._kept.popitem(last=False)
            self._bytes -= len(dropped)

    @property
    def held_bytes(self) -> int:
        """Bytes of member data kept now."""
        return self._bytes
