"""``energon-pack bench-pixels``: the worker pixel path per ``pixel_dtype`` vs HF's processor and the
decode floor; real-loader CPU and bytes per pack."""

from __future__ import annotations

import argparse
from typing import Any

from energon_pack.bench.outputs import OUT_HELP

from .common import targets_exit
from .options import add_command, positive_int

NAME = "bench-pixels"
KNOB_FLAGS: dict[str, str] = {}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        NAME,
        "worker pixel path: images per CPU-second vs HF's processor and the decode "
        "floor, per pixel_dtype; real-loader CPU and bytes per pack",
    )
    p.add_argument("--images", type=positive_int, default=46, help="generated photos and scans to time")
    p.add_argument("--rounds", type=positive_int, default=5, help="interleaved rounds (best round counts)")
    p.add_argument("--loader-packs", type=int, default=24, help="packs per dtype through the real loader (0: skip)")
    p.add_argument("--no-draft", action="store_true", help="skip the jpeg_draft comparison on large photos")
    p.add_argument("--out", default="bench_results/pixel.json", help=OUT_HELP)
    p.add_argument("--check", action="store_true", help="exit 1 when a benchmark target is missed")
    return p


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from energon_pack.bench import pixel_bench

    hf = importlib.util.find_spec("transformers") is not None
    if not hf:
        print("transformers is not installed: the HF processor column is left out (pip install transformers)")
    result = pixel_bench.main(
        args.out,
        images=args.images,
        rounds=args.rounds,
        loader_packs=max(args.loader_packs, 0),
        draft=not args.no_draft,
        hf=hf,
    )
    return targets_exit(result["targets"], args.check)
