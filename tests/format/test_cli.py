"""The format's CLI: exit codes and messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.format.conftest import write_tree
from tierfeed.cli import main
from tierfeed.units import parse_size

FILES = {b"cat/a.jpg": b"a" * 5000, b"dog/b.jpg": b"b" * 7000}


def test_pack_inspect_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_tree(tmp_path / "src", FILES)
    store = str(tmp_path / "store")
    assert main(["pack", str(tmp_path / "src"), store, "--chunk-size", "8KiB", "-q"]) == 0
    assert "packed 2 samples" in capsys.readouterr().out
    assert main(["inspect", store]) == 0
    out = capsys.readouterr().out
    assert "samples   2" in out and "classes   2 (cat, dog)" in out
    assert main(["verify", store, "-q"]) == 0
    chunk = tmp_path / "store" / "chunks" / "000001.tar"
    chunk.write_bytes(chunk.read_bytes()[:-512])
    assert main(["verify", store, "-q"]) == 1
    assert "BAD: chunk" in capsys.readouterr().out


def test_errors_name_the_file_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "tierfeed inspect: error:" in err and str(tmp_path) in err


def test_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tierfeed", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("pack", "index", "inspect", "verify"):
        assert command in done.stdout


@pytest.mark.parametrize(
    ("text", "value"), [("64MiB", 64 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096)]
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_parse_size_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="cannot read size"):
        parse_size("lots")


_PACK_MODULES = """
import sys
from tierfeed.cli import main
status = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules
               if m.split(".")[0] in ("torch", "tqdm") or m.startswith("tierfeed.loader"))
print(status, heavy)
"""


def test_pack_of_a_directory_loads_only_what_packing_needs(tmp_path: Path) -> None:
    """`tierfeed pack SRC DST -q` imports no torch, no `tierfeed.loader` (the loader's
    composition, for packing to a URL only) and no progress bar; it still packs."""
    write_tree(tmp_path / "src", FILES)
    args = ["pack", str(tmp_path / "src"), str(tmp_path / "store"), "-q"]
    done = subprocess.run(
        [sys.executable, "-c", _PACK_MODULES, *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "0 []"
    assert (tmp_path / "store" / "index.tfi").exists()
