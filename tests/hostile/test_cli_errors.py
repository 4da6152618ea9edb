"""The CLI's one rule (docs/errors.md): a user error is one stderr line
`tierfeed <command>: error: ...` and exit 1 (2 for usage); a traceback only for a bug, followed
by a line asking to report it. Every case runs the real CLI in a child process.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.format.conftest import write_tree
from tests.hostile.conftest import NOBODY
from tierfeed.publish import is_temporary

FILES = {b"cat/a.jpg": b"a" * 5000, b"dog/b.jpg": b"b" * 7000, b"dog/c.jpg": b"c" * 300}
ROOT = Path(__file__).parents[2]


def _limit_memory() -> None:  # in the child: an unbounded read ends in MemoryError, not OOM
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


def tierfeed(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m tierfeed ARGS` with a memory limit; fails the test if it hangs."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "tierfeed", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_limit_memory,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`tierfeed {' '.join(map(str, args))}` hung for {timeout} s")


def script(code: str, *args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a tiny wrapper script around the CLI (to plant a bug or drop privileges)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def assert_user_error(
    done: subprocess.CompletedProcess[str], command: str, *names: object, status: int = 1
) -> str:
    """Exactly one stderr line `tierfeed <command>: error: ...` naming ``names``; exit 1."""
    lines = done.stderr.splitlines()
    assert done.returncode == status, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"tierfeed {command}: error: "), done.stderr
    for name in names:
        assert str(name) in lines[0], done.stderr
    return lines[0]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    write_tree(tmp_path / "src", FILES)
    return tmp_path / "src"


@pytest.fixture
def store(tmp_path: Path, src: Path) -> Path:
    done = tierfeed("pack", src, tmp_path / "store", "-q", "--chunk-size", "8KiB")
    assert done.returncode == 0, done.stderr
    return tmp_path / "store"


def _tree_listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --- pack ---------------------------------------------------------------------------------


@pytest.mark.parametrize("inside", ["", "store", "cat/store"])
def test_pack_into_its_own_source(src: Path, inside: str) -> None:
    before = _tree_listing(src)
    dst = src / inside if inside else src
    line = assert_user_error(tierfeed("pack", src, dst, "-q"), "pack", src)
    assert "sibling" in line
    assert _tree_listing(src) == before


def test_pack_dst_is_a_regular_file(tmp_path: Path, src: Path) -> None:
    (tmp_path / "dst").write_bytes(b"keep")
    assert_user_error(tierfeed("pack", src, tmp_path / "dst", "-q"), "pack", tmp_path / "dst")


def test_pack_dst_under_a_regular_file(tmp_path: Path, src: Path) -> None:
    (tmp_path / "f").write_bytes(b"keep")
    done = tierfeed("pack", src, tmp_path / "f" / "store", "-q")
    assert_user_error(done, "pack", tmp_path / "f")


def test_pack_missing_source(tmp_path: Path) -> None:
    done = tierfeed("pack", tmp_path / "nope", tmp_path / "store", "-q")
    assert_user_error(done, "pack", tmp_path / "nope")


def test_pack_dst_read_only(src: Path, tmpfs: Callable[..., Path]) -> None:
    ro = tmpfs("ro", "ro,size=1m")
    line = assert_user_error(tierfeed("pack", src, ro / "store", "-q"), "pack", ro)
    assert "Read-only file system" in line


@pytest.mark.timeout(120)
def test_pack_disk_full(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    write_tree(tmp_path / "big", {f"c/{i}.bin".encode(): os.urandom(50_000) for i in range(30)})
    full = tmpfs("full", "size=512k")
    done = tierfeed("pack", tmp_path / "big", full / "store", "-q", "--chunk-size", "64KiB")
    line = assert_user_error(done, "pack", full / "store")
    assert "No space left on device" in line
    assert not [p for p in full.rglob("*") if is_temporary(p.name)]


def test_pack_file_list_naming_a_missing_file(tmp_path: Path, src: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text("cat/a.jpg\ncat/nope.jpg\n")
    done = tierfeed("pack", src, tmp_path / "store", "-q", "--files", listing)
    assert_user_error(done, "pack", "cat/nope.jpg", "--skip-unreadable")


def test_pack_file_list_missing(tmp_path: Path, src: Path) -> None:
    done = tierfeed("pack", src, tmp_path / "store", "-q", "--files", tmp_path / "no.txt")
    assert_user_error(done, "pack", tmp_path / "no.txt")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("odd", ["dev-zero", "fifo", "fifo-link"])
def test_pack_non_regular_file(tmp_path: Path, src: Path, odd: str) -> None:
    path = src / "cat" / "odd.jpg"
    if odd == "dev-zero":
        path.symlink_to("/dev/zero")
    elif odd == "fifo":
        os.mkfifo(path)
    else:
        os.mkfifo(tmp_path / "pipe")
        path.symlink_to(tmp_path / "pipe")
    assert_user_error(tierfeed("pack", src, tmp_path / "s1", "-q"), "pack", "cat/odd.jpg")
    done = tierfeed("pack", src, tmp_path / "s2", "-q", "--skip-unreadable")
    assert done.returncode == 0, done.stderr
    assert "skipped 1:" in done.stderr and "cat/odd.jpg" in done.stderr
    assert "Traceback" not in done.stderr


AS_NOBODY = """
import os, sys
from tierfeed import cli
cli.build_parser()  # import every command module while the interpreter's files are readable
import tierfeed.format.pack
os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.timeout(120)
def test_pack_unlistable_directory(nobody_dir: Path) -> None:
    src = nobody_dir / "src"
    write_tree(src, {**FILES, b"locked/x.jpg": b"x"})
    for path in (src, *src.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (src / "locked").chmod(0)
    done = script(AS_NOBODY, NOBODY, "pack", src, nobody_dir / "s1", "-q")
    assert_user_error(done, "pack", src / "locked")
    done = script(AS_NOBODY, NOBODY, "pack", src, nobody_dir / "s2", "-q", "--skip-unreadable")
    assert done.returncode == 0, done.stderr
    assert "skipped 1:" in done.stderr and "locked" in done.stderr


def test_pack_bad_option_values_are_usage_errors(tmp_path: Path, src: Path) -> None:
    done = tierfeed("pack", src, tmp_path / "s", "--chunk-size", "lots")
    assert_user_error(done, "pack", "lots", status=2)
    done = tierfeed("pack", src, tmp_path / "s", "--workers", "many")
    assert_user_error(done, "pack", "many", status=2)
    done = tierfeed("pack", src, tmp_path / "s", "--workers", "0")
    assert "argument --workers: takes 1 or more" in assert_user_error(done, "pack", status=2)


def test_pack_of_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "photo.jpg").write_bytes(b"x")
    line = assert_user_error(tierfeed("pack", tmp_path / "photo.jpg", tmp_path / "s"), "pack")
    assert "a file, not a directory" in line and "not a regular file" not in line


# --- usage --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "command"),
    [
        ([], ""),
        (["bogus"], ""),
        (["pack"], " pack"),
        # Arguments a command does not know are its error, in its own form (issue 33).
        (["inspect", "a", "b"], " inspect"),
        (["verify", "s", "--bogus"], " verify"),
        (["stage", "s", "--local", "l", "-x"], " stage"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], command: str) -> None:
    done = tierfeed(*args)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"tierfeed{command}: error: "), done.stderr
    assert "--help" in lines[0]


@pytest.mark.parametrize("command", ["pack", "index", "verify", "stage", "slowfs"])
def test_every_long_command_takes_q(command: str) -> None:
    done = tierfeed(command, "--help")
    assert done.returncode == 0, done.stderr
    assert "-q, --quiet" in done.stdout


def test_index_refuses_to_overwrite_an_index_without_overwrite(tmp_path: Path) -> None:
    # As pack does: a second `tierfeed index` into a store that has an index is refused.
    import tarfile

    out = tmp_path / "shards"
    out.mkdir()
    with tarfile.open(out / "000000.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in FILES.items():
            info = tarfile.TarInfo(name.decode())
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    first = tierfeed("index", out / "000000.tar", "--out", out, "-q")
    assert first.returncode == 0, first.stderr
    before = (out / "index.tfi").read_bytes()
    line = assert_user_error(
        tierfeed("index", out / "000000.tar", "--out", out, "-q"), "index", out
    )
    assert "--overwrite" in line
    assert (out / "index.tfi").read_bytes() == before
    again = tierfeed("index", out / "000000.tar", "--out", out, "-q", "--overwrite")
    assert again.returncode == 0, again.stderr


# --- inspect and friends ------------------------------------------------------------------


def test_inspect_missing_store(tmp_path: Path) -> None:
    line = assert_user_error(tierfeed("inspect", tmp_path / "nope"), "inspect", tmp_path / "nope")
    assert "no such file or directory" in line  # not "no index here": nothing is there
    line = assert_user_error(tierfeed("inspect", tmp_path), "inspect", tmp_path)
    assert "no index here" in line  # a directory, without a store's index


def test_inspect_into_a_closed_pipe_is_quiet(store: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "tierfeed", "inspect", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before the first line is written
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141, err
    assert err == ""


def test_inspect_piped_into_head(store: Path) -> None:
    done = subprocess.run(
        f"'{sys.executable}' -m tierfeed inspect '{store}' | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.stdout.startswith("store")
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr
    assert done.stderr == ""


def test_report_of_a_missing_run_file(tmp_path: Path) -> None:
    done = tierfeed("report", tmp_path / "run.jsonl", "-o", tmp_path / "r.png")
    assert_user_error(done, "report", tmp_path / "run.jsonl")


def test_report_of_a_directory(tmp_path: Path) -> None:
    done = tierfeed("report", tmp_path, "-o", tmp_path / "r.png")
    assert_user_error(done, "report", tmp_path)


def test_report_of_a_run_that_recorded_no_epoch(tmp_path: Path) -> None:
    run = tmp_path / "run.jsonl"  # a run that failed in its first epoch: its header alone
    run.write_text('{"type": "run", "time": 1795697352.5, "system": "tierfeed"}\n')
    done = tierfeed("report", run, "-o", tmp_path / "r.png")
    assert_user_error(done, "report", run)
    assert "no epoch recorded" in done.stderr
    assert not (tmp_path / "r.png").exists()  # no empty figure


def test_simulate_bad_values(tmp_path: Path) -> None:
    done = tierfeed("simulate", "--samples", "10", "--ranks", "2", "--policy", "nonsense")
    assert_user_error(done, "simulate", "nonsense")
    done = tierfeed("simulate", "--samples", "10", "--ranks", "2", "--chunk-size", "huge")
    assert_user_error(done, "simulate", "huge", status=2)


# --- bugs and interrupts ------------------------------------------------------------------

PLANTED = """
import sys
from tierfeed import cli
from tierfeed.loader import commands
def planted(args):
    raise {exc}("planted for the test")
commands._run_inspect = planted
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_bug_prints_the_traceback_and_asks_for_a_report(tmp_path: Path) -> None:
    done = script(PLANTED.format(exc="RuntimeError"), "inspect", tmp_path)
    assert done.returncode == 70, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "RuntimeError: planted for the test" in done.stderr
    assert lines[-1].startswith("tierfeed inspect: internal error (a bug in tierfeed)")
    assert "report" in lines[-1] and f"tierfeed inspect {tmp_path}" in lines[-1]


def test_an_interrupt_exits_130_in_one_line(tmp_path: Path) -> None:
    done = script(PLANTED.format(exc="KeyboardInterrupt"), "inspect", tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["tierfeed inspect: interrupted"]
