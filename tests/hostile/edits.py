"""Damage done on purpose by the hostile tests: one byte changed in place."""

from __future__ import annotations

import os
from pathlib import Path


def flip(path: Path, offset: int, keep_mtime: bool = False) -> None:
    """Invert one byte of ``path`` in place (same inode, same size), optionally restoring its
    times too, so that nothing but the bytes tells the change (a cache's marks do not)."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
