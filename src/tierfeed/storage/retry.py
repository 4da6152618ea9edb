"""One retry policy for every origin, whichever face reads it (loader, mount, stage-in, verify).

A driver says what a failure is (`Verdict`: transient, or the tierfeed error to raise now); the
policy tries a transient one again with backoff, counts each retry (``counters.retries``), and
turns the last failure into one error naming the object and the tries when its bound is spent:
``attempts`` tries, or ``deadline_s`` seconds over all of them, whichever comes first. Each try
is given the seconds left, so a driver that can bound a request bounds it by them: a stalled
origin costs at most ``deadline_s``, not tries x the client's own read timeout.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tierfeed.errors import ConfigError, StorageError, TierfeedError
from tierfeed.telemetry.counters import Counters

__all__ = ["DEFAULT_DEADLINE_S", "RetryPolicy", "Verdict"]

T = TypeVar("T")

# A read (with its retries) still missing after this long is an error: the loader's own hard
# timeout (`DeadlineOptions.hard_timeout_s`), so no face waits longer on the origin than it.
DEFAULT_DEADLINE_S = 300.0


@dataclass(frozen=True)
class Verdict:
    """What a failure is: ``transient`` (worth another try; its kind for messages, e.g.
    ``"SlowDown"``, ``"reset"``), else ``error``, raised at once (403, 404, a changed object)."""

    transient: str = ""
    error: TierfeedError | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a transient failure is tried again: exponential backoff with
    full jitter (AWS's advice), ``attempts`` tries in all, within ``deadline_s`` seconds.

    Args:
        attempts: tries in all, the first included.
        base_s: the first backoff's upper bound.
        cap_s: no backoff longer than this.
        deadline_s: the hard bound of one call, its tries and backoffs together.
    """

    attempts: int = 6
    base_s: float = 0.05
    cap_s: float = 4.0
    deadline_s: float = DEFAULT_DEADLINE_S

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.deadline_s <= 0:
            raise ConfigError(
                f"a retry policy needs at least 1 try and a deadline > 0 s, got "
                f"{self.attempts} tries and {self.deadline_s} s"
            )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before try ``attempt + 1`` (attempt counts from 0)."""
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))

    def call(
        self,
        what: Callable[[float], T],
        judge: Callable[[BaseException], Verdict],
        where: str,
        counters: Counters[int],
        advice: str,
        failed: BaseException | None = None,
    ) -> T:
        """``what(seconds_left)``, tried again while ``judge`` calls its failure transient and
        the bound allows; ``what`` keeps whatever it received for the next try to resume from.
        ``failed``: the failure of a first try made already (a driver's fast path).

        Raises:
            TierfeedError: the permanent error ``judge`` gave, or a StorageError naming
                ``where``, the tries, the time and the last failure, then ``advice``.
        """
        started = time.monotonic()
        attempt = 0
        while True:
            if failed is None:
                left = self.deadline_s - (time.monotonic() - started)
                try:
                    return what(max(left, 0.001))
                except TierfeedError:
                    raise
                except Exception as exc:  # library errors are translated at this boundary
                    failed = exc
            verdict = judge(failed)
            if verdict.error is not None:
                raise verdict.error from None
            attempt += 1
            took = time.monotonic() - started
            pause = self.backoff(attempt - 1)
            if attempt >= self.attempts or took + pause >= self.deadline_s:
                bound = "" if attempt >= self.attempts else f" (bound {self.deadline_s:g} s)"
                raise StorageError(
                    f"{where}: gave up after {attempt} tries in {took:.1f} s{bound} "
                    f"({verdict.transient}: {_said(failed)}); {advice}"
                ) from None
            counters.add(retries=1)
            time.sleep(pause)
            failed = None


def _said(exc: BaseException) -> str:
    """The failure in one line: its type and message (or its cause's where it says nothing)."""
    text = str(exc).strip() or (str(exc.__cause__) if exc.__cause__ else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
