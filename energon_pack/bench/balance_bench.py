"""Tokens-only vs compute-balanced packs, and what data parallelism makes of them: ``python -m
energon_pack.bench.balance_bench``.

A data-parallel step waits for its slowest rank, so the spread of pack costs is lost time. On a held-out-like
VLM mix (:func:`~energon_pack.bench.mixes.llava_photos`) priced by a step-cost model
(:class:`~energon_pack.packing.step_cost.StepCostModel`, FLOP-derived for a model shape) this packs the same
stream with the tokens-only :class:`~energon_pack.packing.OnlinePacker` and with
:class:`~energon_pack.packing.balanced.ComputeBalancedPacker`, and simulates N ranks: each step every rank
trains ``accum`` packs drawn from the stream's packs, and the step lasts as long as the slowest rank's sum
(bootstrap over ``draws`` steps). Printed per mode and buffer: fill, the packs' cost spread (cv) and the
predicted DP efficiency (mean rank step / slowest rank step) for each rank count; the JSON has every number.
Packs built by the final flush of the stream are left out (a training stream does not end there).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.bench.mixes import llava_photos
from energon_pack.bench.outputs import OUT_HELP, write_report
from energon_pack.packing import OnlinePacker
from energon_pack.packing.balanced import ComputeBalancedPacker
from energon_pack.packing.step_cost import SHAPES, StepCostModel

DEFAULT_RANKS = (2, 4, 8, 64)


def dp_efficiency(pack_costs: np.ndarray, ranks: int, accum: int = 1, draws: int = 20000, seed: int = 0) -> float:
    """Mean rank step over the slowest rank's step, each rank training ``accum`` packs drawn at random."""
    rng = np.random.default_rng(seed)
    steps = np.asarray(pack_costs)[rng.integers(0, len(pack_costs), (draws, ranks, accum))].sum(-1)
    return float(steps.mean() / steps.max(1).mean())


def _stream_packs(packer: Any, samples: list, costs: np.ndarray, balanced: bool) -> list[list[int]]:
    packs: list[list[int]] = []
    for i, (tokens, _) in enumerate(samples):
        packs.extend(packer.push(i, tokens, costs[i]) if balanced else packer.push(i, (tokens,)))
    return packs  # the final flush is left out


def run_mode(mode: str, samples: list, costs: np.ndarray, width: int, buffer: int, ranks, accum: int) -> dict:
    """Pack ``samples`` with one mode and buffer; fill, cost spread and DP efficiency per rank count."""
    start = time.perf_counter()
    if mode == "compute":
        packer: Any = ComputeBalancedPacker(width, buffer_size=buffer)
    else:
        packer = OnlinePacker((width,), max_buffered=buffer)
    packs = _stream_packs(packer, samples, costs, mode == "compute")
    seconds = time.perf_counter() - start
    tokens = np.asarray([s[0] for s in samples])
    pack_tokens = np.asarray([tokens[p].sum() for p in packs])
    pack_costs = np.asarray([costs[p].sum() for p in packs])
    return {
        "mode": mode,
        "buffer": buffer,
        "packs": len(packs),
        "fill": float(pack_tokens.sum() / (len(packs) * width)),
        "cost_cv": float(pack_costs.std() / pack_costs.mean()),
        "dp_efficiency": {str(n): dp_efficiency(pack_costs, n, accum) for n in ranks},
        "us_per_sample": seconds / len(samples) * 1e6,
        "pack_costs": [round(float(c), 1) for c in pack_costs],
    }


def bench_balance(
    *,
    samples: int = 12000,
    width: int = 8192,
    shape: str = "qwen2.5-vl-3b",
    buffers: tuple[int, ...] = (64, 256),
    ranks: tuple[int, ...] = DEFAULT_RANKS,
    accum: int = 1,
    seed: int = 1,
) -> dict[str, Any]:
    model = StepCostModel.from_shape(shape)
    mix = llava_photos(samples, width, seed)
    costs = np.asarray([model.sample_cost(t, g) for t, g in mix])
    rows = [run_mode(mode, mix, costs, width, k, ranks, accum) for k in buffers for mode in ("tokens", "compute")]
    return {
        "mix": "llava_photos",
        "samples": samples,
        "width": width,
        "seed": seed,
        "accum": accum,
        "cost_model": model.as_dict(),
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    ranks = list(result["rows"][0]["dp_efficiency"])
    head = f"{'mode':<9}{'K':>5}{'fill':>9}{'cost cv':>9}" + "".join(f"{'DP-' + n:>8}" for n in ranks)
    lines = [
        f"{result['mix']} x {result['samples']}, width {result['width']}, cost model "
        f"{result['cost_model']['source']}, accum {result['accum']}",
        head + f"{'us/sample':>11}",
    ]
    for r in result["rows"]:
        effs = "".join(f"{r['dp_efficiency'][n]:8.3f}" for n in ranks)
        lines.append(
            f"{r['mode']:<9}{r['buffer']:>5}{r['fill'] * 100:8.2f}%{r['cost_cv'] * 100:8.2f}%{effs}"
            f"{r['us_per_sample']:11.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m energon_pack.bench.balance_bench", description=__doc__)
    p.add_argument("--samples", type=int, default=12000)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-vl-3b")
    p.add_argument("--buffers", default="64,256", help="comma-separated buffer sizes")
    p.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)), help="comma-separated rank counts")
    p.add_argument("--accum", type=int, default=1, help="packs per rank per step (gradient accumulation)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="bench_results/balance.json", help=OUT_HELP)
    args = p.parse_args(argv)
    result = bench_balance(
        samples=args.samples,
        width=args.width,
        shape=args.shape,
        buffers=tuple(int(x) for x in args.buffers.split(",")),
        ranks=tuple(int(x) for x in args.ranks.split(",")),
        accum=args.accum,
        seed=args.seed,
    )
    print(format_table(result))
    print("\n" + write_report(Path(args.out), result))
    return result


if __name__ == "__main__":  # pragma: no cover
    main()
