"""Video benchmark (issue 24, part 5): our header plan + chosen-frame decode + resize + patchify against
qwen-vl-utils' reader (decord) + transformers' Qwen2.5-VL video processor, on the same files, one core
each (the process is pinned to one CPU); and peak RSS of each side on a 10-minute video.

    .venv/bin/python scripts/video_bench.py --out docs/video_bench.json

Needs .venv/video-reference (setup.sh). Videos are generated once into --cache (H.264, veryfast, crf
28, :mod:`energon_pack.bench.video_files`). Each measurement runs in a fresh pinned subprocess; times are the median of
--repeats runs after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [  # name, seconds, fps, width, height
    ("10s_640x360_30fps", 10, 30, 640, 360),
    ("30s_640x360_30fps", 30, 30, 640, 360),
    ("60s_640x360_25fps", 60, 25, 640, 360),
    ("10s_1280x720_30fps", 10, 30, 1280, 720),
]
LONG = ("600s_480x270_30fps", 600, 30, 480, 270)  # the RSS file: 18,000 frames


def make_videos(cache: Path, specs) -> list[Path]:
    from energon_pack.bench.video_files import write_video

    cache.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, seconds, fps, w, h in specs:
        path = cache / f"{name}.mp4"
        paths.append(path)
        if not path.exists():
            tmp = path.with_suffix(".tmp.mp4")
            write_video(tmp, seconds * fps, fps, w, h, options={"preset": "veryfast", "crf": "28"})
            tmp.rename(path)
    return paths


OURS = r"""
import os, sys, time, json, resource
os.sched_setaffinity(0, {int(sys.argv[2])})
import torch; torch.set_num_threads(1)
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.video import plan_video, pending_video_file
from energon_pack.qwen_vl import vision as V
from energon_pack.video import probe_video
preset = get_preset("qwen2.5-vl"); V.warm_pixel_path(preset)
out = []
for path in json.loads(sys.argv[1]):
    data = open(path, "rb").read()
    t0 = time.perf_counter()
    plan = plan_video(probe_video(data), preset)
    t1 = time.perf_counter()
    rows, grid = pending_video_file(data, plan, preset)
    pixels = rows.to_tensor()
    t2 = time.perf_counter()
    out.append({"path": path, "seconds": t2 - t0, "plan_seconds": t1 - t0, "frames": plan.num_frames,
                "grid": list(plan.grid_thw), "shape": list(pixels.shape)})
    del rows, pixels
print(json.dumps({"runs": out, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

REFERENCE = r"""
import os, sys, time, json, resource
os.sched_setaffinity(0, {int(sys.argv[2])})
sys.path.insert(0, sys.argv[3]); sys.path.insert(0, sys.argv[4])
os.environ["FORCE_QWENVL_VIDEO_READER"] = "decord"
import torch; torch.set_num_threads(1)
from _video_reference import import_torchvision
import_torchvision()
import transformers as tf
from transformers.video_utils import VideoMetadata
from qwen_vl_utils import vision_process as qvu
from energon_pack.qwen_vl import get_preset
p = get_preset("qwen2.5-vl")
proc = tf.Qwen2VLVideoProcessor(size={"shortest_edge": p.video_min_pixels, "longest_edge": p.video_max_pixels},
                                patch_size=14, temporal_patch_size=2, merge_size=2)
out = []
for path in json.loads(sys.argv[1]):
    t0 = time.perf_counter()
    (video, meta), fps = qvu.fetch_video({"video": path}, image_patch_size=14, return_video_sample_fps=True,
                                         return_video_metadata=True)
    res = proc(videos=[video], video_metadata=[VideoMetadata(**meta)], do_sample_frames=False,
               cap_pixels_per_frame=True, return_tensors="pt")
    t2 = time.perf_counter()
    out.append({"path": path, "seconds": t2 - t0, "frames": len(meta["frames_indices"]),
                "grid": res["video_grid_thw"][0].tolist(), "shape": list(res["pixel_values_videos"].shape)})
    del video, res
print(json.dumps({"runs": out, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_side(code: str, paths: list[Path], cpu: int) -> dict:
    args = [
        sys.executable,
        "-c",
        code,
        json.dumps([str(p) for p in paths]),
        str(cpu),
        str(ROOT / ".venv" / "video-reference"),
        str(ROOT / "tests"),
    ]
    done = subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/video_bench.json")
    ap.add_argument("--cache", default="/tmp/energon_pack_video_bench")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=0, help="the core each side is pinned to")
    ap.add_argument("--skip-long", action="store_true", help="no 10-minute RSS run")
    args = ap.parse_args()
    paths = make_videos(Path(args.cache), FILES)
    rows = []
    for path in paths:
        row = {"file": path.stem}
        for side, code in (("ours", OURS), ("reference", REFERENCE)):
            runs = [run_side(code, [path, path], args.cpu)["runs"][1] for _ in range(args.repeats)]  # 2nd: warm
            row[side] = {
                "seconds": statistics.median(r["seconds"] for r in runs),
                "frames": runs[0]["frames"],
                "grid": runs[0]["grid"],
                "shape": runs[0]["shape"],
            }
        assert row["ours"]["grid"] == row["reference"]["grid"], row
        row["speedup"] = row["reference"]["seconds"] / row["ours"]["seconds"]
        rows.append(row)
        print(
            f"{row['file']:22s} frames {row['ours']['frames']:4d} grid {row['ours']['grid']}  ours "
            f"{row['ours']['seconds'] * 1e3:8.1f} ms  reference {row['reference']['seconds'] * 1e3:8.1f} ms  "
            f"x{row['speedup']:.2f}",
            flush=True,
        )
    result = {
        "preset": "qwen2.5-vl",
        "cores_per_side": 1,
        "repeats": args.repeats,
        "files": rows,
        "machine": os.uname().machine,
        "cpus": os.cpu_count(),
    }
    if not args.skip_long:
        long = make_videos(Path(args.cache), [LONG])
        result["long_video"] = {"file": LONG[0]}
        for side, code in (("ours", OURS), ("reference", REFERENCE)):
            t0 = time.perf_counter()
            res = run_side(code, long, args.cpu)
            run = res["runs"][0]
            result["long_video"][side] = {
                "seconds": run["seconds"],
                "frames": run["frames"],
                "grid": run["grid"],
                "max_rss_mb": res["max_rss_mb"],
                "wall_with_startup": time.perf_counter() - t0,
            }
            print(
                f"{LONG[0]} {side}: {run['frames']} frames {run['grid']} {run['seconds']:.1f} s, peak RSS "
                f"{res['max_rss_mb']:.0f} MB",
                flush=True,
            )
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
