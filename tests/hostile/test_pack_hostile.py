"""`pack` against a hostile source or destination: it checks before it writes, never writes
inside its source, packs only regular files, and ends every failure in a tierfeed error that
names the file - under a time bound, with bounded memory, leaving nothing half-written.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.format.conftest import QUIET, write_tree
from tests.hostile.conftest import NOBODY
from tierfeed import open_store, verify_store
from tierfeed.errors import PackError, TierfeedError, UnreadableFileError
from tierfeed.format.layout import INDEX_NAME
from tierfeed.format.pack import PackOptions, pack
from tierfeed.publish import is_temporary

FILES = {b"a/x.jpg": b"x" * 3000, b"a/y.jpg": b"y" * 2000, b"b/z.jpg": b"z" * 1000}
SKIP = PackOptions(chunk_size=64 * 1024, workers=2, skip_unreadable=True, progress=False)

# A child process packs, so that a pack that hangs (a FIFO) or allocates without bound
# (/dev/zero) is killed by the timeout or stopped by the address-space limit instead of
# taking the test run (or the machine) with it. It prints one JSON line with the outcome.
CHILD = """
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
args = json.loads(sys.argv[1])
from tierfeed.errors import TierfeedError
from tierfeed.format import pack as p
if args.get("user"):  # after the imports: the interpreter's files may be root's alone
    os.setgid(args["user"]); os.setuid(args["user"])
if args.get("swap_to_fifo"):  # replace a listed regular file by a FIFO before it is read
    real_plan = p.plan_pack
    def plan_then_swap(*a, **k):
        plan = real_plan(*a, **k)
        target = os.path.join(args["src"], args["swap_to_fifo"])
        os.unlink(target)
        os.mkfifo(target)
        return plan
    p.plan_pack = plan_then_swap
options = p.PackOptions(
    chunk_size=65536, workers=2, progress=False, skip_unreadable=args.get("skip", False)
)
try:
    r = p.pack(args["src"], args["dst"], options, files=args.get("files"))
    out = {"ok": True, "samples": r.samples, "skipped": r.skipped}
except TierfeedError as exc:
    out = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
except MemoryError:
    out = {"ok": False, "type": "MemoryError", "message": "unbounded allocation"}
print(json.dumps(out))
"""


def pack_in_child(src: Path, dst: Path, timeout: float = 60, **args: Any) -> dict[str, Any]:
    """Pack in a child with a memory limit and a timeout; its outcome as a dict."""
    spec = json.dumps({"src": str(src), "dst": str(dst), **args})
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, spec],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=Path(__file__).parents[2],
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"pack hung for {timeout} s (a read blocked)")
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` (not following symlinks): relative path -> (mode, size)."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            out[os.path.relpath(full, root)] = (st.st_mode, st.st_size)
    return out


# --- never write inside the source ---------------------------------------------------------


@pytest.mark.parametrize(
    "dst_of",
    [
        pytest.param(lambda src: src, id="dst-is-src"),
        pytest.param(lambda src: src / "store", id="dst-inside-src"),
        pytest.param(lambda src: src / "a" / "deeper" / "store", id="dst-deep-inside-src"),
        pytest.param(lambda src: src / "a", id="dst-is-a-source-dir"),
    ],
)
def test_destination_in_the_source_is_refused_and_nothing_is_written(
    tmp_path: Path, dst_of: Callable[[Path], Path]
) -> None:
    src = tmp_path / "src"
    write_tree(src, FILES)
    before = listing(src)
    for _ in range(2):  # the second attempt must not pack what the first left behind
        with pytest.raises(PackError, match=r"inside the source.*sibling") as info:
            pack(src, dst_of(src), QUIET)
        assert str(src) in str(info.value)
        assert listing(src) == before


def test_destination_reaching_the_source_through_a_symlink_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, FILES)
    (tmp_path / "alias").symlink_to(src)
    before = listing(src)
    with pytest.raises(PackError, match="inside the source"):
        pack(src, tmp_path / "alias" / "store", QUIET)
    assert listing(src) == before


def test_a_bad_source_writes_no_destination(tmp_path: Path) -> None:
    """Everything is checked before anything is written: a failed pack leaves no DST."""
    src = tmp_path / "src"
    write_tree(src, FILES)
    (src / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnreadableFileError, match=r"gone\.jpg"):
        pack(src, tmp_path / "store", QUIET)
    assert not (tmp_path / "store").exists()
    with pytest.raises(PackError, match=r"missing.*No such file.*source directory"):
        pack(tmp_path / "missing", tmp_path / "store2", QUIET)
    assert not (tmp_path / "store2").exists()


# --- only regular files ------------------------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays


def _device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # a second /dev/zero
    except PermissionError:
        pytest.skip("cannot create a device node here (needs CAP_MKNOD)")


def _link_to(target: Callable[[Path], None] | str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        if isinstance(target, str):
            path.symlink_to(target)
        else:
            real = path.parents[2] / f"target-of-{path.name}"  # outside the source
            target(real)
            path.symlink_to(real)

    return make


ODD = [
    pytest.param(_link_to("/dev/zero"), "character device", id="symlink-to-dev-zero"),
    pytest.param(_link_to(_fifo), "FIFO", id="symlink-to-fifo"),
    pytest.param(_fifo, "FIFO", id="fifo"),
    pytest.param(_socket, "socket", id="socket"),
    pytest.param(_device, "character device", id="device"),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("make", "kind"), ODD)
def test_a_non_regular_file_is_an_error_naming_it(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    src = tmp_path / "src"
    write_tree(src, FILES)
    make(src / "a" / "odd.jpg")
    out = pack_in_child(src, tmp_path / "store")
    assert not out["ok"], out
    assert out["type"] == "UnreadableFileError", out
    assert "a/odd.jpg" in out["message"] and "not a regular file" in out["message"], out
    assert kind in out["message"] and "--skip-unreadable" in out["message"]
    assert not (tmp_path / "store" / INDEX_NAME).exists()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("make", "kind"), ODD)
def test_a_non_regular_file_is_skipped_and_counted_when_asked(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    src = tmp_path / "src"
    write_tree(src, FILES)
    make(src / "a" / "odd.jpg")
    out = pack_in_child(src, tmp_path / "store", skip=True)
    assert out["ok"], out
    assert out["samples"] == 3
    assert [p for p, _ in out["skipped"]] == ["a/odd.jpg"]
    assert kind in out["skipped"][0][1]
    with open_store(tmp_path / "store") as store:
        assert store.index.header["extra"]["skipped"] == 1
    assert verify_store(tmp_path / "store", progress=False) == []


@pytest.mark.timeout(180)
def test_a_file_turned_fifo_after_listing_does_not_hang(tmp_path: Path) -> None:
    """Opened without blocking and fstat'ed: a swap between listing and reading is caught."""
    src = tmp_path / "src"
    write_tree(src, FILES)
    out = pack_in_child(src, tmp_path / "store", swap_to_fifo="a/y.jpg", timeout=60)
    assert not out["ok"], out
    assert "a/y.jpg" in out["message"] and "not a regular file" in out["message"], out


@pytest.mark.parametrize(("grow", "word"), [(b"more" * 1000, "grew"), (None, "shrank")])
def test_a_file_changing_size_during_the_pack_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grow: bytes | None, word: str
) -> None:
    from tierfeed.format import pack as pack_module

    src = tmp_path / "src"
    write_tree(src, FILES)
    real_plan = pack_module.plan_pack

    def plan_then_change(*args: Any, **kwargs: Any) -> Any:
        plan = real_plan(*args, **kwargs)
        target = src / "a" / "x.jpg"
        if grow is None:
            target.write_bytes(b"x" * 10)
        else:
            with open(target, "ab") as fh:
                fh.write(grow)
        return plan

    monkeypatch.setattr(pack_module, "plan_pack", plan_then_change)
    with pytest.raises(UnreadableFileError, match=rf"a/x\.jpg.*{word}"):
        pack(src, tmp_path / "store", QUIET)
    assert not (tmp_path / "store" / INDEX_NAME).exists()


def test_read_never_asks_for_more_than_the_stat_size_plus_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierfeed.format import pack as pack_module

    src = tmp_path / "src"
    write_tree(src, FILES)
    asked: list[int] = []
    real_read = os.readv

    def spy(fd: int, buffers: Any) -> int:
        asked.append(sum(len(b) for b in buffers))
        return real_read(fd, buffers)

    monkeypatch.setattr(pack_module.os, "readv", spy)
    pack(src, tmp_path / "store", QUIET)
    assert asked and max(asked) <= 3001


# --- unlistable directories -------------------------------------------------------------


def _locked_tree(base: Path) -> Path:
    src = base / "src"
    write_tree(src, {**FILES, b"locked/w.jpg": b"w" * 100})
    for path in (src, *src.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (src / "locked").chmod(0)
    return src


@pytest.mark.timeout(180)
def test_an_unlistable_directory_is_named_or_skipped_when_asked(nobody_dir: Path) -> None:
    """Real permissions: the pack runs as user nobody, for whom mode 000 means no listing."""
    src = _locked_tree(nobody_dir)
    out = pack_in_child(src, nobody_dir / "s1", user=NOBODY)
    assert not out["ok"] and out["type"] == "UnreadableFileError", out
    assert "locked" in out["message"] and "cannot list directory" in out["message"]
    out = pack_in_child(src, nobody_dir / "s2", user=NOBODY, skip=True)
    assert out["ok"], out
    assert out["samples"] == 3
    assert [p for p, _ in out["skipped"]] == ["locked"]


def test_an_unlistable_directory_is_skipped_when_scandir_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same at the os.scandir boundary, for a run without root."""
    from tierfeed.format import source

    src = tmp_path / "src"
    write_tree(src, {**FILES, b"locked/w.jpg": b"w" * 100})
    real = os.scandir

    def scandir(path: Any) -> Any:
        if os.fsdecode(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(source.os, "scandir", scandir)
    with pytest.raises(UnreadableFileError, match=r"locked.*cannot list directory"):
        pack(src, tmp_path / "s1", QUIET)
    report = pack(src, tmp_path / "s2", SKIP)
    assert [p for p, _ in report.skipped] == ["locked"]
    assert report.samples == 3


# --- destination trouble ------------------------------------------------------------------


def test_destination_is_a_regular_file(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    (tmp_path / "dst").write_bytes(b"precious")
    with pytest.raises(PackError, match=r"dst.*not a directory"):
        pack(tmp_path / "src", tmp_path / "dst", QUIET)
    assert (tmp_path / "dst").read_bytes() == b"precious"


def test_destination_under_a_regular_file(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    (tmp_path / "file").write_bytes(b"precious")
    with pytest.raises(PackError, match=r"file.*not a directory"):
        pack(tmp_path / "src", tmp_path / "file" / "store", QUIET)
    assert (tmp_path / "file").read_bytes() == b"precious"


@pytest.mark.timeout(120)
def test_destination_not_writable_for_the_user(nobody_dir: Path) -> None:
    """Real permissions again: root's 0755 directory is not writable for user nobody."""
    src = _locked_tree(nobody_dir)
    (src / "locked").chmod(0o755)
    theirs = nobody_dir / "roots"
    theirs.mkdir(mode=0o755)
    out = pack_in_child(src, theirs / "store", user=NOBODY)
    assert not out["ok"] and out["type"] == "PackError", out
    assert "roots" in out["message"] and "Permission denied" in out["message"], out
    assert not (theirs / "store").exists()


def test_destination_on_a_read_only_file_system(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    write_tree(tmp_path / "src", FILES)
    ro = tmpfs("ro", "ro,size=1m")
    for dst in (ro, ro / "store"):
        with pytest.raises(PackError, match=r"ro.*[Rr]ead-only file system") as info:
            pack(tmp_path / "src", dst, QUIET)
        assert str(ro) in str(info.value)


def test_destination_existing_but_read_only(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    write_tree(tmp_path / "src", FILES)
    mnt = tmpfs("rw", "size=1m")
    (mnt / "store").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    with pytest.raises(PackError, match=r"store.*[Rr]ead-only file system"):
        pack(tmp_path / "src", mnt / "store", QUIET)


@pytest.mark.timeout(120)
def test_disk_full_names_the_chunk_and_leaves_no_partial(
    tmp_path: Path, tmpfs: Callable[..., Path]
) -> None:
    files = {f"c/f{i:03d}.bin".encode(): os.urandom(40_000) for i in range(40)}  # 1.6 MB
    write_tree(tmp_path / "src", files)
    full = tmpfs("full", "size=512k")
    with pytest.raises(PackError, match=r"chunks/\d{6}\.tar.*No space left.*free") as info:
        pack(tmp_path / "src", full / "store", QUIET)
    assert "Traceback" not in str(info.value)
    assert not [p for p in (full / "store").rglob("*") if is_temporary(p.name)]
    assert not (full / "store" / INDEX_NAME).exists()


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.writev may write less than asked: the writer loops until everything is written."""
    from tierfeed.format import tarchunk

    real = os.writev

    def short(fd: int, buffers: Any) -> int:
        first = bytes(memoryview(buffers[0])[:7]) if len(buffers[0]) else b""
        if first:
            return real(fd, [first])
        return real(fd, buffers[:2])

    monkeypatch.setattr(tarchunk.os, "writev", short)
    src = tmp_path / "src"
    write_tree(src, FILES)
    pack(src, tmp_path / "store", QUIET)
    assert verify_store(tmp_path / "store", progress=False) == []


# --- file lists --------------------------------------------------------------------------


def test_file_list_naming_a_missing_file(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", FILES)
    lst = tmp_path / "list.txt"
    lst.write_bytes(b"a/x.jpg\na/missing.jpg\n")
    with pytest.raises(UnreadableFileError, match=r"a/missing\.jpg.*--skip-unreadable"):
        pack(tmp_path / "src", tmp_path / "store", QUIET, files=lst)
    report = pack(tmp_path / "src", tmp_path / "store", SKIP, files=lst)
    assert [p for p, _ in report.skipped] == ["a/missing.jpg"]


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_file_list_that_cannot_be_read(tmp_path: Path, kind: str) -> None:
    write_tree(tmp_path / "src", FILES)
    lst = tmp_path / "list.txt"
    if kind == "directory":
        lst.mkdir()
    with pytest.raises(PackError, match=r"list\.txt.*--files") as info:
        pack(tmp_path / "src", tmp_path / "store", QUIET, files=lst)
    assert isinstance(info.value, TierfeedError)
    assert not (tmp_path / "store").exists()
