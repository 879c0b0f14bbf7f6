"""Measure what packs cost a GPU step, fit the step-cost model, and compare packings of the same data side by side.

Two steps, so the GPU machine needs neither Energon nor the data:

1. ``packs`` (any machine with the loader): writes a LLaVA-style mix (``--mix photos``: photos at their own size,
   :func:`energon_pack.bench.mixes.llava_photos`; ``--mix video``: the same with ``--videos`` records given
   generated H.264 clips, 4-24 s at 24-30 fps, 270p-360p), converts it, and takes ``--packs`` packs of each
   ``--modes`` packing from the real loader (Qwen2.5-VL tokenizer, ``--width``, every pack padded to the width):
   ``tokens`` (carry, tokens only), ``compute`` (carry, ``balance="compute"``), ``compute:COST_MODEL`` (the same
   priced by a named model, e.g. ``compute:qwen2.5-vl-3b@h200-compiled``), ``roundsN`` (Energon-style first-fit
   per buffer round of N, Bridge's recommended start is 16). For the fit it also saves
   ``--calibration-packs`` tokens-only packs at each of ``--calibration-widths`` (steps of other lengths, so
   the per-token cost separates from the fixed one). Pixel values are not saved (random pixels of the same
   shape are made on the GPU: the step time does not depend on them).
2. ``fit`` (one GPU): a random-initialised Qwen2.5-VL of the ``--size`` shape trains on the saved packs, the
   modes interleaved pack by pack in rotating order (no order effect), forward + backward + AdamW per step,
   timed with CUDA events after a warm-up, the calibration packs interleaved too. Printed: per mode the median
   step, the step-time cv, the bootstrap DP-8 / DP-64 efficiency of those times, real tokens/s, MFU (the
   FLOPs of ``examples/gpu_benchmark.py``: 989 TFLOP/s spec), peak memory and the vision tower's share of the
   step (``--split-every``: the tower's forward + backward timed alone on every k-th pack); then the fit of
   step time to the cost terms (R^2, residual spread, coefficients >= 0), the fitted model in token-equivalents
   and how well the FLOP-derived model alone predicts the times. Each step also records what can explain a
   residual the packs do not: host issue time, device syncs (with their source lines), cudaMalloc calls, SM
   clock and power (NVML). ``--repeat N`` then trains one pack N times in a row (the machine's own spread,
   no packing in it) and ``--profile N`` profiles N steps of it (GPU busy share, host-bound gaps and the op
   after each). ``--vision-calls both`` times every mode twice, side by side: a pack's images and videos through
   the vision tower in one call (``hf_forward_kwargs``' default) and through HF's call per kind.

    python examples/step_cost_fit.py packs --out .calib/packs.pt
    python examples/step_cost_fit.py packs --mix video --modes tokens,compute,rounds16 --out .calib/video.pt
    python examples/step_cost_fit.py packs --data my_converted_data --width 4096 --out .calib/mine.pt
    python examples/step_cost_fit.py fit --packs .calib/packs.pt --size 3b --out bench_results/step_cost.json
    python examples/step_cost_fit.py fit --packs .calib/packs.pt --compile --repeat 24 --profile 3 --out ...
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
#: the keys of a saved pack that are not tensors of the row
PIXEL_KEYS = ("pixel_values", "pixel_values_videos")
GRID_KEYS = ("image_grid_thw", "video_grid_thw")
#: the tokenizer's ids the model config needs (saved with the packs: the GPU machine needs no tokenizer)
SPECIAL_IDS = ("image_pad", "video_pad", "vision_start", "vision_end", "im_end", "pad")
#: a pack's counts the fit's residual is checked against (a per-item cost the terms do not price)
COUNT_TERMS = ("segments", "images", "videos", "slices")
#: the suffix of a mode whose packs run HF's vision-tower call per kind (``--vision-calls both``)
PER_KIND = "+2calls"
WORDS = ["the", "photo", "shows", "a", "small", "red", "house", "near", "river", "with", "two", "people"]


# --------------------------------------------------------------------------------- step 1: packs
def write_records(root: Path, n: int, width: int, seed: int, videos: int = 0) -> Path:
    """``n`` LLaVA-style records (photos as JPEG files, words for text) following the bench mix; the first
    ``videos`` image records (spread over the mix) get a generated clip instead of their photos."""
    from PIL import Image

    from energon_pack.bench.mixes import llava_photos

    rng = np.random.default_rng(seed)
    mix = llava_photos(n, width, seed)
    with_images = [i for i, (_, grids) in enumerate(mix) if grids]
    clips = set(rng.choice(with_images, min(videos, len(with_images)), replace=False).tolist()) if videos else set()
    records = []
    for i, (tokens, grids) in enumerate(mix):
        record: dict[str, Any]
        if i in clips:
            name = f"clip{i}.mp4"
            _write_clip(root / name, rng)
            answer = " ".join(rng.choice(WORDS, int(np.clip(rng.lognormal(np.log(80), 0.6), 4, 600))))
            record = {"videos": [name], "conversations": _turns("<video>\nDescribe the clip.", answer)}
            records.append(record)
            continue
        text_tokens = max(8, tokens - sum(h * w // 4 for _, h, w in grids))
        images = []
        for j, (_, h, w) in enumerate(grids):
            name = f"img{i}_{j}.jpg"
            pixels = rng.integers(0, 256, (h * 14 // 8, w * 14 // 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).resize((w * 14, h * 14)).save(root / name, quality=80)
            images.append(name)
        answer = " ".join(rng.choice(WORDS, max(1, int(text_tokens * 0.7))))
        record = {"conversations": _turns("<image>\n" * len(images) + "Describe it.", answer)}
        if images:
            record["images"] = images
        records.append(record)
    (root / "records.json").write_text(json.dumps(records))
    return root / "records.json"


def _turns(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


def _write_clip(path: Path, rng: np.random.Generator) -> None:
    """A generated H.264 clip of 4-24 s at 24, 25 or 30 fps, 480x270 or 640x360."""
    from energon_pack.bench.video_files import write_video

    fps = int(rng.choice([24, 25, 30]))
    width, height = ((480, 270), (640, 360))[int(rng.integers(2))]
    seconds = float(rng.uniform(4, 24))
    write_video(path, int(seconds * fps), fps, width, height, options={"preset": "ultrafast"})


def mode_packing(mode: str, buffer: int) -> dict[str, Any]:
    """The encoder and loader settings of a packing ``mode``: tokens, compute, compute:COST_MODEL (balanced by that
    named step-cost model instead of ``--cost-model``) or roundsN."""
    if mode in ("tokens", "compute"):
        return {"balance": mode, "packing_mode": "carry", "buffer": buffer}
    if mode.startswith("compute:"):
        from energon_pack.packing import named_cost_model

        named_cost_model(mode.removeprefix("compute:"))  # an unknown name fails here, naming the choices
        return {"balance": "compute", "packing_mode": "carry", "buffer": buffer, "cost_model": mode[8:]}
    if mode.startswith("rounds") and mode[len("rounds") :].isdigit():
        return {"balance": "tokens", "packing_mode": "rounds", "buffer": int(mode[len("rounds") :])}
    raise SystemExit(f"--modes: unknown mode {mode!r} (tokens, compute, compute:COST_MODEL or roundsN, e.g. rounds16)")


def take_packs(shards: Path, args: argparse.Namespace, mode: str, width: int, count: int) -> tuple[list, Any]:
    """``count`` packs of ``mode`` at ``width`` from the real loader, slimmed (:func:`_slim`)."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack import QwenVLPackingTaskEncoder

    how = mode_packing(mode, args.buffer)
    encoder = QwenVLPackingTaskEncoder(
        tokenizer="qwen2.5-vl",
        seq_length=width,
        pad_to_max_length=True,
        balance=how["balance"],
        packing_mode=how["packing_mode"],
        cost_model=how.get("cost_model", args.cost_model),
    )
    ds = get_train_dataset(
        str(shards),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers),
        task_encoder=encoder,
        packing_buffer_size=how["buffer"],
        repeat=True,
    )
    it = iter(get_loader(ds))
    return [_slim(next(it)) for _ in range(count)], encoder


def save_packs(args: argparse.Namespace) -> None:
    from energon_pack import QWEN_VL_VOCAB_ROWS
    from energon_pack.cli.convert import convert

    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        mode_packing(mode, args.buffer)  # an unknown mode fails before the records are written
    scratch = Path(tempfile.mkdtemp(prefix="step_cost_"))
    try:
        if args.data:  # a dataset the user converted (e.g. a public mix): packs of its own records
            shards, videos, mix = Path(args.data), None, str(args.data)
        else:
            videos, mix = (args.videos if args.mix == "video" else 0), args.mix
            source = write_records(scratch, args.samples, args.width, args.seed, videos=videos)
            shards = scratch / "shards"
            convert(source, shards, progress=False, workers=args.workers)
        saved: dict[str, Any] = {
            "width": args.width,
            "mix": mix,
            "videos": videos,
            "samples": None if args.data else args.samples,
            "buffer": args.buffer,
            "cost_model": args.cost_model,
            "modes": {},
            "calibration": [],
        }
        for mode in modes:
            saved["modes"][mode], encoder = take_packs(shards, args, mode, args.width, args.packs)
        for width in [int(w) for w in args.calibration_widths.split(",") if w]:
            saved["calibration"] += take_packs(shards, args, "tokens", width, args.calibration_packs)[0]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    special = encoder.tokenizer.special
    saved["special"] = {k: getattr(special, k) for k in SPECIAL_IDS}
    saved["vocab_rows"] = QWEN_VL_VOCAB_ROWS
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, args.out)
    size = Path(args.out).stat().st_size / 2**20
    print(
        f"wrote {args.out}: {args.packs} packs of {', '.join(modes)}, {len(saved['calibration'])} calibration, "
        f"{size:.1f} MiB"
    )


def _slim(batch: dict) -> dict:
    """A pack without pixel values (their shape and dtype kept), integer tensors narrowed, plus its cost terms."""
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
    """The step-cost model's terms of one pack (:func:`energon_pack.packing.calibrate.pack_cost_terms`: token slots,
    the terms of :meth:`StepCostModel.pack_terms`, counts of segments, images and videos), with the video patch rows
    apart and the vision time slices (the vision tower's full-attention segments: what a per-item overhead would
    follow)."""
    from energon_pack.packing.calibrate import pack_cost_terms

    video = batch.get("video_grid_thw")
    grids = [g for key in GRID_KEYS if batch.get(key) is not None for g in batch[key].tolist()]
    return {
        **pack_cost_terms(batch),
        "video_patches": float(video.prod(-1).sum()) if isinstance(video, torch.Tensor) else 0.0,
        "slices": float(sum(t for t, _, _ in grids)),
    }


# --------------------------------------------------------------------------------- step 2: fit
def restore(pack: dict, device: torch.device, dtype: torch.dtype) -> dict:
    batch: dict[str, Any] = {}
    for key, value in pack.items():
        if key == "terms":
            continue
        if isinstance(value, tuple) and value and value[0] == "shape":
            batch[key] = torch.randn(value[1], dtype=dtype, device=device)  # made where it trains: no host copy
        elif isinstance(value, tuple):
            tensor, was = value
            batch[key] = tensor.to(getattr(torch, was.removeprefix("torch.")))
        else:
            batch[key] = value
    return batch


def schedule(modes: dict[str, list], calibration: list, steps: int, warmup: int) -> list[tuple[str, int]]:
    """(mode, pack index) in timing order: round ``i`` runs every mode's pack ``i``, the modes rotated by one each
    round (none always first or last); after the ``warmup`` rounds each round adds the next calibration pack
    (``"calibration"``) while any is left, the rest come at the end."""
    names = list(modes)
    n = min(steps, *(len(p) for p in modes.values()))
    order: list[tuple[str, int]] = []
    for i in range(n):
        shift = i % len(names)
        order += [(m, i) for m in names[shift:] + names[:shift]]
        if warmup <= i < warmup + len(calibration):
            order.append(("calibration", i - warmup))
    order += [("calibration", j) for j in range(max(n - warmup, 0), len(calibration))]
    return order


def vision_tower(model: Any) -> Any:
    inner = getattr(model, "model", model)
    return inner.visual if hasattr(inner, "visual") else model.visual


def time_vision(model: Any, batch: dict, device: torch.device) -> float | None:
    """ms of the vision tower's forward + backward alone on the pack's images and videos (None without any)."""
    tower = vision_tower(model)
    pairs = [(batch[p], batch[g]) for p, g in zip(PIXEL_KEYS, GRID_KEYS) if batch.get(p) is not None]
    if not pairs:
        return None
    inputs = [(p.to(device, tower.dtype), g.to(device)) for p, g in pairs]
    torch.cuda.synchronize(device)
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    total = 0.0
    for pixels, grid in inputs:
        out = tower(pixels, grid_thw=grid)
        out = getattr(out, "pooler_output", out)
        total = total + out.float().square().mean()
    total.backward()
    ev1.record()
    torch.cuda.synchronize(device)
    return ev0.elapsed_time(ev1)


def timed_step(
    model: Any, opt: Any, batch: dict, device: torch.device, *, watch_syncs: bool = False, one_vision_call: bool = True
) -> dict:
    """One training step (forward, backward, AdamW) of ``batch``, timed with CUDA events, with what can make
    the same pack's step vary: ``host_ms`` (the host's time to issue the step; near ``ms`` when the GPU waits
    for the host), ``syncs`` (device-to-host synchronisations inside the step, with their source lines when
    ``watch_syncs``), ``device_allocs`` (cudaMalloc calls of the caching allocator), and the SM clock and power
    read while the step runs (NVML; None without it). ``one_vision_call=False``: HF's tower call per kind."""
    import finetune_multi_gpu as ft

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        allocs = torch.cuda.memory_stats(device).get("num_device_alloc", 0)
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
    graphs = ft.compiled_graphs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        t0 = time.perf_counter()
        loss, _, _ = ft.forward_loss(model, batch, device=device, one_vision_call=one_vision_call)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        host_ms = (time.perf_counter() - t0) * 1e3
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
    row: dict[str, Any] = {"host_ms": host_ms, "compiled": ft.compiled_graphs() != graphs}
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    row["syncs"] = len(syncs)
    if watch_syncs:
        sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)
        row["sync_sites"] = dict(sites.most_common())
    row.update(gpu_sample(device))
    if cuda:
        ev1.record()
        torch.cuda.synchronize(device)
        row["ms"] = ev0.elapsed_time(ev1)
        row["device_allocs"] = torch.cuda.memory_stats(device).get("num_device_alloc", 0) - allocs
    else:
        row["ms"] = (time.perf_counter() - t0) * 1e3
    return row


def gpu_sample(device: torch.device) -> dict[str, float | None]:
    """The SM clock (MHz) and board power (W) now, through NVML (``torch.cuda.clock_rate`` / ``power_draw``); None
    off CUDA or without NVML."""
    try:
        return {"sm_mhz": float(torch.cuda.clock_rate(device)), "power_w": torch.cuda.power_draw(device) / 1e3}
    except Exception:  # no CUDA, no pynvml, or a driver that does not report it
        return {"sm_mhz": None, "power_w": None}


def fit(args: argparse.Namespace) -> None:
    from types import SimpleNamespace

    import finetune_multi_gpu as ft
    from energon_pack.packing import named_cost_model
    from gpu_benchmark import attention_flops

    saved = torch.load(args.packs, weights_only=False)
    chosen = [m for m in args.modes.split(",") if m] or list(saved["modes"])
    unknown = sorted(set(chosen) - set(saved["modes"]))
    if unknown:
        raise SystemExit(f"--modes: {', '.join(unknown)} not in {args.packs} (it has {', '.join(saved['modes'])})")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    tok = SimpleNamespace(special=SimpleNamespace(**saved["special"]))
    ft.vocab_size = lambda tokenizer, multiple=64: saved["vocab_rows"]  # the real model's rows, no tokenizer here
    model = ft.build_model("qwen2.5-vl", args.size, tok, device=device, dtype=dtype)
    counts = ft.param_counts(model)
    ft.linear_patch_embed(model)  # as examples/gpu_benchmark.py: the patch embedding as one GEMM
    ft.prepare_model(model)
    if args.compile:
        ft.compile_elementwise(model)
    opt = ft.make_optimizer(model, 1e-5, device)
    packs = {m: saved["modes"][m][: args.steps + args.warmup] for m in chosen}
    if args.vision_calls == "both":  # every mode's packs again, through HF's tower call per kind
        packs.update({f"{m}{PER_KIND}": p for m, p in list(packs.items())})
    calibration = saved.get("calibration", [])[: args.calibration]
    groups = {**packs, "calibration": calibration}
    rows: dict[str, list[dict]] = {m: [] for m in groups}
    start = time.perf_counter()
    if args.gc == "manual":  # as Megatron's --manual-gc: collect between steps, never inside a timed one
        gc.disable()
    watched: set[str] = set()  # the modes whose first step had its device syncs located
    for seq, (mode, i) in enumerate(schedule(packs, calibration, args.steps + args.warmup, args.warmup)):
        pack = groups[mode][i]
        batch = restore(pack, device, dtype)
        if args.gc == "manual":
            gc.collect()
        watch = mode not in watched and (i >= args.warmup or mode == "calibration")
        per_kind = args.vision_calls == "per-kind" or mode.endswith(PER_KIND)
        row = timed_step(model, opt, batch, device, watch_syncs=watch, one_vision_call=not per_kind)
        watched |= {mode} if watch else set()
        row.update(terms=pack["terms"], seq=seq)
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
        cu = batch["cu_seqlens_q"].tolist()
        row["attention_flops"] = attention_flops([b - a for a, b in zip(cu, cu[1:])], model.config)
        if cuda and args.split_every and i % args.split_every == 0 and mode != "calibration":
            row["vision_ms"] = time_vision(model, batch, device)
            model.zero_grad(set_to_none=True)
        if i >= args.warmup or mode == "calibration":
            rows[mode].append(row)
    repeated = repeat_pack(model, opt, groups, args, device, dtype) if args.repeat else None
    idle = profile_idle(model, opt, groups, args, device, dtype) if args.profile and cuda else None
    gc.enable()
    flops = named_cost_model(saved["cost_model"])  # the model the packs were balanced with
    result: dict[str, Any] = {
        "size": args.size,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "compile": args.compile,
        "gc": args.gc,
        "width": saved["width"],
        "mix": saved.get("mix", "photos"),
        "vision_calls": args.vision_calls,
        "videos": saved.get("videos", 0),
        "samples": saved.get("samples"),
        "buffer": saved.get("buffer"),
        "params": counts,
        "cost_model": flops.as_dict(),
        "wall_s": round(time.perf_counter() - start, 1),
        "modes": {m: summarize(rows[m], counts) for m in packs},
    }
    # the fit and its diagnosis: the steps of one vision path (a second tower call is a cost the terms do not price)
    timed = sorted(
        (r for m in groups if not m.endswith(PER_KIND) for r in rows[m] if not r["compiled"]), key=lambda r: r["seq"]
    )
    result["fit"] = fit_terms([r["terms"] for r in timed], [r["ms"] for r in timed], flops)
    result["diagnosis"] = diagnose(timed, result["fit"].pop("residuals_ms"))
    if repeated is not None:
        result["repeat"] = repeated
    if idle is not None:
        result["gpu_idle"] = idle
    result["fit"]["steps"] = len(timed)
    result["fit"]["calibration_steps"] = sum(not r["compiled"] for r in rows["calibration"])
    print(table(result))
    print(write_result(args.out, result))


def repeat_pack(model: Any, opt: Any, groups: dict, args: argparse.Namespace, device: Any, dtype: Any) -> dict:
    """The first timed pack of the first mode, trained ``--repeat`` times in a row: how much the step time of one
    and the same pack varies (what no cost model can balance)."""
    from gpu_benchmark import step_spread

    mode = next(iter(groups))
    pack = groups[mode][min(args.warmup, len(groups[mode]) - 1)]
    rows = []
    for _ in range(args.repeat):
        batch = restore(pack, device, dtype)
        if args.gc == "manual":
            gc.collect()
        rows.append(timed_step(model, opt, batch, device))
    ms = np.asarray([r["ms"] for r in rows])
    return {
        "pack": f"{mode} {min(args.warmup, len(groups[mode]) - 1)}",
        "steps": len(rows),
        "median_ms": round(float(np.median(ms)), 1),
        "cv": _round(step_spread(ms.tolist(), dp_sizes=())["step_cv"]),
        "lag1_autocorrelation": _lag1(ms),
        **_per_step(rows),
    }


def profile_idle(model: Any, opt: Any, groups: dict, args: argparse.Namespace, device: Any, dtype: Any) -> dict:
    """``--profile`` steps of the repeated pack under ``torch.profiler``: how much of the step the GPU sits idle,
    how much of that idle time waits for a kernel the host had not launched yet (the step is host-bound there,
    and so varies with the host's speed), and the longest such waits with the operator that launched the late
    kernel."""
    from torch.profiler import ProfilerActivity, profile

    mode = next(iter(groups))
    pack = groups[mode][min(args.warmup, len(groups[mode]) - 1)]
    batches = [restore(pack, device, dtype) for _ in range(args.profile)]
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for batch in batches:
            timed_step(model, opt, batch, device)
    trace = Path(tempfile.mkdtemp(prefix="step_trace_")) / "trace.json"
    prof.export_chrome_trace(str(trace))
    return idle_summary(json.loads(trace.read_text())["traceEvents"], args.profile)


def idle_summary(events: list[dict], steps: int, gap_us: float = 10.0) -> dict[str, Any]:
    """GPU busy and idle time of a chrome trace (kernels, copies and sets as the GPU's work), and the idle time
    before kernels whose launch the host issued after the GPU ran dry (host-bound gaps), per step; the ten
    longest host-bound gaps with the CPU operator around the late launch."""
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    starts = [o["ts"] for o in ops]
    busy = idle = host_bound = 0.0
    late: list[tuple[float, str]] = []
    end = gpu[0]["ts"] if gpu else 0.0
    for e in gpu:
        gap = e["ts"] - end
        if gap > gap_us:
            idle += gap
            launch = launches.get(e.get("args", {}).get("correlation"))
            if launch is not None and launch["ts"] > end:  # launched after the GPU had run out of work
                host_bound += gap
                late.append((gap, _innermost(ops, starts, launch)))
        busy += max(0.0, e["ts"] + e.get("dur", 0) - max(end, e["ts"]))
        end = max(end, e["ts"] + e.get("dur", 0))
    span = (end - gpu[0]["ts"]) if gpu else 0.0
    late.sort(reverse=True)
    return {
        "steps": steps,
        "step_ms": round(span / steps / 1e3, 2),
        "busy_share": round(busy / span, 4) if span else None,
        "idle_ms_per_step": round(idle / steps / 1e3, 2),
        "host_bound_idle_ms_per_step": round(host_bound / steps / 1e3, 2),
        "longest_host_bound_gaps": [{"us": round(g, 1), "op": name} for g, name in late[:10]],
    }


def _innermost(ops: list[dict], starts: list[float], launch: dict) -> str:
    """The name of the latest-starting CPU operator (``ops`` sorted by start) still running at ``launch``."""
    from bisect import bisect_right

    for k in range(bisect_right(starts, launch["ts"]) - 1, -1, -1):
        if ops[k]["ts"] + ops[k].get("dur", 0) >= launch["ts"]:
            return ops[k]["name"]
    return launch["name"]


def _round(x: float | None) -> float | None:
    """A JSON figure to four places; ``None`` (too few steps to say) stays ``None``."""
    return None if x is None else round(float(x), 4)


def _lag1(x: Any) -> float | None:
    x = np.asarray(x, dtype=float)
    return round(float(np.corrcoef(x[1:], x[:-1])[0, 1]), 3) if len(x) > 2 and x.std() > 0 else None


def _per_step(rows: list[dict]) -> dict[str, list]:
    """The per-step readings of :func:`timed_step`, one list each, rounded (None where not read)."""
    keys = ("ms", "host_ms", "syncs", "device_allocs", "sm_mhz", "power_w")
    return {f"{k}_all": [None if r.get(k) is None else round(float(r[k]), 2) for r in rows] for k in keys}


def diagnose(rows: list[dict], residuals: list[float]) -> dict[str, Any]:
    """What the fit's residual (step time the packs' composition does not explain) follows, over the timed steps
    in timing order: its correlation with the host's issue time, the syncs, cudaMalloc calls, SM clock and
    power, the pack's counts of segments, images, videos and vision slices (packs saved before the counts have
    none), and with itself one step later (a residual that persists over steps is a state of the machine, not a
    property of the pack); plus the medians of those readings and where the steps synchronise."""
    res = np.asarray(residuals, dtype=float)
    out: dict[str, Any] = {"residual_lag1_autocorrelation": _lag1(res), "correlation_with_residual": {}}
    readings = {key: [r.get(key) for r in rows] for key in ("host_ms", "syncs", "device_allocs", "sm_mhz", "power_w")}
    counts = {key: [r["terms"].get(key) for r in rows] for key in COUNT_TERMS}
    for key, values in {**readings, **counts}.items():
        v = np.asarray([np.nan if x is None else x for x in values], dtype=float)
        ok = ~np.isnan(v)
        if ok.sum() > 2 and v[ok].std() > 0:
            out["correlation_with_residual"][key] = round(float(np.corrcoef(res[ok], v[ok])[0, 1]), 3)
        if key in readings:
            out[f"median_{key}"] = round(float(np.median(v[ok])), 2) if ok.any() else None
    host = np.asarray([r["host_ms"] / r["ms"] for r in rows])
    out["host_share_median"] = round(float(np.median(host)), 3)
    out["sync_sites"] = {str(r["seq"]): r["sync_sites"] for r in rows if "sync_sites" in r}
    return out


def summarize(rows: list[dict], counts: dict) -> dict[str, Any]:
    """One mode's timed steps: median, cv, bootstrap DP-8 / DP-64 efficiency, real tokens/s, fill, MFU (spec
    peak), peak memory and the vision tower's share of the steps it was timed alone on."""
    from gpu_benchmark import PEAK_SPEC, step_spread

    t = np.asarray([r["ms"] for r in rows])
    spread = step_spread(t.tolist())
    quiet = t[~np.asarray([r["compiled"] for r in rows], dtype=bool)]
    real = sum(r["terms"]["tokens"] for r in rows)
    useful = sum(
        6.0 * counts["llm"] * r["terms"]["tokens"]
        + 6.0 * counts["vision"] * r["terms"]["patches"]
        + r["attention_flops"]
        for r in rows
    )
    split = [(r["vision_ms"], r["ms"]) for r in rows if r.get("vision_ms") is not None]
    peaks = [r["peak_gib"] for r in rows if r["peak_gib"] is not None]
    return {
        "steps": len(t),
        "steps_that_compiled": int(len(t) - len(quiet)),
        "cv_without_compiling_steps": _round(step_spread(quiet.tolist(), dp_sizes=())["step_cv"]),
        "median_ms": round(float(np.median(t)), 1),
        "cv": _round(spread["step_cv"]),
        "dp8": _round(spread["dp_efficiency"].get("8")),
        "dp64": _round(spread["dp_efficiency"].get("64")),
        "tokens_per_s": round(float(real / (t.sum() / 1e3)), 0),
        "fill": round(real / sum(r["terms"]["slots"] for r in rows), 4),
        "mfu_spec": round(useful / (t.sum() / 1e3) / PEAK_SPEC, 4),
        "peak_gib": round(max(peaks), 1) if peaks else None,
        "vision_share": round(sum(v for v, _ in split) / sum(s for _, s in split), 3) if split else None,
        "vision_timed_steps": len(split),
        "step_ms_all": [round(float(x), 2) for x in t],
        **{k: v for k, v in _per_step(rows).items() if k != "ms_all"},
        "seq_all": [r["seq"] for r in rows],
        "terms": [r["terms"] for r in rows],
    }


def fit_terms(terms: list[dict], ms: list[float], flops: Any, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fit of step ms on the cost terms and the ``extra`` ones (:func:`energon_pack.packing.calibrate.
    fit_step_times`: coefficients >= 0 by NNLS), the fitted model in token-equivalents (per slot = 1), and the
    FLOP-derived model's R^2 alone."""
    from energon_pack.packing.calibrate import fit_step_times

    report = fit_step_times(terms, ms, extra=extra)
    y = np.asarray(ms, dtype=float)
    cost = np.asarray([flops.terms_cost(t) for t in terms])
    a, b = np.polyfit(cost, y, 1) if cost.std() > 0 else (0.0, float(y.mean()))
    flop_r2 = 1 - ((y - (a * cost + b)) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
    return {
        "coefficients_ms": report.coefficients_ms,
        "terms_kept": report.terms_kept,
        "r2": report.r2,
        "residual_cv": report.residual_cv,
        "residuals_ms": report.residuals_ms,
        "fitted_token_equivalents": report.token_equivalents(),
        "flop_model_r2": round(float(flop_r2), 4),
        "ms_per_token_equivalent": float(a),
        "intercept_ms": float(b),
    }


def write_result(out: str | Path, value: dict) -> str:
    """Write a result JSON whole or not at all, an earlier run's file there kept under its time
    (:class:`energon_pack.bench.outputs.RunFiles`); returns the line that says where."""
    from energon_pack.bench.outputs import RunFiles

    files, name = RunFiles.for_file(out)
    files.write_text(name, json.dumps(value, indent=1))
    return files.announce()


def tower_calls(terms: dict, one_call: bool) -> int:
    """The vision-tower calls of a pack's step: none without media, one with ``one_call``, else HF's one per kind."""
    kinds = int(terms["images"] > 0) + int(terms["videos"] > 0)
    return min(kinds, 1) if one_call else kinds


def refit(args: argparse.Namespace) -> None:
    """A saved run's step times refitted on its packs built again (``packs`` with the run's seed and settings gives
    the same packs: each pack's terms are checked against the run's), with the counts the run did not record: the
    pack's samples, images, videos and vision slices, and its vision-tower calls. Prints the fit without and with
    video rows priced apart, and with the tower calls as a term, and the residual's correlation with each count."""
    from energon_pack.packing import named_cost_model

    result = json.loads(Path(args.result).read_text())
    saved = torch.load(args.packs, weights_only=False)
    path = result.get("vision_calls", "per-kind")  # runs before one_vision_call existed: HF's call per kind
    terms, ms = [], []
    for mode, run in result["modes"].items():
        packs = saved["modes"][mode.removesuffix(PER_KIND)][args.warmup :]
        if len(packs) < len(run["terms"]):
            raise SystemExit(f"{args.packs}: {len(packs)} packs of {mode} after the warm-up, the run timed more")
        for step, (recorded, pack) in enumerate(zip(run["terms"], packs)):
            if any(abs(recorded[k] - pack["terms"][k]) > 1e-6 for k in recorded):
                raise SystemExit(f"{mode} step {step}: the packs differ from the run's (not the same seed or settings)")
            one_call = path == "one" or (path == "both" and not mode.endswith(PER_KIND))
            terms.append({**pack["terms"], "tower_calls": float(tower_calls(pack["terms"], one_call))})
            ms.append(run["step_ms_all"][step])
    flops = named_cost_model(saved["cost_model"])
    fits = {
        "terms": fit_terms(terms, ms, flops),
        "terms_and_video_rows": fit_terms(terms, ms, flops, ("video_patches",)),  # a video row priced apart
        "terms_and_tower_calls": fit_terms(terms, ms, flops, ("tower_calls",)),
    }
    residual = np.asarray(fits["terms"].pop("residuals_ms"))
    for f in fits.values():
        f.pop("residuals_ms", None)
    correlation = {}
    for key in (*COUNT_TERMS, "tower_calls"):
        v = np.asarray([t[key] for t in terms], dtype=float)
        correlation[key] = round(float(np.corrcoef(v, residual)[0, 1]), 3) if v.std() > 0 else None
    out = {"result": str(args.result), "packs": str(args.packs), "steps": len(ms), "fits": fits}
    out["correlation_with_residual"] = correlation
    out["packs_with_both_kinds"] = {
        m: round(float(np.mean([p["terms"]["images"] > 0 and p["terms"]["videos"] > 0 for p in packs])), 3)
        for m, packs in saved["modes"].items()
    }
    for name, f in fits.items():
        calls = (
            f"; per tower call {f['coefficients_ms']['tower_calls']:.1f} ms" if "tower_calls" in f["terms_kept"] else ""
        )
        print(f"{name}: R^2 {f['r2']:.3f}, residual {f['residual_cv']:.2%} of the step ({len(ms)} steps){calls}")
    print("residual's correlation: " + ", ".join(f"{k} {v}" for k, v in correlation.items()))
    print(write_result(args.out, out))


def _cell(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``, or ``n/a`` right-aligned to its width where there is nothing to say."""
    return format(value, spec) if value is not None else "n/a".rjust(int(spec.split(".")[0] or 0))


def table(result: dict) -> str:
    lines = [
        f"{result['device']}, size {result['size']}, width {result['width']}, compile {result['compile']}, "
        f"gc {result['gc']}, "
        f"mix {result['mix']} ({result['videos']} videos)",
        f"{'mode':<20}{'steps':>6}{'median ms':>11}{'cv':>8}{'DP-8':>8}{'DP-64':>8}{'tok/s':>9}{'fill':>8}"
        f"{'MFU':>7}{'vision':>8}{'GiB':>7}{'compiled':>10}",
    ]
    for mode, r in result["modes"].items():
        lines.append(
            f"{mode:<20}{r['steps']:>6}{r['median_ms']:>11.1f}{_cell(r['cv'], '8.2%')}{_cell(r['dp8'], '8.3f')}"
            f"{_cell(r['dp64'], '8.3f')}{r['tokens_per_s']:9.0f}{r['fill']:8.2%}{r['mfu_spec']:7.1%} "
            f"{_cell(r['vision_share'], '7.1%')}{_cell(r['peak_gib'], '7.1f')}{r['steps_that_compiled']:>10}"
        )
    f = result["fit"]
    lines.append(
        f"fit of step ms to {', '.join(f['terms_kept'])} ({f['steps']} steps, {f['calibration_steps']} calibration): "
        f"R^2 {f['r2']:.3f}, residual {f['residual_cv'] * 100:.2f}%; FLOP model alone: R^2 {f['flop_model_r2']:.3f}"
    )
    if f["fitted_token_equivalents"]:
        lines.append(
            "fitted, token-equivalents: " + ", ".join(f"{k} {v:.4g}" for k, v in f["fitted_token_equivalents"].items())
        )
    d = result.get("diagnosis")
    if d:
        lines.append(
            f"residual: lag-1 autocorrelation {d['residual_lag1_autocorrelation']}, correlation with "
            + ", ".join(f"{k} {v:+.2f}" for k, v in d["correlation_with_residual"].items())
            + f"; host issues {d['host_share_median']:.0%} of a step, median {d['median_syncs']} syncs"
        )
        for seq, sites in d["sync_sites"].items():
            lines.append(f"  syncs of step {seq}: " + ", ".join(f"{k} x{v}" for k, v in list(sites.items())[:8]))
    g = result.get("gpu_idle")
    if g:
        lines.append(
            f"profiled ({g['steps']} steps of that pack): GPU busy {g['busy_share']:.1%}, "
            f"idle {g['idle_ms_per_step']} ms a step, {g['host_bound_idle_ms_per_step']} ms of it waiting for the "
            "host's next launch; longest: "
            + ", ".join(f"{x['op']} {x['us'] / 1e3:.2f} ms" for x in g["longest_host_bound_gaps"][:5])
        )
    r = result.get("repeat")
    if r:
        lines.append(
            f"one pack ({r['pack']}) {r['steps']} times: median {r['median_ms']} ms, cv {_cell(r['cv'], '.2%')}, "
            f"lag-1 autocorrelation {r['lag1_autocorrelation']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    a = sub.add_parser("packs", help="write the packs of each mode (needs the loader, no GPU)")
    a.add_argument("--out", default=".calib/packs.pt")
    a.add_argument("--mix", default="photos", choices=("photos", "video"))
    a.add_argument("--data", default=None, help="an Energon-prepared dataset to pack instead of a generated --mix")
    a.add_argument("--videos", type=int, default=60, help="records given a clip in --mix video")
    a.add_argument(
        "--modes", default="tokens,compute", help="comma list of tokens, compute, compute:COST_MODEL, roundsN"
    )
    a.add_argument("--samples", type=int, default=2000)
    a.add_argument("--packs", type=int, default=60)
    a.add_argument("--width", type=int, default=8192)
    a.add_argument("--calibration-widths", default="2048,4096,6144", help="'' for none")
    a.add_argument("--calibration-packs", type=int, default=10, help="tokens-only packs per calibration width")
    a.add_argument("--buffer", type=int, default=256, help="the carry modes' packing buffer")
    a.add_argument("--workers", type=int, default=2)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--cost-model", default="qwen2.5-vl-3b")
    b = sub.add_parser("fit", help="time the packs on one device and fit the cost model")
    b.add_argument("--packs", default=".calib/packs.pt")
    b.add_argument("--size", default="3b", choices=("3b", "tiny"))
    b.add_argument("--device", default="cuda")
    b.add_argument("--steps", type=int, default=60, help="timed steps per mode")
    b.add_argument("--modes", default="", help="the saved modes to time, comma-separated (all by default)")
    b.add_argument("--warmup", type=int, default=6)
    b.add_argument("--calibration", type=int, default=None, help="calibration packs timed (all by default)")
    b.add_argument("--split-every", type=int, default=4, help="time the vision tower alone every k-th pack (0: never)")
    b.add_argument(
        "--repeat", type=int, default=0, help="then train one pack this many times in a row (its own spread)"
    )
    b.add_argument("--profile", type=int, default=0, help="then profile this many steps of that pack (GPU idle time)")
    b.add_argument("--compile", action="store_true", help="torch.compile of the elementwise pieces")
    b.add_argument(
        "--gc",
        default="manual",
        choices=("manual", "auto"),
        help="manual: Python's garbage collector runs between steps only (Megatron's --manual-gc); auto: its own",
    )
    b.add_argument(
        "--vision-calls",
        default="one",
        choices=("one", "per-kind", "both"),
        help="one: a pack's images and videos through the vision tower in one call (hf_forward_kwargs' default); "
        f"per-kind: HF's call per kind; both: every mode both ways (the per-kind ones named MODE{PER_KIND})",
    )
    b.add_argument("--out", default="bench_results/step_cost.json")
    c = sub.add_parser("refit", help="refit a saved run on its packs built again (what the residual follows; no GPU)")
    c.add_argument("--result", required=True, help="the run's JSON")
    c.add_argument("--packs", required=True, help="its packs, built again with the run's seed and settings")
    c.add_argument("--warmup", type=int, default=6, help="the run's --warmup")
    c.add_argument("--out", default="bench_results/step_cost_refit.json")
    args = p.parse_args(argv)
    {"packs": save_packs, "fit": fit, "refit": refit}[args.step](args)


if __name__ == "__main__":
    main()
