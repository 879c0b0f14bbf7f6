"""``energon-pack plan-blend mix.yaml --target-shares a=0.5,b=0.3,c=0.2 [--by tokens|compute] --out planned.yaml``.

The Metadataset blend weights that give each source its target share of the packed tokens (or of the step
cost), measured on the first ``--samples`` samples of each source from headers only
(:func:`energon_pack.energon.blend.plan_blend_weights`), written as a Metadataset with the new weights, then
checked on ``--check-samples`` samples of the planned blend: the shares reached against the targets."""

from __future__ import annotations

import argparse
from typing import Any

from .common import require_prepared
from .options import add_command, non_negative_int, positive_int, spec_flags
from .plan import encoder, encoder_options

NAME = "plan-blend"
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {
    **spec_flags("seq_length", "balance", "seed"),
    "packing_buffer_size": "--buffer",
    "target_shares": "--target-shares",
    "by": "--by",
    "metadataset": "METADATASET",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, NAME, "blend weights that reach target token (or compute) shares per source")
    p.add_argument("metadataset", help="a Metadataset YAML whose splits.train.blend lists the sources")
    p.add_argument("--target-shares", required=True, help="name=share per source, summing to 1: a=0.5,b=0.3,c=0.2")
    p.add_argument("--by", choices=("tokens", "compute"), default="tokens", help="shares of packed tokens or step cost")
    p.add_argument("--out", required=True, help="the Metadataset YAML to write with the planned weights")
    p.add_argument("--samples", type=positive_int, default=1000, help="samples measured per source")
    p.add_argument(
        "--check-samples", type=non_negative_int, default=4000, help="samples of the planned blend checked (0: none)"
    )
    encoder_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.energon.blend import check_blend_shares, parse_shares, plan_blend_weights, write_blend

    targets = parse_shares(args.target_shares)
    te, described = encoder(args)
    data = require_prepared(args.metadataset)
    print(f"blend: {data}; preset: {args.preset}; tokenizer: {described}; by {args.by}", flush=True)
    kw = {"packing_buffer_size": args.buffer, "seed": args.seed}
    plan = plan_blend_weights(data, te, targets, by=args.by, samples=args.samples, **kw)
    print(f"{'source':<16}{'drawn':>7}{'tok/sample':>12}{'cost/sample':>13}{'target':>8}{'weight':>9}")
    for name, m in plan.measured.items():
        print(
            f"{name[:15]:<16}{m['drawn']:>7}{m['tokens']:>12.1f}{m['compute']:>13.1f}{targets[name] * 100:>7.1f}%"
            f"{plan.weights[name]:>9.4f}"
        )
    out = write_blend(data, plan.weights, args.out)
    print(f"wrote {out}")
    if args.check_samples:
        stats = check_blend_shares(out, te, samples=args.check_samples, **kw)
        share = "token_share" if args.by == "tokens" else "cost_share"
        per_source = stats.per_source()
        worst = max(abs((per_source.get(n, {}).get(share) or 0.0) - t) for n, t in targets.items())
        print(f"checked on {stats.samples + stats.skipped} samples of the planned blend ({args.by} shares):")
        for name, target in targets.items():
            got = per_source.get(name, {}).get(share) or 0.0
            print(f"  {name:<16}target {target * 100:5.1f}%  reached {got * 100:5.1f}%")
        print(f"largest difference: {worst * 100:.1f} points")
    return 0
