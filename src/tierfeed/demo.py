"""`make demo`: generate an ImageFolder dataset, pack it, inspect and verify it, read it back."""

from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

from tierfeed.format.chunkfiles import DirectoryChunks
from tierfeed.format.commands import human
from tierfeed.format.pack import PackOptions, pack
from tierfeed.format.store import open_store
from tierfeed.format.verify import verify_store
from tierfeed.synth import SynthSpec, make_imagefolder

__all__ = ["main"]


def main(workdir: str = "demo-data") -> int:
    """Run the demo in ``workdir``; returns the exit code."""
    root = Path(workdir)
    src, store_dir = root / "imagefolder", root / "store"
    spec = SynthSpec(classes=20, per_class=100, jpeg=True, seed=1)
    if not src.exists():
        print(f"generating {spec.classes * spec.per_class} JPEGs with ImageNet-like sizes in {src}")
        make_imagefolder(src, spec, progress=True)
    shutil.rmtree(store_dir, ignore_errors=True)
    report = pack(src, store_dir, PackOptions(chunk_size=16 * 2**20))
    print(
        f"packed {report.samples} samples into {report.chunks} chunks "
        f"({human(report.chunk_bytes)}) in {report.seconds:.2f} s"
    )
    from tierfeed.cli import main as cli

    cli(["inspect", str(store_dir)])
    problems = verify_store(store_dir, progress=False)
    print("verify:", problems or "ok")
    started = time.perf_counter()
    mismatches = 0
    with open_store(store_dir) as store:
        for i in range(len(store)):
            sample = store.read_sample(i)
            original = (src / (sample.key + ".jpg")).read_bytes()
            mismatches += (
                hashlib.md5(original).digest() != hashlib.md5(sample.fields["jpg"]).digest()
            )
        elapsed = time.perf_counter() - started
        opens = store.source.opens if isinstance(store.source, DirectoryChunks) else "?"
        print(
            f"read back {len(store)} samples in {elapsed:.2f} s "
            f"({len(store) / elapsed:,.0f} samples/s, {opens} chunk opens for "
            f"{len(store)} files); byte-identical: {mismatches == 0}"
        )
    return 0 if not problems and mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
