"""``energon-pack inspect FILE.jsonl``: counts, length percentiles, skips by reason and packing fill
of a JSONL file (:func:`energon_pack.sft.inspect_jsonl`), printed, with a progress bar while a large
file's lengths are measured and hints that name this command's flags."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .common import CliError, jsonl_file, resolve_tokenizer
from .options import (
    JSONL_FLAGS,
    DeprecatedFlag,
    add_command,
    field_kw,
    jsonl_options,
    positive_int,
    spec_flags,
    spec_options,
)

NAME = "inspect"
#: the alignment flags (the spec's knobs; the old --pad-multiple gave the alignment itself)
ALIGNMENT = ("cp", "tp", "sp")
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {**JSONL_FLAGS, **spec_flags(*ALIGNMENT), "pad_multiple": "the alignment of --cp/--tp/--sp"}
#: how the report's hints name its settings here (``width`` is followed by a value)
HINT_NAMES = {
    "chat": "--format chat",
    "prompt_completion": "--format prompt_completion",
    "text": "--format text",
    "fields": "--prompt-field / --completion-field",
    "width": "--seq-length ",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, NAME, "counts, length percentiles, skips by reason and packing fill of a JSONL file")
    p.add_argument("path", help="a prompt/completion or chat JSONL file")
    jsonl_options(p)
    spec_options(p, *ALIGNMENT)
    p.add_argument(
        "--pad-multiple",
        type=positive_int,
        default=None,
        action=DeprecatedFlag,
        const="--cp/--tp/--sp (the alignment is derived from them)",
        help="deprecated: use --cp/--tp/--sp (default: their alignment)",
    )
    p.add_argument("--json-out", default=None, help="also write the report as JSON to this path (default: not written)")
    return p


class ProgressBar:
    """The length pass's progress on stderr, shown once a pass over more than one range of lines starts."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, done: int, lines: int) -> None:
        from energon_pack.sft.length_pass import RANGE_LINES

        if self.bar is None and lines > RANGE_LINES:
            from tqdm import tqdm

            self.bar = tqdm(
                total=lines, unit=" lines", desc="length pass", file=sys.stderr, leave=False, mininterval=0.5
            )
        if self.bar is not None:
            self.bar.update(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def show(path: str | os.PathLike, *, json_out: str | os.PathLike | None = None, **kw: Any) -> int:
    """Print the report of :func:`~energon_pack.sft.inspect_jsonl` (and write it as JSON); 0 when at
    least one line is usable, else 1."""
    from energon_pack.sft.inspect import format_report, inspect_jsonl

    report = inspect_jsonl(path, **kw)
    print(format_report(report))
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(report, indent=2))
        print(f"wrote the report to {json_out}")
    return 0 if report["usable"] else 1


def _alignment(args: argparse.Namespace) -> int:
    """The report's alignment: the old ``--pad-multiple`` where given (it may not be combined with the new
    flags), else the rule of ``--cp``/``--tp``/``--sp``."""
    from energon_pack.thd import alignment_multiple

    if args.pad_multiple is None:
        return alignment_multiple(args.cp, args.tp, args.sp)
    if (args.cp, args.tp, args.sp) != (1, 1, False):
        raise CliError("--pad-multiple is the old form of --cp/--tp/--sp: pass one or the other")
    return args.pad_multiple


def run(args: argparse.Namespace) -> int:
    path = jsonl_file(args.path)
    tokenizer, described = resolve_tokenizer(args.tokenizer)
    print(f"tokenizer: {described}", flush=True)
    bar = ProgressBar()
    try:
        return show(
            path,
            format=args.format,
            tokenizer=tokenizer,
            names=HINT_NAMES,
            progress=bar,
            seq_length=args.seq_length,
            pad_multiple=_alignment(args),
            max_length=args.max_length,
            json_out=args.json_out,
            **field_kw(args),
        )
    finally:
        bar.close()
