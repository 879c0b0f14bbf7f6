"""``energon-pack bench``: sweep ``packing_buffer_size`` K for carry and rounds on a prepared dataset
(or recommend ``max_patches_per_pack`` with ``--visual-budget``)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import DEMO_DIR, PRESET_NAMES, CliError, require_prepared, resolve_tokenizer, targets_exit
from .options import (
    OBJECT_WAIT_FLAGS,
    TOKENIZER_HELP,
    add_command,
    ints,
    non_negative_int,
    object_read_options,
    positive_int,
    spec_flags,
    spec_options,
)

NAME = "bench"
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {**spec_flags("seq_length", "cost_model"), "packing_buffer_size": "--buffers", **OBJECT_WAIT_FLAGS}


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in ("carry", "rounds")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: modes are carry and/or rounds, e.g. carry,rounds")
    return modes


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, NAME, "sweep packing_buffer_size K for carry and rounds on a prepared Energon dataset")
    p.add_argument(
        "--data",
        default=DEMO_DIR,
        help="prepared Energon dataset (energon-pack convert / prepare / make-demo); never written to",
    )
    p.add_argument(
        "--buffers",
        type=ints,
        default=(1, 4, 8, 16, 32, 64, 128, 256),
        help="comma-separated packing_buffer_size values K",
    )
    p.add_argument(
        "--modes", type=_modes, default=("carry", "rounds"), help="packing modes: carry (ours), rounds (Energon's)"
    )
    p.add_argument("--workers", type=non_negative_int, default=2, help="loader worker processes (0: in this process)")
    p.add_argument("--packs", type=non_negative_int, default=200, help="packs per cell (0 = one full epoch)")
    spec_options(p, "seq_length")
    p.add_argument("--preset", choices=PRESET_NAMES, default="qwen2.5-vl", help="Qwen-VL vision preset")
    p.add_argument("--tokenizer", default=None, help=TOKENIZER_HELP + "default: the --preset's real tokenizer")
    p.add_argument(
        "--out-dir",
        default="bench_results",
        help="folder for buffer_sizes.json/.md and buffer_*.png (visual_budget.json with --visual-budget), "
        "created at the first write; an earlier run's files there are kept, renamed with their time",
    )
    p.add_argument(
        "--visual-budget",
        action="store_true",
        help="instead of the K sweep: recommend max_patches_per_pack for static_visual packs (fill within "
        "0.5 points of packs without a patch budget), at --seq-length and the largest --buffers K",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--loader-cells",
        action="store_true",
        help="with --data: run every (mode, K) cell through the loader, pixels decoded (speed, latency and memory "
        "per K; a cell per K, so tens of minutes on a large set) instead of replaying the costs of one pre-encode "
        "pass through each K's packer and timing one loader cell at the recommended K",
    )
    p.add_argument(
        "--ranks",
        type=positive_int,
        default=None,
        help="instead of the K sweep: stream this many data-parallel ranks' loaders (tokens-only and "
        "balance=compute packs, at the largest --buffers K) and print the predicted DP efficiency",
    )
    p.add_argument("--accum", type=positive_int, default=1, help="with --ranks: packs per rank per step")
    p.add_argument("--steps", type=positive_int, default=40, help="with --ranks: simulated steps")
    spec_options(p, "cost_model", notes={"cost_model": " (with --ranks)"})
    object_read_options(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when one of the project's own benchmark targets is missed (they are printed as "
        "information otherwise)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.bench import buffer_sweep
    from energon_pack.bench.targets import format_target

    # the tokenizer first: a bad knob is named before the data is looked at
    tokenizer, described = resolve_tokenizer(args.tokenizer, default=args.preset)
    data = require_prepared(args.data)
    print(f"data: {data}; preset: {args.preset}; tokenizer: {described}", flush=True)
    if args.ranks is not None:
        return _simulate(args, data, tokenizer)
    if args.visual_budget:
        from energon_pack.bench import visual_budget

        visual_budget.main(
            str(data),
            args.out_dir,
            width=args.seq_length,
            buffer=max(args.buffers),
            preset=args.preset,
            tokenizer=tokenizer,
        )
        return 0
    # the project's targets are about its demo data: on a user's dataset the table and the numbers only, and the
    # cells replayed from one pre-encode pass (minutes, not a loader run per cell)
    demo = str(args.data) == DEMO_DIR
    if args.check and not demo:
        raise CliError("--check judges the project's own targets on its demo data: drop --check with --data")
    result = buffer_sweep.main(
        data,
        args.out_dir,
        plots=not args.no_plots,
        replay=not demo and not args.loader_cells,
        project_targets=demo,
        buffers=args.buffers,
        modes=args.modes,
        workers=args.workers,
        packs=args.packs or None,
        seq_length=args.seq_length,
        preset=args.preset,
        tokenizer=tokenizer,
        tokenizer_name=described,
    )
    _print_sources([*result["cells"], *filter(None, [result.get("loader_cell")])])
    return targets_exit(result["targets"], args.check, format_target)


def _print_sources(cells: list[dict]) -> None:
    """Per source of a blend (--data a Metadataset): the tokens, shares and skips of the largest K's cell that
    counted sources."""
    from energon_pack.bench.loader_bench import cell_sources, format_sources

    blended = [c for c in cells if len(c.get("sources") or {}) > 1]  # cells that streamed the loader
    cell = max(blended, key=lambda c: (c["buffer"], c["mode"] == "carry"), default=None)
    if cell is not None:
        print(f"\nper source ({cell['mode']}, K={cell['buffer']}):")
        print(format_sources(cell_sources(cell["slots"], cell["sources"])))


def _simulate(args: argparse.Namespace, data: Any, tokenizer: Any) -> int:
    """``--ranks``: the data-parallel simulation over real loaders; its JSON in --out-dir."""
    from energon_pack.bench import dp_sim
    from energon_pack.bench.outputs import RunFiles

    result = dp_sim.simulate(
        data,
        ranks=args.ranks,
        accum=args.accum,
        steps=args.steps,
        buffer=max(args.buffers),
        workers=args.workers,
        seq_length=args.seq_length,
        preset=args.preset,
        tokenizer=tokenizer,
        cost_model=args.cost_model,
    )
    print(dp_sim.format_table(result))
    files = RunFiles(args.out_dir, ["dp_sim.json"])
    files.write_json("dp_sim.json", result)
    print(files.announce())
    return 0
