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
from typing import NoReturn

from tierfeed.errors import TierfeedError

__all__ = ["main"]

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

# name -> "module:function"; the function adds the subcommand's parser and sets
# `func` (args -> exit code) on it. Modules are imported only when they exist, so
# a command's dependencies (FUSE, matplotlib, torch) load only when it is used.
COMMANDS: dict[str, str] = {
    "pack": "tierfeed.format.commands:register_pack",
    "index": "tierfeed.format.commands:register_index",
    "inspect": "tierfeed.format.commands:register_inspect",
    "verify": "tierfeed.format.commands:register_verify",
    "slowfs": "tierfeed.slowfs.command:register",
    "stage": "tierfeed.dist.command:register",
    "simulate": "tierfeed.plan.command:register",
    "report": "tierfeed.telemetry.command:register",
    "mount": "tierfeed.mount.command:register_mount",
    "umount": "tierfeed.mount.command:register_umount",
}

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _load(target: str) -> Register | None:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None  # this command is not part of this build yet
        raise
    register: Register = getattr(module, attr)
    return register


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and exit 2 (subparsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        what = " ".join(message.split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {what}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every available subcommand."""
    parser: argparse.ArgumentParser = _Parser(
        prog="tierfeed",
        description="Keep training fed from slow shared storage.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for target in COMMANDS.values():
        register = _load(target)
        if register is not None:
            register(sub)
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
        args = build_parser().parse_args(argv)
        command = f"tierfeed {args.command}"
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
