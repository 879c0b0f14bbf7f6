"""``energon-pack plan DATA --seq-length 4096 --ranks 8 --workers 4``: steps per epoch per rank on the VLM road.

The packs each rank's loader delivers in one pass of a prepared dataset or Metadataset, counted from headers
only (:func:`energon_pack.energon.plan.plan_epoch`: pre-encode and the packer, no pixel decode), for the
training run's width, buffer, ranks, workers, seed and balance; with ``--epochs`` the ``max_steps`` of an LR
schedule."""

from __future__ import annotations

import argparse
from typing import Any

from .common import PRESET_NAMES, require_prepared, resolve_tokenizer
from .options import (
    TOKENIZER_HELP,
    add_command,
    non_negative_int,
    positive_float,
    positive_int,
    spec_flags,
    spec_options,
)

NAME = "plan"
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {
    **spec_flags("seq_length", "balance", "seed"),
    "packing_buffer_size": "--buffer",
    "ranks": "--ranks",
    "accumulation": "--accumulation",
}


def encoder_options(p: argparse.ArgumentParser) -> None:
    """The Qwen-VL encoder the run trains with: width, balance, seed, preset, tokenizer, buffer, mode."""
    spec_options(p, "seq_length", "balance", "seed", notes={"seed": "; also the loader's WorkerConfig seed_offset"})
    p.add_argument("--preset", choices=PRESET_NAMES, default="qwen2.5-vl", help="Qwen-VL vision preset")
    p.add_argument("--tokenizer", default=None, help=TOKENIZER_HELP + "default: the --preset's real tokenizer")
    p.add_argument("--buffer", type=positive_int, default=64, help="packing_buffer_size K (samples per worker)")
    p.add_argument("--mode", choices=("carry", "rounds"), default="carry", help="packing_mode")


def encoder(args: argparse.Namespace) -> tuple[Any, str]:
    """(the Qwen-VL packing encoder the flags describe, the tokenizer's description)."""
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    tokenizer, described = resolve_tokenizer(args.tokenizer, default=args.preset)
    knobs = {"seq_length": args.seq_length, "seed": args.seed, "packing_mode": args.mode}
    if args.balance is not None:
        knobs["balance"] = args.balance
    return QwenVLPackingTaskEncoder(tokenizer=tokenizer, preset=args.preset, **knobs), described


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, NAME, "steps per epoch per rank of a dataset or blend, from headers only")
    p.add_argument("data", help="prepared Energon dataset or Metadataset YAML (what get_train_dataset is given)")
    encoder_options(p)
    p.add_argument("--ranks", type=positive_int, default=1, help="data-parallel ranks")
    p.add_argument("--workers", type=non_negative_int, default=2, help="loader workers per rank")
    p.add_argument("--epochs", type=positive_float, default=None, help="print max_steps for this many epochs")
    p.add_argument("--accumulation", type=positive_int, default=1, help="packs per optimizer step (with --epochs)")
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.bench.loader_bench import format_sources
    from energon_pack.energon.plan import plan_epoch

    te, described = encoder(args)
    data = require_prepared(args.data)
    print(
        f"data: {data}; preset: {args.preset}; tokenizer: {described}; seq_length {args.seq_length}, buffer "
        f"{args.buffer}, {args.ranks} rank(s) x {args.workers} worker(s), seed {args.seed}, mode {args.mode}",
        flush=True,
    )
    plan = plan_epoch(
        str(data), te, packing_buffer_size=args.buffer, ranks=args.ranks, workers=args.workers, seed=args.seed
    )
    print(f"{'rank':>6}{'packs':>9}")
    for rank, packs in enumerate(plan.packs_per_rank):
        print(f"{rank:>6}{packs:>9}")
    s = plan.summary()
    skips = ", ".join(f"{k}={v}" for k, v in s["skips"].items()) or "none"
    print(
        f"steps per epoch per rank: {plan.steps_per_epoch} (packs {s['packs']}, samples {s['samples']}, fill "
        f"{s['fill'] * 100:.2f}%, skips: {skips})"
    )
    if len(plan.stats.sources) > 1:
        print(format_sources(plan.stats.per_source()))
    if args.epochs is not None:
        print(
            f"max_steps for {args.epochs:g} epoch(s), {args.accumulation} pack(s) per step: "
            f"{plan.max_steps(args.epochs, args.accumulation)}"
        )
    return 0
