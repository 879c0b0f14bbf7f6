"""Measure what packs cost a GPU step, fit the step-cost model, and compare tokens-only with compute-balanced packs.

Two steps, so the GPU machine needs neither Energon nor the data:

1. ``packs`` (any machine with the loader): writes LLaVA-style records with photos at their own size
   (:func:`energon_pack.bench.mixes.llava_photos`), converts them, and takes ``--packs`` packs of each balance
   mode from the real loader (Qwen2.5-VL tokenizer, ``--width``). The packs are saved without their pixel
   values (random pixels of the same shape are made on the GPU: the step time does not depend on them).
2. ``fit`` (one GPU): a random-initialised Qwen2.5-VL of the ``--size`` shape trains on the saved packs, both
   modes interleaved pack by pack (no order effect), forward + backward + AdamW per step, timed with CUDA
   events after a warm-up. Printed: per mode the median step, the step-time cv and the bootstrap DP-8 /
   DP-64 efficiency of those times; the fit of step time to the cost terms (R^2, residual spread) and how
   well the FLOP-derived model alone predicts it.

    python examples/step_cost_fit.py packs --out .calib/packs.pt
    python examples/step_cost_fit.py fit --packs .calib/packs.pt --size 3b --out bench_results/step_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
MODES = ("tokens", "compute")
#: the keys of a saved pack that are not tensors of the row
PIXEL_KEYS = ("pixel_values", "pixel_values_videos")
#: the tokenizer's ids the model config needs (saved with the packs: the GPU machine needs no tokenizer)
SPECIAL_IDS = ("image_pad", "video_pad", "vision_start", "vision_end", "im_end", "pad")


# --------------------------------------------------------------------------------- step 1: packs
def write_records(root: Path, n: int, width: int, seed: int) -> Path:
    """``n`` LLaVA-style records (photos as JPEG files, words for text) following the bench mix."""
    from PIL import Image

    from energon_pack.bench.mixes import llava_photos

    rng = np.random.default_rng(seed)
    words = ["the", "photo", "shows", "a", "small", "red", "house", "near", "river", "with", "two", "people"]
    records = []
    for i, (tokens, grids) in enumerate(llava_photos(n, width, seed)):
        text_tokens = max(8, tokens - sum(h * w // 4 for _, h, w in grids))
        images = []
        for j, (_, h, w) in enumerate(grids):
            name = f"img{i}_{j}.jpg"
            pixels = rng.integers(0, 256, (h * 14 // 8, w * 14 // 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).resize((w * 14, h * 14)).save(root / name, quality=80)
            images.append(name)
        answer = " ".join(rng.choice(words, max(1, int(text_tokens * 0.7))))
        question = "<image>\n" * len(images) + "Describe it."
        record = {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]}
        if images:
            record["images"] = images
        records.append(record)
    (root / "records.json").write_text(json.dumps(records))
    return root / "records.json"


def save_packs(args: argparse.Namespace) -> None:
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack import QWEN_VL_VOCAB_ROWS, QwenVLPackingTaskEncoder
    from energon_pack.cli.convert import convert

    scratch = Path(tempfile.mkdtemp(prefix="step_cost_"))
    source = write_records(scratch, args.samples, args.width, args.seed)
    convert(source, scratch / "shards", progress=False, workers=args.workers)
    saved: dict[str, Any] = {"width": args.width, "cost_model": args.cost_model, "modes": {}}
    for mode in MODES:
        encoder = QwenVLPackingTaskEncoder(
            tokenizer="qwen2.5-vl", seq_length=args.width, balance=mode, cost_model=args.cost_model
        )
        ds = get_train_dataset(
            str(scratch / "shards"),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers),
            task_encoder=encoder,
            packing_buffer_size=args.buffer,
            repeat=True,
        )
        it = iter(get_loader(ds))
        packs = []
        for _ in range(args.packs):
            batch = next(it)
            packs.append(_slim(batch, encoder))
        saved["modes"][mode] = packs
    special = encoder.tokenizer.special
    saved["special"] = {k: getattr(special, k) for k in SPECIAL_IDS}
    saved["vocab_rows"] = QWEN_VL_VOCAB_ROWS
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, args.out)
    print(f"wrote {args.out}: {args.packs} packs per mode, {Path(args.out).stat().st_size / 2**20:.1f} MiB")


def _slim(batch: dict, encoder: Any) -> dict:
    """A pack without pixel values (their shape and dtype kept), integer tensors as int32, plus its cost terms."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key in PIXEL_KEYS and isinstance(value, torch.Tensor):
            out[key] = ("shape", tuple(value.shape), str(value.dtype))
        elif isinstance(value, torch.Tensor):
            out[key] = _narrow(value)
        elif key in ("vision_preset",) or isinstance(value, (int, float, str, bool, type(None))):
            out[key] = value
    out["terms"] = cost_terms(batch)
    return out


def _narrow(value: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The tensor in the smallest dtype that holds it exactly (int16 / int32, bool for a 0/1 mask), and its dtype."""
    dtype = str(value.dtype)
    if value.numel() and value.dtype in (torch.int64, torch.int32):
        for small, top in ((torch.int16, 2**15), (torch.int32, 2**31)):
            if value.abs().max() < top:
                return value.to(small), dtype
    if value.numel() and value.dtype.is_floating_point and bool(((value == 0) | (value == 1)).all()):
        return value.to(torch.bool), dtype
    return value, dtype


def cost_terms(batch: dict) -> dict[str, float]:
    """The step-cost model's terms of one pack: tokens, sum of segment lengths squared, vision patch rows,
    windowed-attention patches and the sum of (patches per time slice) squared."""
    cu = batch["cu_seqlens_q"].tolist()
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    grids = batch.get("image_grid_thw")
    grids = grids.tolist() if isinstance(grids, torch.Tensor) else []
    return {
        "tokens": float(sum(lengths)),
        "tokens_squared": float(sum(x * x for x in lengths)),
        "patches": float(sum(t * h * w for t, h, w in grids)),
        "patches_squared": float(sum(t * (h * w) ** 2 for t, h, w in grids)),
    }


# --------------------------------------------------------------------------------- step 2: fit
def restore(pack: dict, device: torch.device, dtype: torch.dtype) -> dict:
    batch: dict[str, Any] = {}
    for key, value in pack.items():
        if key == "terms":
            continue
        if isinstance(value, tuple) and value and value[0] == "shape":
            batch[key] = torch.randn(value[1], dtype=dtype)
        elif isinstance(value, tuple):
            tensor, was = value
            batch[key] = tensor.to(getattr(torch, was.removeprefix("torch.")))
        else:
            batch[key] = value
    return batch


def fit(args: argparse.Namespace) -> None:
    import finetune_multi_gpu as ft
    from energon_pack.bench.balance_bench import dp_efficiency
    from energon_pack.packing import StepCostModel

    saved = torch.load(args.packs, weights_only=False)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from types import SimpleNamespace

    tok = SimpleNamespace(special=SimpleNamespace(**saved["special"]))
    ft.vocab_size = lambda tokenizer, multiple=64: saved["vocab_rows"]  # the real model's rows, no tokenizer here
    model = ft.build_model("qwen2.5-vl", args.size, tok, device=device, dtype=dtype)
    ft.prepare_model(model)
    if args.compile:
        ft.compile_elementwise(model)
    opt = ft.make_optimizer(model, 1e-5, device)
    packs = {m: saved["modes"][m][: args.steps + args.warmup] for m in MODES}
    n = min(len(p) for p in packs.values())
    times: dict[str, list[float]] = {m: [] for m in MODES}
    compiled: dict[str, list[bool]] = {m: [] for m in MODES}  # whether torch.compile built a graph in the step
    terms: dict[str, list[dict]] = {m: [] for m in MODES}
    cuda = device.type == "cuda"
    start = time.perf_counter()
    for i in range(n):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:  # ABBA: neither mode always goes first
            batch = restore(packs[mode][i], device, dtype)
            if cuda:
                torch.cuda.synchronize(device)
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
            t0 = time.perf_counter()
            graphs = ft.compiled_graphs()
            loss, _, _ = ft.forward_loss(model, batch, device=device)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                ev1.record()
                torch.cuda.synchronize(device)
                ms = ev0.elapsed_time(ev1)
            else:
                ms = (time.perf_counter() - t0) * 1e3
            if i >= args.warmup:
                times[mode].append(ms)
                compiled[mode].append(ft.compiled_graphs() != graphs)
                terms[mode].append(packs[mode][i]["terms"])
    wall = time.perf_counter() - start
    flops = StepCostModel.from_shape(saved["cost_model"])
    result: dict[str, Any] = {
        "size": args.size,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "compile": args.compile,
        "width": saved["width"],
        "cost_model": flops.as_dict(),
        "wall_s": round(wall, 1),
        "modes": {},
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 1) if cuda else None,
    }
    for mode in MODES:
        t = np.asarray(times[mode])
        real = [x["tokens"] for x in terms[mode]]
        quiet = t[~np.asarray(compiled[mode], dtype=bool)]
        result["modes"][mode] = {
            "steps": len(t),
            "steps_that_compiled": int(len(t) - len(quiet)),
            "cv_without_compiling_steps": round(float(quiet.std() / quiet.mean()), 4) if len(quiet) else None,
            "median_ms": round(float(np.median(t)), 1),
            "cv": round(float(t.std() / t.mean()), 4),
            "dp8": round(dp_efficiency(t, 8), 4),
            "dp64": round(dp_efficiency(t, 64), 4),
            "tokens_per_s": round(float(sum(real) / (t.sum() / 1e3)), 0),
            "step_ms_all": [round(float(x), 2) for x in t],
            "terms": terms[mode],
        }
    result["fit"] = fit_terms([*terms["tokens"], *terms["compute"]], [*times["tokens"], *times["compute"]], flops)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"wrote {out}")


def fit_terms(terms: list[dict], ms: list[float], flops: Any) -> dict[str, Any]:
    """Least squares of step ms on (1, tokens, tokens^2 sum, patches, patches^2 sum), and on the FLOP cost alone."""
    keys = ("tokens", "tokens_squared", "patches", "patches_squared")
    x = np.asarray([[1.0, *(t[k] for k in keys)] for t in terms])
    y = np.asarray(ms)
    scale = np.abs(x).max(0)
    scale[scale == 0] = 1
    coef, *_ = np.linalg.lstsq(x / scale, y, rcond=None)
    coef = coef / scale
    pred = x @ coef
    r2 = 1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    cost = np.asarray(
        [
            t["tokens"] * flops.per_token
            + t["tokens_squared"] * flops.per_token_squared
            + t["patches"] * (flops.per_patch + flops.per_window_patch)
            + t["patches_squared"] * flops.per_patch_squared
            for t in terms
        ]
    )
    a, b = np.polyfit(cost, y, 1)
    flop_pred = a * cost + b
    flop_r2 = 1 - ((y - flop_pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    return {
        "coefficients_ms": dict(zip(("intercept", *keys), (float(c) for c in coef))),
        "r2": round(float(r2), 4),
        "residual_cv": round(float((y - pred).std() / y.mean()), 4),
        "flop_model_r2": round(float(flop_r2), 4),
        "ms_per_token_equivalent": float(a),
        "intercept_ms": float(b),
    }


def table(result: dict) -> str:
    lines = [
        f"{result['device']}, size {result['size']}, width {result['width']}, compile {result['compile']}",
        f"{'mode':<9}{'steps':>6}{'median ms':>11}{'cv':>8}{'DP-8':>8}{'DP-64':>8}{'tok/s':>9}{'compiled':>10}",
    ]
    for mode, r in result["modes"].items():
        lines.append(
            f"{mode:<9}{r['steps']:>6}{r['median_ms']:>11.1f}{r['cv'] * 100:7.2f}%{r['dp8']:8.3f}{r['dp64']:8.3f}"
            f"{r['tokens_per_s']:9.0f}{r['steps_that_compiled']:>10}"
        )
    f = result["fit"]
    lines.append(
        f"fit of step ms to the cost terms: R^2 {f['r2']:.3f}, residual {f['residual_cv'] * 100:.2f}%; "
        f"FLOP model alone: R^2 {f['flop_model_r2']:.3f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    a = sub.add_parser("packs", help="write the packs of both modes (needs the loader, no GPU)")
    a.add_argument("--out", default=".calib/packs.pt")
    a.add_argument("--samples", type=int, default=2000)
    a.add_argument("--packs", type=int, default=60)
    a.add_argument("--width", type=int, default=8192)
    a.add_argument("--buffer", type=int, default=256)
    a.add_argument("--workers", type=int, default=2)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--cost-model", default="qwen2.5-vl-3b")
    b = sub.add_parser("fit", help="time the packs on one device and fit the cost model")
    b.add_argument("--packs", default=".calib/packs.pt")
    b.add_argument("--size", default="3b", choices=("3b", "tiny"))
    b.add_argument("--device", default="cuda")
    b.add_argument("--steps", type=int, default=60, help="timed steps per mode")
    b.add_argument("--warmup", type=int, default=6)
    b.add_argument("--compile", action="store_true", help="torch.compile of the elementwise pieces")
    b.add_argument("--out", default="bench_results/step_cost.json")
    args = p.parse_args(argv)
    save_packs(args) if args.step == "packs" else fit(args)


if __name__ == "__main__":
    main()
