"""The `zeromon` command line. ``main(argv) -> int`` is what tests call; errors exit with code 2."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from zeromon.commands import COMMAND_MODULES
from zeromon.errors import EXIT_USAGE, ZeromonError


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so that every usage error takes the same path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse takes a value that starts with '-' for an option unless it looks like a plain negative
        # number ('-7', '-0.5'), so `--params -7e9` or `--gpu-memory -80GiB` failed with "expected one
        # argument" instead of reaching the flag's own check. Anything starting '-<digit>' or '-.<digit>' is
        # a value here: no zeromon option looks like that. (A private attribute: should argparse drop it,
        # this line does nothing and the old message returns; test_cli checks it.)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ZeromonError(f"{self.prog}: {message}", hint=f"see `{self.prog} --help`")


def _version() -> str:
    from zeromon import __version__

    return __version__


def command_name(module_name: str) -> str:
    """A command's name, its module's last part (each module's NAME: tests/test_cli.py)."""
    return module_name.rpartition(".")[2]


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The parser of every command (`zeromon --help` lists them), or, for ``command``, of that one alone: the others
    by name only, their modules not imported. A command then starts in what its own imports cost, not every
    command's (`zeromon run` starts the training sooner: issue 44, tests/bench/RESULTS.md)."""
    parser = _Parser(prog="zeromon", description="Live memory and communication monitoring for ZeRO / FSDP.")
    parser.add_argument("--version", action="version", version=f"zeromon {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands: dict[str, ModuleType] = {}
    for module_name in COMMAND_MODULES:
        if command is not None and command_name(module_name) != command:
            sub.add_parser(command_name(module_name))  # a name argparse accepts, never parsed
            continue
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(module.NAME, help=module.HELP))
        commands[module.NAME] = module
    return parser, commands


def _refuse_double_dash_values(argv: list[str]) -> None:
    """``--run=--``: argparse (3.11+) drops a value of '--' and hands the command an empty list; no
    zeromon option takes '--', so it is refused by name here (after a bare '--', words are a command's)."""
    for arg in argv:
        if arg == "--":
            return
        name, eq, value = arg.partition("=")
        if eq and value == "--" and name.startswith("--"):
            raise ZeromonError(f"{name} '--': not a value ('--' ends the options)", hint=f"give {name} a value")


def _one_line(text: str) -> str:
    """``text`` with control characters escaped: a message names what the user typed (a path with a
    newline, a NEL, an escape sequence), and must stay one line that cannot rewrite the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    named = {command_name(m) for m in COMMAND_MODULES}
    parser, commands = build_parser(argv[0] if argv and argv[0] in named else None)
    try:
        if not argv:
            parser.print_usage(sys.stderr)
            names = ", ".join(commands)
            print(f"zeromon: error: a command is required ({names}); see `zeromon --help`", file=sys.stderr)
            return EXIT_USAGE
        _refuse_double_dash_values(argv)
        args, unknown = parser.parse_known_args(argv)
        command = commands.get(args.command)
        if unknown:  # said by the subcommand, so that the hint points to its own --help
            prog = f"zeromon {args.command}" if command is not None else "zeromon"
            raise ZeromonError(f"{prog}: unrecognized arguments: {' '.join(unknown)}", hint=f"see `{prog} --help`")
        if command is None:
            parser.print_usage(sys.stderr)
            return EXIT_USAGE
        return int(command.run(args))
    except ZeromonError as exc:
        print(f"zeromon: error: {_one_line(exc.message)}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {_one_line(exc.hint)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `zeromon ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
