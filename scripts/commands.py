"""One entry point for several commands: ``python -m scripts.<package> COMMAND [ARGS ...]`` runs
that command's module's ``main(ARGS)``; ``--help`` lists the commands, one line each."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    module: str  # its ``main(argv) -> int`` runs the command
    summary: str  # one line, for the package's --help


def run(prog: str, description: str, commands: Mapping[str, Command], argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv[0]`` names with the rest of ``argv``; its module is imported only then."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in commands:
        main = importlib.import_module(commands[argv[0]].module).main
        try:
            return main(argv[1:])
        except BrokenPipeError:  # `... | head`: the reader has what it wanted
            sys.stdout = None
            return 0
    width = max(map(len, commands))
    listing = "\n".join(f"  {name:<{width}}  {command.summary}" for name, command in commands.items())
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} [-h] COMMAND [ARGS ...]",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"commands:\n{listing}\n\n{prog} COMMAND --help: the command's own flags",
    )
    parser.add_argument("command", metavar="COMMAND", choices=list(commands), help="one of the commands below")
    parser.parse_args(argv[:1])  # --help, or the error naming the commands: both exit
    parser.error(f"unknown command {argv[0]!r}")  # not reached
    return 2
