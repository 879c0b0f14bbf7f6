"""Memory stress: an adversarial stream of huge images and long videos through the real loader.

:func:`run_memory` writes WebDataset shards where every other sample is a ``side`` x ``side``
JPEG (8000 x 8000 by default: 192 MB once decoded) or a ``frames``-frame video (Bridge's
pickled ``videos`` layout), between small text samples, and streams them with ``workers``
loader workers (carry mode). It measures the peak RSS summed over the worker processes (the
same :class:`~energon_pack.bench.loader_bench.RssSampler` as the benchmarks) and, first, a
*baseline*: the same loader on the same number of small text-only samples.

The bound it checks (``bound_mb``) is::

    baseline + workers * (DECODE_FACTOR * side * side * 3          # one image being decoded
                          + IN_FLIGHT_PACKS * max_pack_pixel_bytes)  # packs queued to the trainer

Why: the packing buffer holds *encoded bytes* (lengths come from headers), so buffered huge
images cost their file size, not pixels; a worker decodes one selected sample at a time
(decoded RGB, its RGB conversion, the numpy copy and PIL's resize input: at most
``DECODE_FACTOR`` = 4 copies of ``side * side * 3`` bytes live at once); a video is truncated
to ``max_num_frames`` before decoding and its frames are at most ``video_max_pixels`` after
resize; and each worker has at most ``prefetch_factor`` (2) finished packs queued plus one
being built and one being pickled (``IN_FLIGHT_PACKS`` = 4), each at most
``seq_length * merge_size**2`` patch rows of float32 pixel values. Nothing in the bound grows
with the stream length or with ``packing_buffer_size``: a leak or pixels kept in the buffer
would break it as the stream grows.
"""

from __future__ import annotations

import io
import json
import pickle
import time
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

warnings.filterwarnings("ignore", message=".*pin_memory.*")

DECODE_FACTOR = 2
VIDEO_COPIES = 2
IN_FLIGHT_PACKS = 4
FRAME_W, FRAME_H = 640, 480
MB = 2**20


def _big_jpeg(side: int) -> bytes:
    yy, xx = np.mgrid[0:side, 0:side].astype(np.uint16)
    rgb = np.stack([(xx // 32) % 256, (yy // 32) % 256, ((xx + yy) // 64) % 256], -1).astype(np.uint8)
    del yy, xx
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=50)
    return buf.getvalue()


def _frame(i: int, w: int = FRAME_W, h: int = FRAME_H) -> bytes:
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([(xx + i) % 256, (yy * 2) % 256, np.full_like(xx, (i * 7) % 256)], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=60)
    return buf.getvalue()


def _chat(user: str) -> bytes:
    return json.dumps([{"role": "user", "content": user}, {"role": "assistant", "content": "described " * 20}]).encode()


def _write(root: Path, items: list[dict]) -> None:
    import webdataset as wds

    from energon_pack.energon.prepare import prepare_webdataset

    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "mem-%06d.tar"), maxcount=50, verbose=0) as sink:
        for item in items:
            sink.write(item)
    prepare_webdataset(root)


def _measure(root: Path, preset, seq_length: int, workers: int, buffer: int, **encoder_kwargs) -> dict:
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack.bench.loader_bench import RssSampler, _wait_for_workers_to_exit
    from energon_pack.packing import PackingStatsTracker
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    _wait_for_workers_to_exit()
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=seq_length, **encoder_kwargs)
    ds = get_train_dataset(
        str(root),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=buffer,
        repeat=False,
    )
    tracker = PackingStatsTracker()
    samples = packs = 0
    max_pack_bytes = 0
    start = time.perf_counter()
    with RssSampler(interval=0.01) as rss:
        loader = get_loader(ds)
        for b in loader:
            packs += 1
            samples += b["num_segments"]
            tracker.update(b["packing_stats"])
            pack_bytes = sum(
                int(b[k].numel()) * b[k].element_size()
                for k in ("pixel_values", "pixel_values_videos")
                if b.get(k) is not None
            )
            max_pack_bytes = max(max_pack_bytes, pack_bytes)
            del b
        del loader
    return {
        "packs": packs,
        "samples": samples,
        "skips": dict(tracker.total.skips),
        "peak_worker_rss_mb": round(rss.peak_workers / MB, 1),
        "peak_main_rss_mb": round(rss.peak_self / MB, 1),
        "max_pack_pixel_mb": round(max_pack_bytes / MB, 1),
        "seconds": round(time.perf_counter() - start, 1),
    }


def run_memory(
    out_dir: str | Path,
    *,
    n_images: int = 6,
    n_videos: int = 4,
    side: int = 8000,
    frames: int = 240,
    preset: str = "qwen2-vl",
    seq_length: int = 16384,
    workers: int = 2,
    buffer: int = 64,
) -> dict:
    """Stream ``n_images`` ``side``-pixel JPEGs and ``n_videos`` ``frames``-frame videos (between
    as many small text samples) and return peak worker RSS, the baseline and the bound (MB)."""
    from energon_pack.chat import ChatConfig
    from energon_pack.qwen_vl import get_preset

    out = Path(out_dir)
    vp = get_preset(preset)
    big = _big_jpeg(side)
    video = pickle.dumps([[_frame(i) for i in range(frames)]])
    adversarial, baseline = [], []
    n = 0
    for i in range(max(n_images, n_videos)):
        for kind in ("image", "video"):
            if (kind == "image" and i >= n_images) or (kind == "video" and i >= n_videos):
                continue
            if kind == "image":
                adversarial.append(
                    {"__key__": f"{n:06d}", "json": _chat(f"<image> sample {n}: describe it."), "0.jpg": big}
                )
            else:
                adversarial.append(
                    {"__key__": f"{n:06d}", "json": _chat(f"<video> sample {n}: what happens?"), "videos": video}
                )
            adversarial.append({"__key__": f"{n + 1:06d}", "json": _chat(f"text {n}")})
            baseline.extend(
                [
                    {"__key__": f"{n:06d}", "json": _chat(f"text {n} a")},
                    {"__key__": f"{n + 1:06d}", "json": _chat(f"text {n}")},
                ]
            )
            n += 2
    _write(out / "baseline", baseline)
    _write(out / "adversarial", adversarial)
    base = _measure(out / "baseline", vp, seq_length, workers, buffer)
    adv = _measure(out / "adversarial", vp, seq_length, workers, buffer)
    max_pack_pixel_bytes = seq_length * vp.merge_size**2 * 3 * vp.temporal_patch_size * vp.patch_size**2 * 4
    max_frames = ChatConfig().max_num_frames
    image_decode = DECODE_FACTOR * side * side * 3
    video_decode = (max_frames + 1) * vp.video_max_pixels * 3 * 4 * VIDEO_COPIES + 2 * FRAME_W * FRAME_H * 3
    per_worker = max(image_decode, video_decode) + IN_FLIGHT_PACKS * max_pack_pixel_bytes
    bound_mb = base["peak_worker_rss_mb"] + workers * per_worker / MB
    return {
        "preset": preset,
        "max_pixels": vp.max_pixels,
        "video_max_pixels": vp.video_max_pixels,
        "max_num_frames": ChatConfig().max_num_frames,
        "side": side,
        "frames": frames,
        "n_images": n_images,
        "n_videos": n_videos,
        "image_file_mb": round(len(big) / MB, 2),
        "video_file_mb": round(len(video) / MB, 2),
        "decoded_image_mb": round(side * side * 3 / MB, 1),
        "workers": workers,
        "buffer": buffer,
        "seq_length": seq_length,
        "baseline": base,
        "adversarial": adv,
        "peak_worker_rss_mb": adv["peak_worker_rss_mb"],
        "growth_over_baseline_mb": round(adv["peak_worker_rss_mb"] - base["peak_worker_rss_mb"], 1),
        "bound_mb": round(bound_mb, 1),
        "bound": (
            f"baseline + workers * (max(image decode {image_decode / MB:.0f} MB, "
            f"video decode {video_decode / MB:.0f} MB) + {IN_FLIGHT_PACKS} packs x {max_pack_pixel_bytes / MB:.0f} MB)"
        ),
        "within_bound": adv["peak_worker_rss_mb"] <= bound_mb,
        # what holding decoded pixels in the buffer would cost instead (the design avoids it)
        "decoded_buffer_would_be_mb": round(min(buffer, n_images) * side * side * 3 / MB, 1),
    }


if __name__ == "__main__":  # pragma: no cover - manual runs
    import argparse
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=6)
    ap.add_argument("--videos", type=int, default=4)
    ap.add_argument("--side", type=int, default=8000)
    ap.add_argument("--frames", type=int, default=240)
    ap.add_argument("--preset", default="qwen2-vl")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(
            json.dumps(
                run_memory(
                    tmp,
                    n_images=args.images,
                    n_videos=args.videos,
                    side=args.side,
                    frames=args.frames,
                    preset=args.preset,
                ),
                indent=1,
            )
        )
