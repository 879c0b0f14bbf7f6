"""The ``energon-pack`` parser, assembled from the command modules, and the dispatch: one module per
command (``add_parser(subparsers)``, ``run(args) -> int``), errors as one line with exit status 2,
Ctrl-C as exit status 130. ``convert`` parses its own arguments."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from types import ModuleType

from . import (
    bench,
    bench_offline,
    bench_packing,
    bench_pixels,
    bench_sft,
    calibrate,
    demo,
    inspect,
    make_demo,
    pack_offline,
    plan,
    plan_blend,
    prepare,
)
from .common import OUTPUT_ARGS, refuse_remote_output
from .interrupt import interruptible
from .options import Parser, object_reads
from .wording import exit_status, one_line, one_line_warnings

#: help texts are printed as they are: plain text, no reST or Markdown markup (tests check every command)
DESCRIPTION = """The energon-pack command line: demo, data conversion and preparation, benchmarks, JSONL inspection.

Errors a user can make (a wrong path, an unprepared dataset, a bad number, a configuration
mistake) print one line on stderr with the next step and exit with status 2; --debug
shows the traceback instead. Ctrl-C stops any command at once with exit status 130, keeping
what was already written (bench writes each finished cell).
"""

#: the commands in ``--help`` order; ``convert`` is listed after ``make-demo``
COMMANDS: tuple[ModuleType, ...] = (
    demo,
    make_demo,
    prepare,
    bench,
    bench_packing,
    inspect,
    bench_pixels,
    bench_sft,
    pack_offline,
    bench_offline,
    calibrate,
    plan,
    plan_blend,
)
BY_NAME = {module.NAME: module for module in COMMANDS}
CONVERT_HELP = (
    "your LLaVA/ShareGPT/OpenAI-messages/LLaMA-Factory (alpaca, tool calls) JSON(L) or Parquet -> prepared "
    "Energon shards (see convert --help)"
)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("energon-pack")
    except Exception:
        from energon_pack import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and each command's subparser by name."""
    parser = Parser(prog="energon-pack", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"energon-pack {_version()}")
    parser.add_argument(
        "--debug", action="store_true", default=False, help="show tracebacks instead of one-line errors"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
        if module is make_demo:
            sub.add_parser("convert", add_help=False, help=CONVERT_HELP)
    return parser, sub.choices


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, an unknown option refused by the command's own parser (so the one error line
    names the command: ``energon-pack bench: error: unrecognized arguments: --dat``)."""
    parser, commands = _build()
    args, extras = parser.parse_known_args(argv)
    if extras:
        commands[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["convert"]:
        from energon_pack.cli.convert.command import main as convert_main

        return interruptible("energon-pack convert", lambda: convert_main(argv[1:]))
    args = parse_args(argv)
    prog = f"energon-pack {args.command}"
    command = BY_NAME[args.command]
    with contextlib.ExitStack() as scope, one_line_warnings(prog, command.KNOB_FLAGS):
        if getattr(args, "cache_dir", None):  # through the environment, so worker processes follow it
            from energon_pack.env import CACHE_DIR_VARIABLE, environ_set

            scope.enter_context(environ_set(CACHE_DIR_VARIABLE, str(Path(args.cache_dir).expanduser().resolve())))
        return interruptible(prog, lambda: _run(command, args, prog))


def _run(command: ModuleType, args: argparse.Namespace, prog: str) -> int:
    """The command, with a user error as one line on stderr and exit status 2 (1 for a bug)."""
    try:
        for name in OUTPUT_ARGS:  # before anything is read or written
            refuse_remote_output(getattr(args, name, None), f"--{name.replace('_', '-')}")
        with object_reads(args):
            return command.run(args)
    except Exception as exc:
        if getattr(args, "debug", False):
            raise
        print(f"{prog}: error: {one_line(exc, command.KNOB_FLAGS)}", file=sys.stderr)
        return exit_status(exc)
