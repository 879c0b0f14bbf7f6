"""``energon-pack demo``: make demo shards if absent, stream packed batches in both modes, report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import DEMO_DIR, demo_dataset, resolve_tokenizer
from .options import add_command, non_negative_int, object_read_options, positive_int

NAME = "demo"
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {"seq_length": "--width", "packing_buffer_size": "--buffer"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, NAME, "make demo shards if absent, stream packed batches (carry vs rounds), report")
    p.add_argument(
        "--data",
        default=DEMO_DIR,
        help="dataset folder: demo data is written into it when it is absent or empty; "
        "a prepared Energon dataset is used as is; anything else is refused",
    )
    p.add_argument("--samples", type=positive_int, default=1200, help="demo samples to write when creating it")
    p.add_argument("--buffer", type=positive_int, default=64, help="packing_buffer_size K (samples per worker)")
    p.add_argument("--workers", type=non_negative_int, default=2, help="loader worker processes (0: in this process)")
    p.add_argument("--packs", type=positive_int, default=150, help="packs to stream per mode (at least 1)")
    p.add_argument("--width", type=positive_int, default=8192, help="pack width in tokens (seq_length)")
    p.add_argument("--out", default="bench_results/demo.json", help="JSON report path")
    object_read_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.bench.loader_bench import cells_to_json, format_cells, run_cell

    data = demo_dataset(args.data, args.samples)
    tokenizer, described = resolve_tokenizer(None, default="qwen2.5-vl")
    print(f"tokenizer: {described}; preset qwen2.5-vl", flush=True)
    cells = [
        run_cell(
            data,
            mode=mode,
            buffer=args.buffer,
            workers=args.workers,
            packs=args.packs,
            seq_length=args.width,
            progress=True,
            tokenizer=tokenizer,
        )
        for mode in ("carry", "rounds")
    ]
    print(
        f"\nQwen2.5-VL packing on {data} (width {args.width}, packing_buffer_size {args.buffer}, "
        f"{args.workers} workers, {args.packs} packs per mode)\n"
    )
    print(format_cells(cells))
    carry, rounds = cells
    print(
        f"\ncarry (ours): {carry.fill * 100:.2f}% fill, {carry.samples_per_pack:.1f} samples/pack, "
        f"{carry.slots - carry.real_tokens} pad tokens in {carry.packs} packs\n"
        f"rounds (Energon's PackingDataset + FFD): {rounds.fill * 100:.2f}% fill, "
        f"{rounds.samples_per_pack:.1f} samples/pack, {rounds.slots - rounds.real_tokens} pad tokens in "
        f"{rounds.packs} packs"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dataset": str(data), "cells": cells_to_json(cells)}, indent=2))
    print(f"wrote {out}")
    return 0
