"""``energon-pack demo``: make demo shards if absent, stream packed batches in both modes, report."""

from __future__ import annotations

import argparse
from typing import Any

from energon_pack.bench.outputs import OUT_HELP

from .common import DEMO_DIR, demo_dataset, resolve_tokenizer
from .options import (
    OBJECT_WAIT_FLAGS,
    add_command,
    non_negative_int,
    object_read_options,
    positive_int,
    spec_flags,
    spec_options,
)

NAME = "demo"
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {**spec_flags("seq_length"), "packing_buffer_size": "--buffer", **OBJECT_WAIT_FLAGS}
#: timed runs per mode (``--packs`` split between them), in ABBA order after an untimed warm-up
TIMED_RUNS = 4


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
    p.add_argument(
        "--packs",
        type=positive_int,
        default=150,
        help="packs to stream per mode (at least 1), split between 4 timed runs per mode in ABBA order",
    )
    spec_options(p, "seq_length")
    p.add_argument("--out", default="bench_results/demo.json", help=OUT_HELP)
    object_read_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    return run_demo(args)


def run_demo(args: argparse.Namespace, order: tuple[str, str] = ("carry", "rounds"), runs: int = TIMED_RUNS) -> int:
    """The demo: an untimed warm-up, then ``runs`` timed runs per mode in ABBA order starting with
    ``order[0]`` (tests flip it to check that the order does not change the side-by-side figures); the
    table lists carry first either way."""
    from energon_pack.bench.loader_bench import (
        abba,
        cells_to_json,
        finite_median,
        format_cells,
        interleaved,
        paired_ratios,
        repeat_note,
        warm_up,
    )
    from energon_pack.bench.outputs import RunFiles

    files, name = RunFiles.for_file(args.out)
    data = demo_dataset(args.data, args.samples)
    tokenizer, described = resolve_tokenizer(None, default="qwen2.5-vl")
    print(f"tokenizer: {described}; preset qwen2.5-vl", flush=True)
    common = {"buffer": args.buffer, "seq_length": args.seq_length, "tokenizer": tokenizer}
    took = warm_up(data, modes=order, **common)
    print(f"warm-up (untimed, {' and '.join(order)}): {took:.1f} s", flush=True)
    merged, timed = interleaved(
        data, modes=order, packs=args.packs, runs=runs, workers=args.workers, progress=True, **common
    )
    by_mode = dict(zip(order, merged))
    carry, rounds = by_mode["carry"], by_mode["rounds"]
    cells = [carry, rounds]
    runs = carry.runs
    print(
        f"\nQwen2.5-VL packing on {data} (width {args.seq_length}, packing_buffer_size {args.buffer}, "
        f"{args.workers} workers, {args.packs} packs per mode"
        + (
            f" in {runs} timed runs each, order {'-'.join(m for _, m in abba(order, runs))}, "
            f"after an untimed warm-up; speed and latency: the median of the runs)\n"
            if runs > 1
            else ", after an untimed warm-up)\n"
        )
    )
    print(format_cells(cells))
    print(
        f"\ncarry (ours): {carry.fill * 100:.2f}% fill, {carry.samples_per_pack:.1f} samples/pack, "
        f"{carry.slots - carry.real_tokens} pad tokens in {carry.packs} packs\n"
        f"rounds (Energon's PackingDataset + FFD): {rounds.fill * 100:.2f}% fill, "
        f"{rounds.samples_per_pack:.1f} samples/pack, {rounds.slots - rounds.real_tokens} pad tokens in "
        f"{rounds.packs} packs"
    )
    ratios = {attr: paired_ratios(timed, "carry", "rounds", attr) for attr in ("samples_per_s", "real_tokens_per_s")}
    if all(ratios.values()):  # none when a run held one pack (no rate)
        print(speed_line(ratios["samples_per_s"], ratios["real_tokens_per_s"]))
    most_read = max(c.samples_read for _, c in timed)
    note = repeat_note(carry.dataset_samples, most_read, "each timed run")
    if note:
        print(note)
    report = {
        "dataset": str(data),
        "order": list(order),
        "cells": cells_to_json(cells),
        "timed_runs": [{"run": r, **row} for (r, _), row in zip(timed, cells_to_json([c for _, c in timed]))],
        "carry_over_rounds": {attr: finite_median(v) if v else None for attr, v in ratios.items()},
    }
    files.write_json(name, report)
    print(files.announce())
    return 0


def speed_line(samples: list[float], tokens: list[float]) -> str:
    """carry / rounds speed as the median of the paired runs' ratios *with their range*, and what the range
    allows one to say: on a small shared machine runs vary by tens of percent (0.84-1.42 around a median of
    1.06 on 2 cores), so a median alone would read as a difference that was not measured."""
    from energon_pack.bench.loader_bench import finite_median

    finite = sorted(x for x in samples if x == x)
    lo, hi = finite[0], finite[-1]
    if lo <= 1 <= hi:
        verdict = "the runs disagree on which mode is faster: no speed difference measured here"
    else:
        verdict = f"carry {'faster' if lo > 1 else 'slower'} in each of the {len(finite)} runs"

    return (
        f"carry / rounds speed: {finite_median(samples):.2f}x samples/s (runs {lo:.2f}-{hi:.2f}x), "
        f"{finite_median(tokens):.2f}x real tokens/s, median of {len(finite)} paired runs; {verdict}"
    )
