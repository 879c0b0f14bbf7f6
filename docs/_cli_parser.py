"""The `energon-pack` parsers for sphinx-argparse, with their help text escaped for reStructuredText
(sphinx-argparse parses help as RST, where the ``*`` of ``*.tar`` would open an emphasis and the ``_`` of
``buffer_*.png`` make a reference)."""

import argparse

from energon_pack.cli.convert.command import build_parser as build_convert_parser
from energon_pack.cli.main import build_parser as build_main_parser


def _rst_literal(text: str) -> str:
    """``text`` with the characters RST would misread escaped (double backquotes stay literals)."""
    return text.replace("\\", "\\\\").replace("*", r"\*").replace("_", r"\_").replace("|", r"\|")


def _escaped(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for owner in [parser, *parser._actions]:
        for field in ("description", "epilog", "help"):
            text = getattr(owner, field, None)
            if isinstance(text, str):
                setattr(owner, field, _rst_literal(text))
        if isinstance(owner, argparse._SubParsersAction):
            for action in owner._choices_actions:
                action.help = action.help and _rst_literal(action.help)
            for sub in owner.choices.values():
                _escaped(sub)
    return parser


def main_parser() -> argparse.ArgumentParser:
    """``energon-pack`` and its subcommands (``convert`` has its own parser: :func:`convert_parser`)."""
    return _escaped(build_main_parser())


def convert_parser() -> argparse.ArgumentParser:
    return _escaped(build_convert_parser())
