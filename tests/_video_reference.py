"""The reference side of tests/video/test_video_parity.py, run in a subprocess: qwen-vl-utils' fetch_video
(decord reader) then the transformers Qwen-VL processor (video processor + the official chat template,
the real tokenizer) on each case, as Qwen's model cards call them. Results go to a torch file.

A subprocess because the reference needs torchvision, installed by setup.sh into
.venv/video-reference/ (its wheel here is built against CUDA torch: its C ops cannot load on the
CPU torch, so the two op schemas its import registers fakes for are defined first, and only its
pure-Python transforms run). Usage: python _video_reference.py cases.json out.pt
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / ".venv" / "video-reference"


def import_torchvision():
    """torchvision, importable on CPU torch even when its C extension is not (see module doc)."""
    import torch

    try:
        import torchvision  # noqa: F401
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "DEF")  # noqa: F841 (kept alive below)
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import_torchvision.lib = lib
        import torchvision  # noqa: F401


def processor_for(name, preset):
    import transformers as tf

    from energon_pack.chat.qwen_vocab import load_qwen_hf_tokenizer

    template = (
        ROOT
        / "tests"
        / "data"
        / "chat_templates"
        / {
            "qwen2-vl": "qwen2_vl_instruct.jinja",
            "qwen2.5-vl": "qwen2_5_vl_instruct.jinja",
            "qwen3-vl": "qwen3_vl_instruct.jinja",
        }[name]
    ).read_text()
    common = dict(
        patch_size=preset.patch_size,
        temporal_patch_size=preset.temporal_patch_size,
        merge_size=preset.merge_size,
        image_mean=list(preset.image_mean),
        image_std=list(preset.image_std),
    )
    size = {"shortest_edge": preset.video_min_pixels, "longest_edge": preset.video_max_pixels}
    tok = load_qwen_hf_tokenizer(name)
    if name == "qwen3-vl":
        video = tf.Qwen3VLVideoProcessor(size=size, **common)
        image = tf.Qwen2VLImageProcessor(**common)
        return tf.Qwen3VLProcessor(image_processor=image, tokenizer=tok, video_processor=video, chat_template=template)
    video = tf.Qwen2VLVideoProcessor(size=size, **common)
    image = tf.Qwen2VLImageProcessor(**common)
    cls = tf.Qwen2VLProcessor if name == "qwen2-vl" else tf.Qwen2_5_VLProcessor
    return cls(image_processor=image, tokenizer=tok, video_processor=video, chat_template=template)


def main(cases_path, out_path):
    sys.path.insert(0, str(REFERENCE))
    os.environ["FORCE_QWENVL_VIDEO_READER"] = "decord"
    import_torchvision()
    import torch
    from qwen_vl_utils import vision_process as qvu
    from transformers.video_utils import VideoMetadata

    from energon_pack.qwen_vl import get_preset

    cases = json.loads(Path(cases_path).read_text())
    processors, results = {}, []
    for case in cases:
        name = case["preset"]
        preset = get_preset(name)
        if name not in processors:
            processors[name] = processor_for(name, preset)
        proc = processors[name]
        ele = {
            "video": case["path"],
            "fps": case["fps"],
            "min_frames": case["min_frames"],
            "max_frames": case["max_frames"],
            "min_pixels": preset.video_min_pixels,
            "max_pixels": preset.video_max_pixels,
            "total_pixels": case["max_video_tokens"] * preset.factor**2 * 0.9,
        }
        try:  # decord's own error (fetch_video would retry with torchvision's read_video, gone in 0.28)
            qvu._read_video_decord(ele)
        except Exception as exc:  # the reference refuses it: the test expects a skip from us
            results.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        (video, meta), sample_fps = qvu.fetch_video(
            ele, image_patch_size=preset.patch_size, return_video_sample_fps=True, return_video_metadata=True
        )
        messages = [
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": case["question"]}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        ]
        text = proc.apply_chat_template(messages, tokenize=False)
        kwargs = (
            {"do_resize": False, "cap_pixels_per_frame": True} if name == "qwen3-vl" else {"cap_pixels_per_frame": True}
        )
        out = proc(
            text=[text],
            videos=[video],
            video_metadata=[VideoMetadata(**meta)],
            do_sample_frames=False,
            return_tensors="pt",
            **kwargs,
        )
        result = {
            "indices": [int(i) for i in meta["frames_indices"]],
            "total": int(meta["total_num_frames"]),
            "fps": float(meta["fps"]),
            "sample_fps": float(sample_fps),
            "size": list(video.shape[-2:]),
            "grid": out["video_grid_thw"][0].tolist(),
            "input_ids": out["input_ids"][0].tolist(),
        }
        if "second_per_grid_ts" in out:
            result["second_per_grid_ts"] = [float(x) for x in out["second_per_grid_ts"]]
        if case.get("pixels"):
            result["pixels"] = out["pixel_values_videos"].float()
        results.append(result)
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
