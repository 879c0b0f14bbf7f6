"""The worker's pixel path, measured side by side in one run (issue 13).

For one set of generated photos and scans (JPEG and PNG, sides 102..1,411 px, Qwen2.5-VL bounds
200,704..1,003,520 pixels) it prints images per CPU-second (one core) for:

* ``floor``: PIL decode + RGB convert only (what every path pays);
* ``floor + PIL bicubic resize``: decode + the uint8 resize both HF and we run (the floor of
  any path with HF-identical pixels); ``floor + our PIL-exact resize``: the same bytes, our way;
* ``ours/<dtype>``: :func:`energon_pack.qwen_vl.vision.patchify_image` with ``pixel_dtype``
  float32, bfloat16, uint8 (and float32 with ``jpeg_draft``, without the AVX-512 kernels of
  :mod:`energon_pack.pixels.pixel_simd`, and without numba);
* ``reference``: the pre-issue-13 float path (:func:`~energon_pack.qwen_vl.vision.reference_patchify_image`);
* ``hf``: transformers' ``Qwen2VLImageProcessor`` (PIL backend), fed the decoded RGB image.

Paths run interleaved (round robin, best of ``rounds`` per path), so a busy neighbour slows
them alike. It then runs the real Energon loader (1 worker) per dtype and reports worker CPU
ms per sample and per real token and pixel bytes per pack through the loader queue, and
measures the draft decode on large photos (max abs difference vs full decode + resize, grids
unchanged). ``main(out)`` writes JSON.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from energon_pack import pixels
from energon_pack.bench.outputs import write_report
from energon_pack.env import environ_set
from energon_pack.pixels import PIXEL_KERNELS_ENV, PIXEL_SIMD_ENV
from energon_pack.qwen_vl import get_preset, load_demo_tokenizer
from energon_pack.qwen_vl import vision as V

MIN_PIXELS, MAX_PIXELS = 200_704, 1_003_520
TARGETS = {"f32_vs_hf": 2.0, "f32_vs_floor": 0.5}
WORDS = "invoice total amount date page section figure table results model data sample quality photo street".split()


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pragma: no cover - old Pillow
        return ImageFont.load_default()


def make_image(rng: np.random.Generator, width: int, height: int, kind: str) -> Image.Image:
    """A realistic-looking RGB image: a smooth 'photo' (gradients, blurred shapes, sensor noise,
    some text) or a 'scan' (paper tone, lines of dark text, slight noise)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    if kind == "scan":
        paper = rng.uniform(225, 250)
        base = np.full((height, width, 3), paper, dtype=np.float32) - (yy / max(height, 1))[..., None] * rng.uniform(
            0, 12
        )
        img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        size = max(8, int(rng.uniform(0.012, 0.03) * height) + 6)
        font = _font(size)
        y = int(rng.uniform(0.03, 0.08) * height)
        while y < height - size:
            line = " ".join(rng.choice(WORDS, int(rng.integers(3, 12))))
            draw.text((int(0.05 * width), y), line, fill=tuple(int(v) for v in rng.integers(0, 60, 3)), font=font)
            y += int(size * rng.uniform(1.3, 2.0))
        arr = np.asarray(img, dtype=np.float32) + rng.normal(0, 3, (height, width, 3))
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = (xx * rng.uniform(-1, 1) + yy * rng.uniform(-1, 1)) / (width + height)
    t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    base = c0 * (1 - t[..., None]) + c1 * t[..., None]
    base += 30 * np.sin(xx[..., None] / rng.uniform(20, 200) + rng.uniform(0, 6, 3))
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 12))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(max(3, min(width, height) // 20), max(4, min(width, height) // 3)))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0 - r, y0 - r, x0 + r, y0 + r), fill=fill)
    img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 2.5))))
    draw = ImageDraw.Draw(img)
    draw.text(
        (int(0.05 * width), int(0.05 * height)),
        " ".join(rng.choice(WORDS, 3)),
        fill=(255, 255, 255),
        font=_font(max(8, height // 14)),
    )
    arr = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(2, 8), (height, width, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def encode(img: Image.Image, fmt: str, rng: np.random.Generator) -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.save(buf, format="JPEG", quality=int(rng.integers(70, 96)))
    else:
        img.save(buf, format="PNG")
    return buf.getvalue()


def make_image_set(n: int = 46, seed: int = 0, lo: int = 102, hi: int = 1411) -> list[dict]:
    """``n`` encoded images: sides log-uniform in [lo, hi], 3/4 photos, 1/4 scans, 2/3 JPEG."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        h = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        kind = "scan" if i % 4 == 3 else "photo"
        fmt = "PNG" if i % 3 == 2 else "JPEG"
        out.append(
            {
                "data": encode(make_image(rng, w, h, kind), fmt, rng),
                "width": w,
                "height": h,
                "kind": kind,
                "format": fmt,
            }
        )
    return out


def _hf_processor(preset):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(
            patch_size=preset.patch_size,
            merge_size=preset.merge_size,
            temporal_patch_size=preset.temporal_patch_size,
            min_pixels=preset.min_pixels,
            max_pixels=preset.max_pixels,
            image_mean=list(preset.image_mean),
            image_std=list(preset.image_std),
        )


def bench_paths(images: list[dict], rounds: int = 5, hf: bool = True) -> dict[str, Any]:
    """images per CPU-second of each path (best round), interleaved round robin."""
    import torch

    torch.set_num_threads(1)
    base = get_preset("qwen2.5-vl", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    presets = {d: get_preset(base, pixel_dtype=d) for d in ("float32", "bfloat16", "uint8")}
    draft = get_preset(base, jpeg_draft=True)
    datas = [im["data"] for im in images]
    proc = _hf_processor(base) if hf else None

    def floor():
        for d in datas:
            pixels.to_rgb_image(pixels.open_image(d))

    def floor_resize():
        for d in datas:
            rgb = pixels.to_rgb_image(pixels.open_image(d))
            rh, rw = V.resized_image_size(rgb.height, rgb.width, base)
            if (rgb.height, rgb.width) != (rh, rw):
                rgb = rgb.resize((rw, rh), resample=Image.Resampling.BICUBIC)
            np.asarray(rgb)

    fast = V.warm_pixel_path(base)  # compile and verify the kernels once, outside every timed row

    def floor_our_resize():  # what a worker does before the layout: PIL's pixels read in place where SIMD runs
        for d in datas:
            rgb = pixels.to_rgb_image(pixels.open_image(d))
            rh, rw = V.resized_image_size(rgb.height, rgb.width, base)
            pixels.resize(rgb, rh, rw, base.resample, fast)

    def ours(preset):
        def run():  # each result dropped before the next image, as the floor and HF rows do
            for d in datas:
                V.patchify_image(d, preset)

        return run

    def float32_switched_off(variable):
        """The float32 path with one of the pixel path's switches set to "off" for the round."""

        def run():
            with environ_set(variable, "off"):
                for d in datas:
                    V.patchify_image(d, presets["float32"])

        return run

    def hf_path():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for d in datas:
                proc(images=[pixels.to_rgb_image(pixels.open_image(d))], return_tensors="np")

    paths = {
        "floor": floor,
        "floor + PIL bicubic resize": floor_resize,
        "floor + our PIL-exact resize": floor_our_resize,
        "ours/float32": ours(presets["float32"]),
        "ours/bfloat16": ours(presets["bfloat16"]),
        "ours/uint8": ours(presets["uint8"]),
        "ours/float32+draft": ours(draft),
        "ours/float32 without the SIMD kernels": float32_switched_off(PIXEL_SIMD_ENV),
        "ours/float32 without numba": float32_switched_off(PIXEL_KERNELS_ENV),
        "reference (old float path)": lambda: [V.reference_patchify_image(d, base) for d in datas],
    }
    if hf:
        paths["hf Qwen2VLImageProcessor (PIL)"] = hf_path
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        for name, fn in paths.items():
            cpu, wall = time.process_time(), time.perf_counter()
            fn()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if name not in best or cpu < best[name][0]:
                best[name] = (cpu, wall)
    n = len(datas)
    rows = {name: {"cpu_s": c, "wall_s": w, "images_per_cpu_s": n / c} for name, (c, w) in best.items()}
    f = rows["floor"]["images_per_cpu_s"]
    h = rows.get("hf Qwen2VLImageProcessor (PIL)", {}).get("images_per_cpu_s")
    for r in rows.values():
        r["vs_floor"] = r["images_per_cpu_s"] / f
        r["vs_hf"] = r["images_per_cpu_s"] / h if h else None
    patches = sum(int(np.prod(V.image_grid_thw(im["height"], im["width"], base))) for im in images)
    return {"images": n, "patch_rows": patches, "rounds": rounds, "rows": rows}


def bench_draft(
    seed: int = 1,
    sizes=((2816, 2112), (4032, 3024), (3000, 4000), (6000, 4000), (2400, 1800), (5184, 3456)),
    rounds: int = 3,
) -> dict[str, Any]:
    """Large JPEG photos: draft decode (opt-in) vs full decode + resize: max abs difference of the
    float32 pixel values and of the 0..255 RGB values, grids, and time."""
    rng = np.random.default_rng(seed)
    base = get_preset("qwen2.5-vl", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    draft = get_preset(base, jpeg_draft=True)
    u8, u8_draft = get_preset(base, pixel_dtype="uint8"), get_preset(draft, pixel_dtype="uint8")
    rows = []
    for w, h in sizes:
        data = encode(make_image(rng, w, h, "photo"), "JPEG", rng)
        full_pv, full_grid = V.patchify_image(data, base)
        pv, grid = V.patchify_image(data, draft)
        assert np.array_equal(full_grid, grid), (w, h)
        diff_u8 = np.abs(
            V.patchify_image(data, u8)[0].astype(np.int16) - V.patchify_image(data, u8_draft)[0].astype(np.int16)
        )
        times = {}
        for name, p in (("full", base), ("draft", draft)):
            best = float("inf")
            for _ in range(rounds):
                t = time.process_time()
                V.patchify_image(data, p)
                best = min(best, time.process_time() - t)
            times[name] = best
        with Image.open(io.BytesIO(data)) as im:
            target = V._draft_target(im, base)
            im.draft(im.mode, target) if target else None
            decoded = im.size
        rows.append(
            {
                "source": [w, h],
                "grid": grid[0].tolist(),
                "draft_decode_size": list(decoded),
                "max_abs_diff": float(np.abs(full_pv - pv).max()),
                "mean_abs_diff": float(np.abs(full_pv - pv).mean()),
                "max_abs_diff_0_255": int(diff_u8.max()),
                "mean_abs_diff_0_255": float(diff_u8.mean()),
                "full_ms": times["full"] * 1e3,
                "draft_ms": times["draft"] * 1e3,
                "speedup": times["full"] / times["draft"],
            }
        )
    return {
        "rows": rows,
        "max_abs_diff": max(r["max_abs_diff"] for r in rows),
        "max_abs_diff_0_255": max(r["max_abs_diff_0_255"] for r in rows),
    }


def write_shards(root: Path, images: list[dict], samples: int, seed: int = 0) -> Path:
    """ChatML WebDataset shards, one image per sample (cycling through ``images``), short chats."""
    import webdataset as wds

    from energon_pack.energon.prepare import prepare_webdataset

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "px-%06d.tar"), maxcount=100, verbose=0) as sink:
        for i in range(samples):
            im = images[i % len(images)]
            conv = [
                {"role": "user", "content": "<image>\n" + " ".join(rng.choice(WORDS, int(rng.integers(5, 30))))},
                {"role": "assistant", "content": " ".join(rng.choice(WORDS, int(rng.integers(10, 80))))},
            ]
            ext = "jpg" if im["format"] == "JPEG" else "png"
            sink.write(
                {"__key__": f"{i:07d}", "json": json.dumps({"conversations": conv}).encode(), f"0.{ext}": im["data"]}
            )
    prepare_webdataset(root)
    return root


def bench_loader(path: Path, dtype: str, packs: int = 24, warmup: int = 4, seq_length: int = 8192) -> dict[str, Any]:
    """Real savable loader, 1 worker: worker CPU per sample / real token and pixel bytes per pack."""
    import psutil
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from energon_pack.bench.loader_bench import _wait_for_workers_to_exit
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    _wait_for_workers_to_exit()
    preset = get_preset("qwen2.5-vl", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, pixel_dtype=dtype)
    encoder = QwenVLPackingTaskEncoder(tokenizer=load_demo_tokenizer(), preset=preset, seq_length=seq_length)
    dataset = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1, seed_offset=0),
        task_encoder=encoder,
        packing_buffer_size=16,
        repeat=True,
    )
    me = psutil.Process()

    def worker_cpu() -> float:
        total = 0.0
        for child in me.children(recursive=True):
            try:
                t = child.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    loader = get_savable_loader(dataset)
    it = iter(loader)
    samples = real = pixel_bytes = pixel_rows = batch_bytes = 0
    cpu0 = None
    pv_dtype = None
    for k, batch in enumerate(it):
        if k == warmup:
            cpu0 = worker_cpu()
        if k >= warmup:
            samples += batch["num_segments"]
            real += batch["real_tokens"]
            pv = batch.get("pixel_values")
            if pv is not None:
                pixel_bytes += pv.numel() * pv.element_size()
                pixel_rows += pv.shape[0]
                pv_dtype = str(pv.dtype)
            batch_bytes += sum(v.numel() * v.element_size() for v in batch.values() if hasattr(v, "element_size"))
        if k + 1 == warmup + packs:
            break
    cpu = worker_cpu() - cpu0
    del it, loader
    return {
        "dtype": dtype,
        "tensor_dtype": pv_dtype,
        "packs": packs,
        "samples": samples,
        "real_tokens": real,
        "worker_cpu_ms_per_sample": cpu / samples * 1e3,
        "worker_cpu_us_per_real_token": cpu / real * 1e6,
        "pixel_mb_per_pack": pixel_bytes / packs / 2**20,
        "batch_mb_per_pack": batch_bytes / packs / 2**20,
        "patch_rows_per_pack": pixel_rows / packs,
    }


def main(
    out: str | Path = "bench_results/pixel.json",
    *,
    images: int = 46,
    rounds: int = 5,
    loader_packs: int = 24,
    loader_samples: int = 400,
    draft: bool = True,
    hf: bool = True,
    workdir: str | Path | None = None,
) -> dict[str, Any]:
    imgs = make_image_set(images)
    paths = bench_paths(imgs, rounds=rounds, hf=hf)
    result: dict[str, Any] = {"paths": paths}
    print(
        f"{paths['images']} images ({sum(i['format'] == 'JPEG' for i in imgs)} JPEG, "
        f"{sum(i['format'] == 'PNG' for i in imgs)} PNG), "
        f"{paths['patch_rows']} patch rows, Qwen2.5-VL bounds {MIN_PIXELS:,}..{MAX_PIXELS:,} px; "
        f"best of {rounds} interleaved rounds, one core"
    )
    print(f"{'path':<38}{'images/cpu-s':>13}{'vs HF':>8}{'vs floor':>10}")
    for name, r in paths["rows"].items():
        vs_hf = f"{r['vs_hf']:.2f}x" if r["vs_hf"] else "-"
        print(f"{name:<38}{r['images_per_cpu_s']:>13.1f}{vs_hf:>8}{r['vs_floor']:>9.0%}")
    if draft:
        result["draft"] = d = bench_draft()
        print("jpeg_draft on large JPEG photos (grids equal to full decode in every case):")
        for r in d["rows"]:
            print(
                f"  {r['source'][0]}x{r['source'][1]} -> grid {r['grid'][1]}x{r['grid'][2]}, "
                f"decoded at {r['draft_decode_size'][0]}x"
                f"{r['draft_decode_size'][1]}: max |diff| {r['max_abs_diff']:.3f} (normalised), "
                f"{r['max_abs_diff_0_255']}/255 "
                f"(mean {r['mean_abs_diff_0_255']:.2f}), {r['full_ms']:.0f} -> {r['draft_ms']:.0f} ms "
                f"({r['speedup']:.1f}x)"
            )
    if loader_packs:
        tmp = Path(tempfile.mkdtemp(prefix="pixel_bench_", dir=workdir))
        try:
            shards = write_shards(tmp / "shards", imgs, loader_samples)
            result["loader"] = rows = [
                bench_loader(shards, d, packs=loader_packs) for d in ("float32", "bfloat16", "uint8")
            ]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        f32 = rows[0]["pixel_mb_per_pack"]
        print(f"real loader (1 worker, width 8192, {loader_packs} packs after warm-up):")
        print(
            f"{'pixel_dtype':<12}{'tensor':>16}{'worker ms/sample':>18}{'us/real token':>15}"
            f"{'pixel MB/pack':>15}{'vs f32':>8}{'batch MB/pack':>15}"
        )
        for r in rows:
            print(
                f"{r['dtype']:<12}{r['tensor_dtype']:>16}{r['worker_cpu_ms_per_sample']:>18.2f}{r['worker_cpu_us_per_real_token']:>15.2f}"
                f"{r['pixel_mb_per_pack']:>15.1f}{r['pixel_mb_per_pack'] / f32:>8.2f}{r['batch_mb_per_pack']:>15.1f}"
            )
    rows = paths["rows"]
    f32 = rows["ours/float32"]
    targets = [
        {
            "name": "float32 vs HF (per core)",
            "value": f32["vs_hf"],
            "target": f">= {TARGETS['f32_vs_hf']}",
            "met": f32["vs_hf"] is not None and f32["vs_hf"] >= TARGETS["f32_vs_hf"],
        },
        {
            "name": "float32 vs decode floor",
            "value": f32["vs_floor"],
            "target": f">= {TARGETS['f32_vs_floor']}",
            "met": f32["vs_floor"] >= TARGETS["f32_vs_floor"],
        },
        {
            "name": "bfloat16 faster than float32",
            "value": rows["ours/bfloat16"]["images_per_cpu_s"] / f32["images_per_cpu_s"],
            "target": "> 1",
            "met": rows["ours/bfloat16"]["images_per_cpu_s"] > f32["images_per_cpu_s"],
        },
        {
            "name": "uint8 faster than float32",
            "value": rows["ours/uint8"]["images_per_cpu_s"] / f32["images_per_cpu_s"],
            "target": "> 1",
            "met": rows["ours/uint8"]["images_per_cpu_s"] > f32["images_per_cpu_s"],
        },
    ]
    if "loader" in result:
        lr = result["loader"]
        for r, goal in ((lr[1], 0.5), (lr[2], 0.25)):
            ratio = r["pixel_mb_per_pack"] / lr[0]["pixel_mb_per_pack"]
            targets.append(
                {
                    "name": f"{r['dtype']} pixel bytes/pack vs f32",
                    "value": ratio,
                    "target": f"<= {goal}",
                    "met": ratio <= goal + 0.02,
                }
            )
    result["targets"] = targets
    print(f"{'target':<34}{'value':>8}{'goal':>8}  met")
    for t in targets:
        value = f"{t['value']:.2f}" if t["value"] is not None else "n/a"
        print(f"{t['name']:<34}{value:>8}{t['target']:>8}  {'yes' if t['met'] else 'NO'}")
    print(write_report(out, result))
    return result


if __name__ == "__main__":
    main()
