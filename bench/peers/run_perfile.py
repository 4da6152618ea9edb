"""The per-file loader in the side-by-side benchmark: a map-style Dataset that opens and reads
each JPEG of the ImageFolder tree, shuffled by torch's DataLoader (what most scripts do).

Usage:
    python bench/peers/run_perfile.py read --data RAW_ON_SLOWFS ... (see bench/peers/common.py)

It has no cache of its own (``--cache`` stays empty); only the kernel's page cache, which the
slowed file system drops at every open.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from bench.peers.common import measure, parse_read, raw_samples


class PerFile(TorchDataset[tuple[int, int]]):
    """One open and one read per sample."""

    def __init__(self, root: Path) -> None:
        self.items = [(str(path), label) for path, label, _ in raw_samples(root)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, int]:
        path, label = self.items[i]
        with open(path, "rb") as fh:
            return len(fh.read()), label


def main() -> None:
    if sys.argv[1] != "read":
        raise SystemExit("run_perfile.py has only `read` (it reads the raw tree itself)")
    args = parse_read("per-file", sys.argv[2:])
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(PerFile(Path(args.data)), batch_size=args.batch, shuffle=True,
                        num_workers=args.workers, generator=generator)  # fmt: skip
    measure("per-file", args, lambda epoch: loader)


if __name__ == "__main__":
    main()
