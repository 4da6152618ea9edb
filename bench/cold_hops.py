"""How far one cold read travels: the tierfeed files, classes and threads that one sample's
read crosses, through a disk tier over a POSIX origin, until its chunk's copy has landed.

Every call into tierfeed is recorded (`sys.setprofile`, `threading.setprofile`) from the read
to the end of the copy it starts (`TierStack.drain`). Run it on another version of the code
by putting its ``src`` first on the path:

    .venv/bin/python bench/cold_hops.py
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/cold_hops.py
    .venv/bin/python bench/cold_hops.py --piece-kb 64   # the chunk copied in ~7 pieces
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import tierfeed
from tierfeed.format.index import Index
from tierfeed.format.pack import PackOptions, pack
from tierfeed.loader.compose import open_store
from tierfeed.storage import PosixDriver, TierStack
from tierfeed.storage.tiers import TierOptions, disk_tier

SRC = str(Path(tierfeed.__file__).parent) + os.sep


class Trace:
    """The tierfeed files, classes and threads of every call seen, and how many calls."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.classes: set[str] = set()
        self.threads: set[str] = set()
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if event != "call" or not name.startswith(SRC):
            return
        owner = frame.f_locals.get("self")
        thread = threading.current_thread().name.rstrip("0123456789").rstrip("-_")
        with self._lock:
            self.calls += 1
            self.files.add(name[len(SRC) :])
            self.threads.add(thread)
            if owner is not None:
                self.classes.add(type(owner).__name__)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--piece-kb", type=int, default=0, help="pieces of this size (0: the default)")
    piece_kb = p.parse_args().piece_kb
    options = TierOptions(piece_bytes=piece_kb * 1024) if piece_kb else TierOptions()
    root = Path(tempfile.mkdtemp(prefix="tf-cold-hops-"))
    (root / "src" / "c").mkdir(parents=True)
    for i in range(64):
        (root / "src" / "c" / f"{i:03d}.bin").write_bytes(os.urandom(20_000))
    pack(root / "src", root / "store", PackOptions(chunk_size=400_000, progress=False))
    index = Index(root / "store")
    origin = PosixDriver(root / "store", read_only=True)
    tiers = TierStack(
        index.chunks(), origin, [disk_tier(root / "cache", 10**9)], "fill-top", options
    )
    trace = Trace()
    with tiers, open_store(root / "store", source=tiers) as store:
        threading.setprofile(trace)
        sys.setprofile(trace)
        try:
            store.read_sample(5)
            tiers.drain(30)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]  # (typeshed wants a function)
    print(json.dumps({
        "files": len(trace.files), "classes": len(trace.classes), "calls": trace.calls,
        "threads": sorted(trace.threads), "file_names": sorted(trace.files),
        "class_names": sorted(trace.classes),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
