"""The CLI starts at once: no torch for --help, inspect, verify or pack; --version; help text on
every option; one name (--plan) for a sampling plan, with --policy kept as a hidden alias."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from tierfeed import cli
from tierfeed.format.pack import PackOptions, pack

ROOT = Path(__file__).parents[1]
FILES = {"cat/a.jpg": b"a" * 5000, "dog/b.jpg": b"b" * 7000, "dog/c.jpg": b"c" * 300}


def run(*args: object, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    """`python [-X importtime] -m tierfeed ARGS` in a fresh interpreter."""
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run(
        [sys.executable, *flags, "-m", "tierfeed", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def imported(stderr: str) -> set[str]:
    """The module names in `-X importtime` output."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def store(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("stores") / "store"
    pack(src, dst, PackOptions(chunk_size=8192, progress=False))
    return dst


@pytest.mark.parametrize("command", ["--help", "inspect", "verify", "pack"])
def test_light_commands_import_no_torch(
    command: str, src: Path, store: Path, tmp_path: Path
) -> None:
    args: list[object] = {
        "--help": ["--help"],
        "inspect": ["inspect", store],
        "verify": ["verify", "-q", store],
        "pack": ["pack", "-q", src, tmp_path / "out"],
    }[command]
    done = run(*args, importtime=True)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = imported(done.stderr)
    assert "tierfeed.cli" in modules  # the output was read as meant
    torch = sorted(m for m in modules if m == "torch" or m.startswith("torch."))
    assert torch == [], f"`tierfeed {command}` imported {torch[:5]}"


def test_help_imports_no_command_module() -> None:
    done = run("--help", importtime=True)
    modules = imported(done.stderr)
    loaded = [target.partition(":")[0] for target, _ in cli.COMMANDS.values()]
    loaded = [m for m in loaded if m != "tierfeed.cli"]  # pack's registration lives there
    assert [m for m in loaded if m in modules] == []
    for name in cli.COMMANDS:
        assert name in done.stdout


def test_a_command_help_shows_its_own_options() -> None:
    done = run("pack", "--help")
    assert done.returncode == 0, done.stderr
    assert "--chunk-size" in done.stdout and "--skip-unreadable" in done.stdout


def test_version_comes_from_the_package_metadata() -> None:
    done = run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"tierfeed {version('tierfeed')}\n"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub


def test_every_option_of_every_command_has_help() -> None:
    parser = cli.build_parser()  # every command's real parser
    sub = _subparsers(parser)
    assert set(sub.choices) == set(cli.COMMANDS)
    missing = [a.dest for a in parser._actions if not a.help]
    for name, command in sub.choices.items():
        missing += [f"{name} {a.option_strings or a.dest}" for a in command._actions if not a.help]
    assert missing == []


def test_the_summaries_in_cli_are_those_the_commands_register() -> None:
    registered = {a.dest: a.help for a in _subparsers(cli.build_parser())._choices_actions}
    assert registered == {name: summary for name, (_, summary) in cli.COMMANDS.items()}


def test_a_lazy_parser_has_every_command_and_only_one_real() -> None:
    sub = _subparsers(cli.build_parser("inspect"))
    assert set(sub.choices) == set(cli.COMMANDS)
    assert sub.choices["inspect"].get_default("func") is not None
    assert sub.choices["pack"].get_default("func") is None  # a stub: nothing imported for it


def _bytes(out: str) -> list[dict[str, Any]]:
    """simulate's JSON rows: the bytes, not the measured plan time and memory."""
    rows: list[dict[str, Any]] = json.loads(out)
    return [{k: v for k, v in row.items() if not k.startswith("plan_")} for row in rows]


def test_plan_is_the_name_and_policy_a_hidden_alias(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--samples", "20000", "--ranks", "4", "--chunk-size", "4MiB", "--json"]
    assert cli.main([*argv, "--plan", "partial:0.2"]) == 0
    new = capsys.readouterr()
    assert new.err == ""
    assert cli.main([*argv, "--policy", "partial:0.2"]) == 0
    old = capsys.readouterr()
    assert _bytes(old.out) == _bytes(new.out)
    assert old.err == ""  # silent: an error stays one line (docs/errors.md)
    assert cli.main([*argv]) == 0  # default: global, different from partial
    assert _bytes(capsys.readouterr().out) != _bytes(new.out)
    done = run("simulate", "--help")
    assert "--plan" in done.stdout and "--policy" not in done.stdout
    stage = run("stage", "--help")
    assert "--plan" in stage.stdout and "--policy" not in stage.stdout
