"""``energon-pack bench-packing``: fill and us/sample of OnlinePacker vs round FFD on synthetic mixes."""

from __future__ import annotations

import argparse
from typing import Any

from energon_pack.bench.outputs import OUT_HELP

from .common import targets_exit
from .options import add_command, ints, positive_int

NAME = "bench-packing"
KNOB_FLAGS: dict[str, str] = {}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, NAME, "fill and us/sample of OnlinePacker vs round FFD on synthetic mixes")
    p.add_argument("--samples", type=positive_int, default=20000, help="samples per synthetic stream")
    p.add_argument("--buffers", type=ints, default=None, help="comma-separated buffer sizes K (default: 1,2,4,...,256)")
    p.add_argument("--widths", type=ints, default=None, help="comma-separated pack widths (default: 4096,8192)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the synthetic mixes")
    p.add_argument("--out", default="bench_results/packing.json", help=OUT_HELP)
    p.add_argument("--check", action="store_true", help="exit 1 when a benchmark target is missed")
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.bench import packing_bench

    kw = {"samples": args.samples, "seed": args.seed}
    if args.buffers:
        kw["buffers"] = args.buffers
    if args.widths:
        kw["widths"] = args.widths
    return targets_exit(packing_bench.main(args.out, **kw)["targets"], args.check)
