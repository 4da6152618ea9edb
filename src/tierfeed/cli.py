"""The `tierfeed` command line: each subcommand registers itself from beside its code.

It keeps the one rule of docs/errors.md for every command: a user error is one stderr line
``tierfeed <command>: error: <what>, <which file>, <what to do>`` and exit status 1 (2 for a
usage error); a traceback only for a bug, followed by a line asking to report it.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from tierfeed.errors import INSTALL_TORCH, TierfeedError

if TYPE_CHECKING:
    from tierfeed.format.pack import PackOptions, PackReport

__all__ = ["main", "register_pack"]

EXIT_ERROR = 1  # a user error: bad input, a path that cannot be used, a full disk
EXIT_USAGE = 2  # the command line itself is wrong (argparse's convention)
EXIT_BUG = 70  # EX_SOFTWARE (sysexits.h): an internal error, with a traceback
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head`)

# OSErrors that mean "this path cannot be used as given", not a bug; what to do about each.
_OS_ADVICE = {
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is not a directory; check the path",
    errno.EISDIR: "it is a directory; give a file",
    errno.EACCES: "no permission; check its permissions or choose another path",
    errno.EPERM: "not permitted; check its permissions or choose another path",
    errno.EROFS: "the file system is read-only; choose a writable path",
    errno.ENOSPC: "the disk is full; free some space or choose another place",
    errno.EDQUOT: "the disk quota is used up; free some space or choose another place",
    errno.EEXIST: "it already exists; remove it or choose another path",
    errno.ELOOP: "too many symlinks (a loop?); check the path",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
}

# Modules a command may need that a plain `pip install tierfeed` leaves out: what to install.
_EXTRAS = {
    "torch": INSTALL_TORCH,
    "matplotlib": "pip install 'tierfeed[report]'",
    "PIL": "pip install 'tierfeed[image]'",
}

# name -> ("module:function", one-line summary). The function adds the subcommand's parser and
# sets `func` (args -> exit code) on it. Only the module of the command being run is imported:
# the others appear in `tierfeed --help` by their summary alone, so a command's dependencies
# (FUSE, matplotlib, torch) load only when it is used and `tierfeed --help` starts at once.
# Each summary is the `help=` its module registers (tests/test_cli_startup.py keeps them equal).
COMMANDS: dict[str, tuple[str, str]] = {
    "pack": (
        "tierfeed.cli:register_pack",
        "pack a directory tree into tar chunks and an index",
    ),
    "merge": (
        "tierfeed.format.commands:register_merge",
        "join the parts `tierfeed pack --part` packed into one store",
    ),
    "index": ("tierfeed.loader.commands:register_index", "index tar shards where they lie"),
    "convert": (
        "tierfeed.loader.convert:register",
        "convert an MDS or LitData dataset into a store",
    ),
    "inspect": (
        "tierfeed.loader.commands:register_inspect",
        "summarise a store: samples, chunks, classes, sizes",
    ),
    "verify": (
        "tierfeed.loader.commands:register_verify",
        "check every chunk checksum and the index; exit 1 if bad",
    ),
    "slowfs": (
        "tierfeed.slowfs.command:register",
        "mount a directory read-only through FUSE with a seeded latency model",
    ),
    "stage": (
        "tierfeed.distributed.command:register",
        "copy a store's chunks to node-local storage (every rank a disjoint share)",
    ),
    "simulate": (
        "tierfeed.distributed.simulate_command:register",
        "origin, exchange and cache bytes per epoch of a plan",
    ),
    "report": (
        "tierfeed.telemetry.command:register",
        "plot a run: throughput, batch-wait CDF, tier hit rates",
    ),
    "mount": (
        "tierfeed.mount.command:register_mount",
        "mount a store read-only as its original directory tree",
    ),
    "umount": ("tierfeed.mount.command:register_umount", "unmount a tierfeed mount"),
}

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _pack_to(src: str, dst: str, options: PackOptions, files: str | None = None) -> PackReport:
    """`tierfeed pack`'s packer: to a directory with `tierfeed.format` alone; to a URL with
    `tierfeed.loader`'s upload, imported only then (the loader's composition, which its
    package brings, is no part of packing a directory)."""
    if "://" in dst:  # a URL, or file:// (which the loader's pack takes as a path)
        from tierfeed.loader.upload import pack as pack_anywhere

        return pack_anywhere(src, dst, options, files)
    from tierfeed.format.pack import pack

    return pack(src, dst, options, files)


def register_pack(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `tierfeed pack`, to a directory or a URL (built locally, then uploaded)."""
    from tierfeed.format.commands import register_pack as register

    register(sub, _pack_to)


def _load(target: str) -> Register:
    module_name, _, attr = target.partition(":")
    register: Register = getattr(importlib.import_module(module_name), attr)
    return register


class _Version(argparse.Action):
    """`--version`: the installed distribution's version, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("tierfeed")
        except PackageNotFoundError:  # a source tree on PYTHONPATH that was never installed
            from tierfeed import __version__ as text
        print(f"tierfeed {text}")
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and exit 2 (subparsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        what = " ".join(message.split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {what}; see `{self.prog} --help`\n")


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand argparse will pick: the first argument that is not an option.

    The top-level parser has no option that takes a value, so this is exactly argparse's choice.
    """
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; every subcommand's own parser, or only that of ``only``.

    Args:
        only: the command about to run; every other command gets a stub parser that carries
            its summary for `tierfeed --help` and imports nothing. None registers them all.
    """
    parser: argparse.ArgumentParser = _Parser(
        prog="tierfeed",
        description="Keep training fed from slow shared storage.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        help="`tierfeed COMMAND --help` tells more",
    )
    for name, (target, summary) in COMMANDS.items():
        if only is None or name == only:
            _load(target)(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _one_line(command: str, what: str) -> None:
    print(f"{command}: error: {' '.join(what.split())}", file=sys.stderr)


def _describe_os_error(exc: OSError) -> str | None:
    """One-line text of an OSError that a user can fix (a path they gave), else None."""
    advice = _OS_ADVICE.get(exc.errno or 0)
    if advice is None:
        return None
    where = exc.filename if exc.filename is not None else "(no path given by the system)"
    return f"{os.fsdecode(where)}: {exc.strerror or exc}; {advice}"


def _stdout_gone() -> int:
    """The reader of stdout went away: exit quietly, as `yes | head -1` does.

    Python's docs (signal, "Note on SIGPIPE"): point stdout at devnull so that the flush at
    interpreter exit does not raise again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _bug(command: str, argv: Sequence[str]) -> int:
    traceback.print_exc()
    line = shlex.join(["tierfeed", *argv])
    print(
        f"{command}: internal error (a bug in tierfeed); please report it with the command "
        f"line `{line}` and the traceback above",
        file=sys.stderr,
    )
    return EXIT_BUG


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status (docs/errors.md).

    0 done; 1 a user error, as one line on stderr; 2 a usage error; 70 a bug (traceback and a
    line asking to report it); 130 interrupted; 141 stdout closed by its reader.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "tierfeed"
    try:
        # Only the command named is imported; with none ("": --help, --version, a usage
        # error) no command module is.
        args, unknown = build_parser(_command_in(argv) or "").parse_known_args(argv)
        command = f"tierfeed {args.command}"
        if unknown:  # the command's usage error, in its own form (argparse's names the top)
            _Parser(prog=command).error(f"unrecognized arguments: {shlex.join(unknown)}")
        func: Callable[[argparse.Namespace], int] = args.func
        status = func(args)
        sys.stdout.flush()  # here, so that a closed pipe is seen now and not at exit
        return status
    except BrokenPipeError as exc:
        if exc.filename is None:
            return _stdout_gone()
        return _bug(command, argv)
    except TierfeedError as exc:
        _one_line(command, str(exc))
        return EXIT_ERROR
    except ModuleNotFoundError as exc:
        install = _EXTRAS.get((exc.name or "").partition(".")[0])
        if install is None:
            return _bug(command, argv)
        _one_line(command, f"this command needs {exc.name}, which is not installed: {install}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        what = _describe_os_error(exc)
        if what is None:
            return _bug(command, argv)
        _one_line(command, what)
        return EXIT_ERROR
    except Exception:
        return _bug(command, argv)


if __name__ == "__main__":
    sys.exit(main())
