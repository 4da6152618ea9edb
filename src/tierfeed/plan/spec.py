"""`PlanSpec`: what a sampling plan is (policy, fraction, window, seed), and its generations.

`PLANS` names this generation of the local and partial plans; a loader state records it, and a
state saved under a generation in which its policy was another plan is refused (its positions
name other samples).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tierfeed.errors import ConfigError

__all__ = ["PLANS", "POLICIES", "PlanSpec", "plans_match"]

POLICIES = ("global", "local", "partial")
# Generations of the local and partial plans: 1, partitions of whole chunks and rings drawn
# whole (states written before generations were recorded, before 2026-11-26); 2, partitions
# balanced to the sample and rings evaluated per rank; 3, partial exchanges in closed form
# (a sweep of the slots, steps along one cycle). The global plan is the same in all three.
PLANS = 3
_SINCE = {"global": 1, "local": 2, "partial": 3}  # the generation each policy last changed in


def plans_match(generation: int, policy: str) -> bool:
    """Whether a state saved under plans of ``generation`` reads the same ``policy`` plan."""
    return generation >= _SINCE.get(policy, PLANS)


@dataclass(frozen=True)
class PlanSpec:
    """A sampling policy: ``global``, ``local`` or ``partial`` with fraction ``q``, or
    ``sequential`` (global without a shuffle: the store's order, dealt to the ranks as
    DistributedSampler(shuffle=False) deals it, for evaluation).

    Attributes:
        policy: global, local or partial.
        q: fraction of each partition exchanged per epoch (partial only).
        window: chunk-wise shuffle in windows of this many chunks; 0 shuffles samples fully.
        drop_last: cut every rank to the smallest count instead of padding by wrapping.
        seed: the seed of every random choice.
        shuffle: False reads the store's order (global only, no window): ``sequential``.
    """

    policy: str = "global"
    q: float = 0.0
    window: int = 0
    drop_last: bool = False
    seed: int = 0
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown plan policy {self.policy!r}; use one of {POLICIES}")
        if not 0.0 <= self.q <= 1.0:
            raise ConfigError(f"partial fraction q must lie in [0, 1], got {self.q}")
        if self.window < 0:
            raise ConfigError(f"chunkwise window must be >= 0, got {self.window}")
        if not self.shuffle and (self.policy != "global" or self.window):
            raise ConfigError(
                f"a sequential plan reads the store's order: it cannot be {self.policy} or "
                "chunk-wise; write 'sequential' alone"
            )

    @classmethod
    def parse(cls, text: str, seed: int = 0, drop_last: bool = False) -> PlanSpec:
        """Read ``global``, ``local``, ``partial:0.3``, ``chunkwise:8`` (global + window),
        ``sequential`` or combinations such as ``partial:0.1,chunkwise:4``."""
        policy, q, window, shuffle = "global", 0.0, 0, True
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = re.fullmatch(r"(global|local|partial|chunkwise|sequential)(?::([0-9.]+))?", part)
            if m is None:
                raise ConfigError(
                    f"cannot read plan {text!r}: write global, local, partial:Q, chunkwise:K, "
                    "sequential, or a policy and a window joined by a comma"
                )
            name, arg = m.group(1), m.group(2)
            if name == "sequential":
                shuffle = False
            elif name == "chunkwise":
                window = int(arg or 8)
            else:
                policy = name
                q = float(arg) if name == "partial" and arg else q
        return cls(policy, q, window, drop_last, seed, shuffle)

    def __str__(self) -> str:
        if not self.shuffle:
            return "sequential"
        text = self.policy + (f":{self.q:g}" if self.policy == "partial" else "")
        return text + (f",chunkwise:{self.window}" if self.window else "")
