"""The ``energon-pack`` command line."""

from __future__ import annotations

import argparse
import sys


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="energon-pack", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench-packing", help="fill and us/sample of OnlinePacker vs round FFD on synthetic mixes")
    bench.add_argument("--samples", type=int, default=20000)
    bench.add_argument("--buffers", type=_ints, default=None, help="comma-separated buffer sizes K")
    bench.add_argument("--widths", type=_ints, default=None, help="comma-separated pack widths")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", default="bench_results/packing.json")

    demo = sub.add_parser("demo", help="the main job on built-in demo data (today: the packing benchmark)")
    demo.add_argument("--samples", type=int, default=20000)
    demo.add_argument("--out", default="bench_results/demo_packing.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("bench-packing", "demo"):
        from energon_pack.bench import packing_bench

        kw = {"samples": args.samples}
        if getattr(args, "buffers", None):
            kw["buffers"] = args.buffers
        if getattr(args, "widths", None):
            kw["widths"] = args.widths
        if getattr(args, "seed", None) is not None:
            kw["seed"] = args.seed
        result = packing_bench.main(args.out, **kw)
        return 0 if all(t["met"] for t in result["targets"]) or args.command == "demo" else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
