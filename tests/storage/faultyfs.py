"""A read-only FUSE pass-through that fails reads on purpose, for the POSIX driver's retry tests:
``python -m tests.storage.faultyfs SRC MNT --fault KIND:NAME:TIMES ...``.

KIND is an errno name (EAGAIN, ETIMEDOUT, ESTALE, EIO: the read answers that error), ``half``
(the read answers half the bytes asked for), ``empty`` (it answers none, before the end of the
file), ``hang`` (the read is never answered: it hangs until the mount goes away) or ``stall``
(an open of the file hangs so: a server that never answers); NAME is a substring of the path;
TIMES how many matching reads (or opens) it applies to. Files are opened direct_io, so a short
answer reaches the reader as a short read.
"""

from __future__ import annotations

import argparse
import errno
import os
import threading
from typing import Any

import mfusepy


class FaultyFS(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, root: str, faults: list[list[Any]]) -> None:
        self.root = root
        self.faults = faults  # [kind, name, times left]
        self.lock = threading.Lock()

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise mfusepy.FuseOSError(exc.errno) from None
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")
        attrs: dict[str, Any] = {key: getattr(st, key) for key in keys}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def open(self, path: str, fi: Any) -> int:
        if self._take(path, opens=True):
            threading.Event().wait()  # never answered: unmounting ends the request (ENOTCONN)
        fi.fh = os.open(self._real(path), os.O_RDONLY)
        fi.direct_io = 1
        return 0

    def release(self, path: str, fi: Any) -> int:
        os.close(fi.fh)
        return 0

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        kind = self._take(path)
        if kind == "hang":
            threading.Event().wait()  # never answered: unmounting ends the request
        if kind in ("half", "empty"):
            return os.pread(fi.fh, size // 2 if kind == "half" else 0, offset)
        if kind:
            raise mfusepy.FuseOSError(getattr(errno, kind))
        return os.pread(fi.fh, size, offset)

    def _take(self, path: str, opens: bool = False) -> str:
        with self.lock:
            for fault in self.faults:
                if fault[2] > 0 and fault[1] in path and (fault[0] == "stall") == opens:
                    fault[2] -= 1
                    return str(fault[0])
        return ""


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.storage.faultyfs")
    p.add_argument("src")
    p.add_argument("mnt")
    p.add_argument("--fault", action="append", default=[], metavar="KIND:NAME:TIMES")
    a = p.parse_args()
    faults = [[kind, name, int(times)] for kind, name, times in (f.split(":") for f in a.fault)]
    mfusepy.FUSE(FaultyFS(a.src, faults), a.mnt, foreground=True, ro=True, raw_fi=True)


if __name__ == "__main__":
    main()
