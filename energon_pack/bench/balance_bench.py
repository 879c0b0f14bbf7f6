"""Tokens-only vs compute-balanced packs, and what data parallelism makes of them: ``python -m
energon_pack.bench.balance_bench [--data PATH]``.

A data-parallel step waits for its slowest rank, so the spread of pack costs is lost time. The stream is either
the seeded bench mix (:data:`BENCH_MIXES`: ``llava_photos``, ``hires``, the mixes the packer's knobs are tuned on) or,
with ``--data``, an Energon-prepared dataset read through the real Qwen2.5-VL encoder's own ``preencode_sample``
(real tokenizer, image and video headers: each sample's aligned tokens and vision grids, :func:`read_samples`).
The stream is packed per mode: ``tokens`` (:class:`~energon_pack.packing.OnlinePacker`), ``default``
(:class:`~energon_pack.packing.balanced.ComputeBalancedPacker` pricing the preset's default shape, as
``balance="compute"`` does when the model is unknown) and each named ``cost_model`` (e.g. ``qwen2.5-vl-3b``, as a
user names it). Every pack is then priced by :func:`independent_pack_flops`, a FLOP count of Qwen2.5-VL-3B written
here from its published architecture, independent of :mod:`energon_pack.packing.step_cost` (which the packer
balances), and N ranks are simulated: each step every rank trains ``accum`` packs drawn from the stream's packs,
and the step lasts as long as the slowest rank's sum (bootstrap over ``draws`` steps, :func:`dp_efficiency`).
Printed per mode and buffer: fill, the packs' cost spread (cv), the DP efficiency (mean rank step / slowest rank
step) per rank count and the packer's time per sample; the JSON has every number. Packs built by the final flush
of the stream are left out (a training stream does not end there).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.bench.mixes import hires_mix, llava_photos
from energon_pack.bench.outputs import OUT_HELP, write_report
from energon_pack.packing import OnlinePacker
from energon_pack.packing.balanced import ComputeBalancedPacker
from energon_pack.packing.step_cost import DEFAULT_SHAPES, named_cost_model

DEFAULT_RANKS = (2, 4, 8, 64)
#: the packing modes: tokens only, the preset's default cost model, then each named cost model
DEFAULT_MODES = ("tokens", "default", "qwen2.5-vl-3b")
#: the seeded bench mixes the packer is tuned on
BENCH_MIXES = {"llava_photos": llava_photos, "hires": hires_mix}

#: Qwen2.5-VL-3B as published (its Hugging Face config.json): the LLM, the vision tower and its merger
QWEN25_VL_3B = {
    "layers": 36,
    "hidden": 2048,
    "heads": 16,
    "kv_heads": 2,
    "mlp": 11008,
    "vocab": 151936,
    "vit_layers": 32,
    "vit_hidden": 1280,
    "vit_mlp": 3420,
    "patch": 14,
    "temporal_patch": 2,
    "window_px": 112,
    "full_attention_layers": (7, 15, 23, 31),
    "merge": 2,
    "out_hidden": 2048,
}


def independent_pack_flops(segments: list[int], grids: list[tuple[int, int, int]], arch: dict = QWEN25_VL_3B) -> float:
    """Training FLOPs (forward + backward = 3x forward, 2 per multiply-add) of one pack: ``segments`` (LLM token
    lengths, each its own causal attention) and its images' / videos' (t, h, w) patch grids.

    Written from the architecture alone, not from :mod:`energon_pack.packing.step_cost`: LLM projections (grouped
    KV heads), gated MLP and LM head per token; causal attention per segment (half of ``L^2``); per patch the patch
    embedding, every ViT block's projections and gated MLP; ViT attention per ``t`` slice, bidirectional: the four
    full-attention blocks over the whole slice, the others within each window of ``window_px`` pixels (Qwen2.5-VL's
    window index: a grid of ``window_px / patch / merge`` merged tokens, the edge windows smaller); the 2x2 merger
    MLP per merged token."""
    a = arch
    d, head = a["hidden"], a["hidden"] // a["heads"]
    per_token = a["layers"] * (2 * d * d + 2 * d * a["kv_heads"] * head + 3 * d * a["mlp"]) + d * a["vocab"]
    tokens = sum(segments)
    attention = a["layers"] * sum(2 * d * n * n for n in segments)  # QK^T + AV, causal half: 2 * (2 L^2 d) / 2
    v, layers = a["vit_hidden"], a["vit_layers"]
    full = len(a["full_attention_layers"])
    per_patch = (
        3 * a["temporal_patch"] * a["patch"] ** 2 * v  # patch embedding
        + layers * (4 * v * v + 3 * v * a["vit_mlp"])  # qkv + proj, gated MLP
        + ((v * a["merge"] ** 2) ** 2 + v * a["merge"] ** 2 * a["out_hidden"]) / a["merge"] ** 2  # merger per patch
    )
    patches = vit_attention = 0.0
    side = a["window_px"] // a["patch"] // a["merge"]  # a window's side in merged tokens
    for t, h, w in grids:
        patches += t * h * w
        mh, mw = h // a["merge"], w // a["merge"]
        window_sq = sum(
            (min(side, mh - i) * min(side, mw - j) * a["merge"] ** 2) ** 2
            for i in range(0, mh, side)
            for j in range(0, mw, side)
        )
        vit_attention += t * 4 * v * (full * (h * w) ** 2 + (layers - full) * window_sq)
    return 3.0 * (2.0 * (per_token * tokens + per_patch * patches) + attention + vit_attention)


def read_samples(
    path: str | Path, *, width: int, preset: str = "qwen2.5-vl", tokenizer: Any = None, limit: int | None = None
) -> list:
    """Each sample of an Energon-prepared dataset (the first ``limit``, default all) as the real encoder
    pre-encodes it: (aligned tokens, the (t, h, w) grids of its images and videos), in the order of one worker's
    stream; skipped samples are left out."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset, stateless

    from energon_pack.chat.tokenizer import load_tokenizer
    from energon_pack.energon.samples import PackCandidate
    from energon_pack.qwen_vl import vision as V
    from energon_pack.qwen_vl.chat import video_grid
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    class SampleReader(QwenVLPackingTaskEncoder):
        @stateless
        def postencode_sample(self, sample: Any) -> Any:
            return sample

        @stateless
        def batch(self, samples: list) -> list:
            out = []
            for s in (s for s in samples if isinstance(s, PackCandidate)):
                grids = [V.image_grid_thw(m.height, m.width, self.preset) for m in s.payload["image_metas"]]
                grids += [video_grid(m, self.preset, self.chat) for m in s.payload["video_metas"]]
                out.append((int(s.cost[0]), [tuple(int(x) for x in g) for g in grids]))
            return out

    encoder = SampleReader(tokenizer=tokenizer or load_tokenizer(preset), preset=preset, seq_length=width)
    dataset = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=encoder,
        repeat=False,
    )
    rows: list = []
    for batch in get_loader(dataset):
        rows.extend(batch)
        if limit is not None and len(rows) >= limit:
            break
    return rows[:limit]


def dp_efficiency(pack_costs: np.ndarray, ranks: int, accum: int = 1, draws: int = 20000, seed: int = 0) -> float:
    """Mean rank step over the slowest rank's step, each rank training ``accum`` packs drawn at random."""
    rng = np.random.default_rng(seed)
    steps = np.asarray(pack_costs)[rng.integers(0, len(pack_costs), (draws, ranks, accum))].sum(-1)
    return float(steps.mean() / steps.max(1).mean())


def packer_cost_model(mode: str, preset: str = "qwen2.5"):
    """The step-cost model a mode's packer balances (None for ``tokens``)."""
    if mode == "tokens":
        return None
    return named_cost_model(DEFAULT_SHAPES[preset] if mode == "default" else mode)


def run_mode(mode: str, samples: list, width: int, buffer: int, ranks, accum: int, pack_price=None) -> dict:
    """Pack ``samples`` ((tokens, grids) each) with one mode and buffer; fill, the spread of the packs' prices
    (``pack_price(segments, grids)``, default :func:`independent_pack_flops`) and DP efficiency per rank count."""
    pack_price = pack_price or independent_pack_flops
    model = packer_cost_model(mode)
    if model is None:
        packer: Any = OnlinePacker((width,), max_buffered=buffer)
        push = lambda i, tokens, grids: packer.push(i, (tokens,))  # noqa: E731
    else:
        packer = ComputeBalancedPacker(width, buffer_size=buffer)
        costs = [model.sample_cost(t, g) for t, g in samples]  # the encoder prices each sample before the buffer
        push = lambda i, tokens, grids: packer.push(i, tokens, costs[i])  # noqa: E731
    packs: list[list[int]] = []
    start = time.perf_counter()
    for i, (tokens, grids) in enumerate(samples):
        packs.extend(push(i, tokens, grids))  # the final flush is left out
    seconds = time.perf_counter() - start
    pack_tokens = np.asarray([sum(samples[i][0] for i in p) for p in packs])
    pack_costs = np.asarray(
        [pack_price([samples[i][0] for i in p], [g for i in p for g in samples[i][1]]) for p in packs]
    )
    return {
        "mode": mode,
        "cost_model": None if model is None else model.source,
        "buffer": buffer,
        "packs": len(packs),
        "fill": float(pack_tokens.sum() / (len(packs) * width)),
        "cost_cv": float(pack_costs.std() / pack_costs.mean()),
        "dp_efficiency": {str(n): dp_efficiency(pack_costs, n, accum) for n in ranks},
        "us_per_sample": seconds / len(samples) * 1e6,
        "pack_costs": [float(f"{c:.6g}") for c in pack_costs],
    }


def packer_speed(samples: list, width: int, buffer: int, cost_model: str = "qwen2.5-vl-3b", repeats: int = 3) -> dict:
    """Microseconds per pushed sample of the balanced packer with and without its polish pass (``polish_moves=0``:
    the packer of state format 1), run alternately, the best of ``repeats`` each (the machine may be shared)."""
    model = named_cost_model(cost_model)
    costs = [model.sample_cost(t, g) for t, g in samples]
    best = {"greedy_only": float("inf"), "polished": float("inf")}
    for _ in range(repeats):
        for name, moves in (("greedy_only", 0), ("polished", None)):
            packer = ComputeBalancedPacker(width, buffer_size=buffer, **({} if moves is None else {"polish_moves": 0}))
            start = time.perf_counter()
            for i, (tokens, _) in enumerate(samples):
                packer.push(i, tokens, costs[i])
            best[name] = min(best[name], (time.perf_counter() - start) / len(samples) * 1e6)
    return {"buffer": buffer, "cost_model": model.source, **{f"us_per_sample_{k}": v for k, v in best.items()}}


def bench_balance(
    *,
    data: tuple[str, ...] = (),
    bench_mixes: tuple[str, ...] = ("llava_photos",),
    samples: int = 12000,
    width: int = 8192,
    modes: tuple[str, ...] = DEFAULT_MODES,
    buffers: tuple[int, ...] = (64, 256),
    ranks: tuple[int, ...] = DEFAULT_RANKS,
    accum: int = 1,
    seed: int = 1,
) -> dict[str, Any]:
    """The modes x buffers table of each mix: every sample of each ``data`` path, or (none given) the
    ``bench_mixes`` (:data:`BENCH_MIXES`) of ``samples`` samples and ``seed``."""
    mixes = {str(p): read_samples(p, width=width) for p in data} or {
        name: BENCH_MIXES[name](samples, width, seed) for name in bench_mixes
    }
    rows = [
        {"mix": name, **run_mode(mode, mix, width, k, ranks, accum)}
        for name, mix in mixes.items()
        for k in buffers
        for mode in modes
    ]
    speed = [{"mix": name, **packer_speed(mix, width, k)} for name, mix in mixes.items() for k in buffers]
    return {
        "mixes": {
            name: {"samples": len(mix), "media_samples": sum(1 for _, g in mix if g)} for name, mix in mixes.items()
        },
        "width": width,
        "seed": None if data else seed,
        "accum": accum,
        "priced_by": "independent_pack_flops: Qwen2.5-VL-3B from its published architecture (balance_bench.py)",
        "rows": rows,
        "speed": speed,
    }


def format_table(result: dict[str, Any]) -> str:
    ranks = list(result["rows"][0]["dp_efficiency"])
    head = f"{'mode':<15}{'K':>5}{'fill':>9}{'cost cv':>9}" + "".join(f"{'DP-' + n:>8}" for n in ranks)
    lines = [f"width {result['width']}, priced by {result['priced_by']}, accum {result['accum']}"]
    for name, mix in result["mixes"].items():
        lines += [f"{name} x {mix['samples']} ({mix['media_samples']} with media)", head + f"{'us/sample':>11}"]
        for r in (r for r in result["rows"] if r["mix"] == name):
            effs = "".join(f"{r['dp_efficiency'][n]:8.3f}" for n in ranks)
            lines.append(
                f"{r['mode']:<15}{r['buffer']:>5}{r['fill'] * 100:8.2f}%{r['cost_cv'] * 100:8.2f}%{effs}"
                f"{r['us_per_sample']:11.1f}"
            )
        for r in (r for r in result["speed"] if r["mix"] == name):
            lines.append(
                f"packer speed K={r['buffer']}: {r['us_per_sample_polished']:.1f} us/sample "
                f"(greedy pass only: {r['us_per_sample_greedy_only']:.1f})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m energon_pack.bench.balance_bench", description=__doc__)
    p.add_argument(
        "--data", action="append", default=[], help="an Energon-prepared dataset, repeatable (default: the bench mix)"
    )
    p.add_argument("--mixes", default="llava_photos", help=f"bench mixes without --data: {', '.join(BENCH_MIXES)}")
    p.add_argument("--samples", type=int, default=12000, help="samples of each bench mix")
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help="tokens, default and cost-model names")
    p.add_argument("--buffers", default="64,256", help="comma-separated buffer sizes")
    p.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)), help="comma-separated rank counts")
    p.add_argument("--accum", type=int, default=1, help="packs per rank per step (gradient accumulation)")
    p.add_argument("--seed", type=int, default=1, help="seed of the bench mix")
    p.add_argument("--out", default="bench_results/balance.json", help=OUT_HELP)
    args = p.parse_args(argv)
    result = bench_balance(
        data=tuple(args.data),
        bench_mixes=tuple(args.mixes.split(",")),
        samples=args.samples,
        width=args.width,
        modes=tuple(args.modes.split(",")),
        buffers=tuple(int(x) for x in args.buffers.split(",")),
        ranks=tuple(int(x) for x in args.ranks.split(",")),
        accum=args.accum,
        seed=args.seed,
    )
    result["command"] = shlex.join(["python", "-m", "energon_pack.bench.balance_bench", *(argv or sys.argv[1:])])
    print(format_table(result))
    print("\n" + write_report(Path(args.out), result))
    return result


if __name__ == "__main__":  # pragma: no cover
    main()
