"""Memory stress for video files: 10-minute videos (``KEY.0.mp4``) through the real loader's workers.

:func:`run_video_memory` writes ``n_videos`` samples each holding a ``seconds``-long video file
between small text samples, streams them with ``workers`` loader workers (carry mode) and compares
the peak RSS summed over the workers with a text-only baseline (the harness of
:mod:`harness.memory`). The bound it checks::

    baseline + workers * (buffer * file bytes                 # the packing buffer: encoded files only
                          + 2 * width * height * 3             # one decoded source frame + its RGB copy
                          + max_pack_pixel_bytes / 4           # a pack's sampled frames, uint8, before layout
                          + IN_FLIGHT_PACKS * max_pack_pixel_bytes)  # packs queued to the trainer

Nothing in it depends on the video's length: only the sampled frames are decoded, one at a time,
and a pack's patch rows are capped by ``seq_length``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .memory import IN_FLIGHT_PACKS, MB, _chat, _measure, _write


def run_video_memory(
    out_dir: str | Path,
    *,
    n_videos: int = 4,
    seconds: int = 600,
    fps: int = 30,
    width: int = 64,
    height: int = 48,
    preset: str = "qwen2-vl",
    seq_length: int = 16384,
    workers: int = 2,
    buffer: int = 8,
    max_frames: int = 64,
) -> dict:
    """Stream ``n_videos`` ``seconds``-long videos (between as many text samples); return peak worker
    RSS, the baseline and the bound (MB). ``max_frames`` caps the sampled frames (so a video fits
    ``seq_length``; qwen-vl-utils' 768 would need a wider pack)."""
    from energon_pack.bench.video_files import write_video
    from energon_pack.qwen_vl import get_preset
    from energon_pack.video import FrameSampling

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vp = get_preset(preset)
    path = out / "long.mp4"
    write_video(path, seconds * fps, fps, width, height, options={"preset": "ultrafast"})
    video = path.read_bytes()
    adversarial, baseline = [], []
    for i in range(n_videos):
        adversarial += [
            {"__key__": f"{2 * i:06d}", "json": _chat(f"<video> sample {i}: what happens?"), "0.mp4": video},
            {"__key__": f"{2 * i + 1:06d}", "json": _chat(f"text {i}")},
        ]
        baseline += [
            {"__key__": f"{2 * i:06d}", "json": _chat(f"text {i} a")},
            {"__key__": f"{2 * i + 1:06d}", "json": _chat(f"text {i}")},
        ]
    _write(out / "baseline", baseline)
    _write(out / "adversarial", adversarial)
    sampling = FrameSampling(max_frames=max_frames)
    base = _measure(out / "baseline", vp, seq_length, workers, buffer, video_sampling=sampling)
    adv = _measure(out / "adversarial", vp, seq_length, workers, buffer, video_sampling=sampling)
    max_pack_pixel_bytes = seq_length * vp.merge_size**2 * vp.patch_dim * 4
    per_worker = (
        buffer * len(video)
        + 2 * width * height * 3
        + max_pack_pixel_bytes // 4
        + IN_FLIGHT_PACKS * max_pack_pixel_bytes
    )
    bound_mb = base["peak_worker_rss_mb"] + workers * per_worker / MB
    return {
        "preset": preset,
        "seconds": seconds,
        "fps": fps,
        "frames_in_file": seconds * fps,
        "width": width,
        "height": height,
        "video_file_mb": round(len(video) / MB, 2),
        "max_frames": max_frames,
        "n_videos": n_videos,
        "workers": workers,
        "buffer": buffer,
        "seq_length": seq_length,
        "baseline": base,
        "adversarial": adv,
        "peak_worker_rss_mb": adv["peak_worker_rss_mb"],
        "growth_over_baseline_mb": round(adv["peak_worker_rss_mb"] - base["peak_worker_rss_mb"], 1),
        "bound_mb": round(bound_mb, 1),
        "bound": (
            f"baseline + workers * ({buffer} x {len(video) / MB:.1f} MB files + a decoded frame + "
            f"{max_pack_pixel_bytes / 4 / MB:.0f} MB uint8 frames + {IN_FLIGHT_PACKS} packs x "
            f"{max_pack_pixel_bytes / MB:.0f} MB)"
        ),
        "within_bound": adv["peak_worker_rss_mb"] <= bound_mb,
    }


if __name__ == "__main__":  # pragma: no cover - manual runs
    import argparse
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--videos", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--height", type=int, default=48)
    ap.add_argument("--preset", default="qwen2-vl")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(
            json.dumps(
                run_video_memory(
                    tmp,
                    n_videos=args.videos,
                    seconds=args.seconds,
                    width=args.width,
                    height=args.height,
                    preset=args.preset,
                ),
                indent=1,
            )
        )
