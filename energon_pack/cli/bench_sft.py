"""``energon-pack bench-sft``: the GPT-SFT JSONL path (index build vs ``wc -l``, length pass, lazy
getitem, in-batch fill) on a user's JSONL file or on generated prompt/completion files."""

from __future__ import annotations

import argparse
from typing import Any

from energon_pack.bench.outputs import OUT_HELP

from .common import CliError, jsonl_file, resolve_tokenizer, targets_exit
from .options import JSONL_FLAGS, add_command, field_kw, jsonl_options, positive_int

NAME = "bench-sft"
KNOB_FLAGS = JSONL_FLAGS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        NAME,
        "GPT-SFT JSONL path: index build vs wc -l, length pass, lazy getitem "
        "samples/s, in-batch fill (on --data FILE.jsonl, else on generated prompt/completion files)",
    )
    p.add_argument(
        "--data", default=None, help="your JSONL file (only read); default: generated prompt/completion files"
    )
    jsonl_options(p)
    p.add_argument("--samples", type=positive_int, default=5000, help="lines read in random order for the getitem rate")
    p.add_argument(
        "--size-mb",
        type=positive_int,
        default=1024,
        help="size of the generated JSONL for the index benchmark (without --data)",
    )
    p.add_argument("--out", default="bench_results/sft.json", help=OUT_HELP)
    p.add_argument(
        "--check",
        action="store_true",
        help="print the project's targets for the generated-data run and exit 1 when one is missed",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.bench import sft_bench

    if args.data is None:
        if args.tokenizer is not None or args.format != "prompt_completion" or field_kw(args):
            raise CliError(
                "--tokenizer, --format and the field names apply to --data FILE.jsonl (the generated "
                "prompt/completion files use the real Qwen2.5-VL tokenizer)"
            )
        result = sft_bench.main(args.out, size_mb=args.size_mb, getitem_samples=args.samples, check=args.check)
        return targets_exit(result["targets"], args.check) if args.check else 0
    path = jsonl_file(args.data)
    tokenizer, described = resolve_tokenizer(args.tokenizer)
    sft_bench.main(
        args.out,
        data=path,
        tokenizer=tokenizer,
        tokenizer_name=described,
        format=args.format,
        width=args.seq_length,
        getitem_samples=args.samples,
        max_length=args.max_length,
        **field_kw(args),
    )
    if args.check:
        print("--check: the project's targets are set on generated data; there are none to grade on --data")
    return 0
