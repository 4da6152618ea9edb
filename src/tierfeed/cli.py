"""The `tierfeed` command line: each subcommand registers itself from beside its code."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from tierfeed.errors import TierfeedError

__all__ = ["main"]

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


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="tierfeed",
        description="Keep training fed from slow shared storage.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for target in COMMANDS.values():
        register = _load(target)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (1 for a tierfeed error, with its message)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except TierfeedError as exc:
        print(f"tierfeed {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tierfeed {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
