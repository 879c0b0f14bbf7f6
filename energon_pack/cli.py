"""The ``energon-pack`` command line: demo, data preparation, benchmarks, JSONL inspection, stress report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEMO_DIR = "demo_data"


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="energon-pack", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="make demo shards if absent, stream packed batches (carry vs rounds), report")
    demo.add_argument("--data", default=DEMO_DIR, help="demo dataset folder (created when absent)")
    demo.add_argument("--samples", type=int, default=1200, help="demo samples to write when creating it")
    demo.add_argument("--buffer", type=int, default=64, help="packing_buffer_size K (samples per worker)")
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--packs", type=int, default=150, help="packs to stream per mode")
    demo.add_argument("--width", type=int, default=8192)
    demo.add_argument("--out", default="bench_results/demo.json")

    make = sub.add_parser("make-demo", help="write demo ChatML WebDataset shards and prepare them for Energon")
    make.add_argument("dir")
    make.add_argument("--samples", type=int, default=1200)
    make.add_argument("--seed", type=int, default=0)

    prep = sub.add_parser("prepare", help="energon prepare, non-interactive: a folder of *.tar shards or a .jsonl file")
    prep.add_argument("dir", help="shard folder (indexed as a CrudeWebdataset) or a .jsonl file")
    prep.add_argument("--split", type=_floats, default=(1.0, 0.0, 0.0), help="train,val,test shard ratio")

    bench = sub.add_parser("bench", help="sweep packing_buffer_size for carry and rounds on an Energon dataset")
    bench.add_argument("--data", default=DEMO_DIR)
    bench.add_argument("--buffers", type=_ints, default=(1, 4, 8, 16, 32, 64, 128, 256))
    bench.add_argument("--modes", default="carry,rounds")
    bench.add_argument("--workers", type=int, default=2)
    bench.add_argument("--packs", type=int, default=200, help="packs per cell (0 = one full epoch)")
    bench.add_argument("--width", type=int, default=8192)
    bench.add_argument("--out-dir", default="bench_results")
    bench.add_argument("--no-plots", action="store_true")

    bp = sub.add_parser("bench-packing", help="fill and us/sample of OnlinePacker vs round FFD on synthetic mixes")
    bp.add_argument("--samples", type=int, default=20000)
    bp.add_argument("--buffers", type=_ints, default=None, help="comma-separated buffer sizes K")
    bp.add_argument("--widths", type=_ints, default=None, help="comma-separated pack widths")
    bp.add_argument("--seed", type=int, default=0)
    bp.add_argument("--out", default="bench_results/packing.json")

    ins = sub.add_parser("inspect", help="counts, length percentiles, skips by reason and packing fill of a JSONL file")
    ins.add_argument("path")
    ins.add_argument("--format", default="prompt_completion", choices=["prompt_completion", "chat"])
    ins.add_argument("--tokenizer", default=None, help="demo (default), a tokenizer.json, or a local HF folder")
    ins.add_argument("--width", type=int, default=4096)
    ins.add_argument("--pad-multiple", type=int, default=1)
    ins.add_argument("--max-length", type=int, default=None)
    ins.add_argument("--prompt-field", default=None)
    ins.add_argument("--completion-field", default=None)
    ins.add_argument("--json-out", default=None)

    st = sub.add_parser("stress", help="reliability report: resume sweep, coverage, fuzz, memory (exit 1 on a missed target)")
    st.add_argument("--full", action="store_true", help="full scale (>= 200 resume cut points, every layout)")
    st.add_argument("--out", default="bench_results/stress")

    bs = sub.add_parser("bench-sft", help="JSONL index build vs wc -l, lazy getitem samples/s, in-batch fill")
    bs.add_argument("--size-mb", type=int, default=1024)
    bs.add_argument("--out", default="bench_results/sft.json")
    return parser


def ensure_demo_data(path: str | Path, samples: int) -> Path:
    path = Path(path)
    if not (path / ".nv-meta" / "dataset.yaml").exists():
        from energon_pack.energon.demo_data import make_demo_shards

        print(f"writing {samples} demo samples to {path}/ ...", flush=True)
        make_demo_shards(path, samples)
    return path


def run_demo(args: argparse.Namespace) -> int:
    from energon_pack.bench.loader_bench import cells_to_json, format_cells, run_cell

    data = ensure_demo_data(args.data, args.samples)
    cells = [
        run_cell(data, mode=mode, buffer=args.buffer, workers=args.workers, packs=args.packs,
                 seq_length=args.width, progress=True)
        for mode in ("carry", "rounds")
    ]
    print(f"\nQwen2.5-VL packing on {data} (width {args.width}, packing_buffer_size {args.buffer}, "
          f"{args.workers} workers, {args.packs} packs per mode)\n")
    print(format_cells(cells))
    carry, rounds = cells
    print(
        f"\ncarry (ours): {carry.fill * 100:.2f}% fill, {carry.samples_per_pack:.1f} samples/pack, "
        f"{carry.slots - carry.real_tokens} pad tokens in {carry.packs} packs\n"
        f"rounds (Energon's PackingDataset + FFD): {rounds.fill * 100:.2f}% fill, "
        f"{rounds.samples_per_pack:.1f} samples/pack, {rounds.slots - rounds.real_tokens} pad tokens in {rounds.packs} packs"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dataset": str(data), "cells": cells_to_json(cells)}, indent=2))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        return run_demo(args)
    if args.command == "make-demo":
        from energon_pack.energon.demo_data import make_demo_shards

        make_demo_shards(args.dir, args.samples, seed=args.seed)
        print(f"wrote {args.samples} samples to {args.dir}")
        return 0
    if args.command == "prepare":
        from energon_pack.energon.prepare import prepare

        count = prepare(args.dir, split=tuple(args.split))
        print(f"prepared {args.dir}: {count} samples")
        return 0
    if args.command == "bench":
        from energon_pack.bench import buffer_sweep

        result = buffer_sweep.main(
            ensure_demo_data(args.data, 1200), args.out_dir, plots=not args.no_plots, buffers=args.buffers,
            modes=tuple(args.modes.split(",")), workers=args.workers, packs=args.packs or None, seq_length=args.width,
        )
        return 0 if all(t["met"] for t in result["targets"]) else 1
    if args.command == "bench-packing":
        from energon_pack.bench import packing_bench

        kw = {"samples": args.samples, "seed": args.seed}
        if args.buffers:
            kw["buffers"] = args.buffers
        if args.widths:
            kw["widths"] = args.widths
        result = packing_bench.main(args.out, **kw)
        return 0 if all(t["met"] for t in result["targets"]) else 1
    if args.command == "inspect":
        from energon_pack.sft.inspect import main as inspect_main

        fields = {"prompt_field": args.prompt_field, "completion_field": args.completion_field}
        return inspect_main(args.path, format=args.format, tokenizer=args.tokenizer, width=args.width,
                            pad_multiple=args.pad_multiple, max_length=args.max_length, json_out=args.json_out,
                            **{k: v for k, v in fields.items() if v})
    if args.command == "stress":
        from energon_pack.bench.stress_report import main as stress_main

        return stress_main((["--full"] if args.full else []) + ["--out", args.out])
    if args.command == "bench-sft":
        from energon_pack.bench import sft_bench

        return 0 if all(t["met"] for t in sft_bench.main(args.out, size_mb=args.size_mb)["targets"]) else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
