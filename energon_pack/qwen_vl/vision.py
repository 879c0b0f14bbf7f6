"""Qwen-VL resize rules, visual token counts from sizes alone, and HF-identical patchify.

Counting (``visual_token_count`` / ``video_token_count``) needs only (height, width[, frames]):
the packer can size a sample from its image headers (:func:`energon_pack.pixels.image_size_from_bytes`) and decode
pixels later, only for the samples it actually emits. The pixels themselves (decode, PIL-exact
resize, patch layout, the backend dispatch) are the model-neutral engine's,
:mod:`energon_pack.pixels`; this module decides the sizes and grids.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

from .. import pixels
from ..errors import SampleSkipped
from ..pixels.backend import RESAMPLE
from ..pixels.decode import decode_rgb, draft_target, open_image, to_rgb_image
from ..pixels.layout import frames_grid
from ..pixels.rows import PendingPatchRows
from .presets import VisionPreset

MAX_ASPECT_RATIO = 200


def _check_aspect_ratio(height: int, width: int) -> None:
    """transformers' refusal of a side ratio above :data:`MAX_ASPECT_RATIO`, word for word."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 14 * 14 * 4 * 1280
) -> tuple[int, int]:
    """Resized (height, width), both multiples of ``factor``, pixels within [min, max], aspect kept.

    Identical to transformers' ``qwen2_vl.image_processing_qwen2_vl.smart_resize`` (Python
    ``round`` = banker's rounding included). Raises ValueError when the aspect ratio exceeds 200.
    """
    _check_aspect_ratio(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def video_smart_resize(
    num_frames: int,
    height: int,
    width: int,
    temporal_factor: int = 2,
    factor: int = 32,
    min_pixels: int = 128 * 32 * 32,
    max_pixels: int = 32 * 32 * 768,
) -> tuple[int, int]:
    """Qwen3-VL's video resize (transformers ``qwen3_vl.video_processing_qwen3_vl.smart_resize``).

    The pixel budget covers all frames (t_bar * h * w); sides below ``factor`` are scaled up first.
    Raises ValueError for fewer frames than ``temporal_factor`` or aspect ratio > 200.
    """
    if num_frames < temporal_factor:
        raise ValueError(f"t:{num_frames} must be larger than temporal_factor:{temporal_factor}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height = int(height * scale)
        width = int(width * scale)
    _check_aspect_ratio(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _check_size(height: int, width: int, what: str) -> None:
    if height <= 0 or width <= 0:
        raise SampleSkipped("corrupt_image", f"{what} has zero size ({width}x{height})")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise SampleSkipped(
            "extreme_aspect_ratio",
            f"{what} {width}x{height} has aspect ratio > {MAX_ASPECT_RATIO} (Qwen-VL resize refuses it)",
        )


def with_max_pixels(preset: VisionPreset, max_pixels: int | None, *, video: bool = False) -> VisionPreset:
    """``preset`` with one medium's own pixel cap (``overlength="fit"``): ``max_pixels`` of an image, or
    ``video_max_pixels`` of a frame-list video; ``preset`` itself when None. HF's processor given the same cap
    resizes to the same size."""
    if max_pixels is None:
        return preset
    return dataclasses.replace(preset, **{"video_max_pixels" if video else "max_pixels": max_pixels})


def resized_image_size(height: int, width: int, preset: VisionPreset) -> tuple[int, int]:
    """(height, width) an image of this size is resized to; SampleSkipped for zero size / aspect > 200."""
    _check_size(height, width, "image")
    return smart_resize(height, width, preset.factor, preset.min_pixels, preset.max_pixels)


def image_grid_thw(height: int, width: int, preset: VisionPreset) -> tuple[int, int, int]:
    """The image's (t, h, w) patch grid, t = 1, computed from its size alone."""
    rh, rw = resized_image_size(height, width, preset)
    return 1, rh // preset.patch_size, rw // preset.patch_size


def visual_token_count(height: int, width: int, preset: VisionPreset) -> int:
    """LLM tokens (``<|image_pad|>`` count) of one image: t*h*w / merge_size^2, from its size alone."""
    t, h, w = image_grid_thw(height, width, preset)
    return t * h * w // (preset.merge_size**2)


def resized_video_size(num_frames: int, height: int, width: int, preset: VisionPreset) -> tuple[int, int]:
    """(height, width) every frame of a video is resized to (per the preset's version rule)."""
    if num_frames <= 0:
        raise SampleSkipped("empty_video", "video has no frames")
    _check_size(height, width, "video frame")
    if preset.rope_style == "qwen3":
        if num_frames < preset.temporal_patch_size:
            raise SampleSkipped(
                "video_too_few_frames",
                f"{num_frames} frame(s) < temporal_patch_size {preset.temporal_patch_size} (Qwen3-VL needs >=)",
            )
        try:
            return video_smart_resize(
                num_frames,
                height,
                width,
                preset.temporal_patch_size,
                preset.factor,
                preset.video_min_pixels,
                preset.video_max_pixels,
            )
        except ValueError as exc:  # aspect ratio after upscaling
            raise SampleSkipped("extreme_aspect_ratio", str(exc)) from None
    return smart_resize(height, width, preset.factor, preset.video_min_pixels, preset.video_max_pixels)


def video_grid_thw(num_frames: int, height: int, width: int, preset: VisionPreset) -> tuple[int, int, int]:
    """The video's (t, h, w) grid; frames are padded (last frame repeated) to a multiple of temporal_patch_size."""
    rh, rw = resized_video_size(num_frames, height, width, preset)
    grid_t = -(-num_frames // preset.temporal_patch_size)
    return grid_t, rh // preset.patch_size, rw // preset.patch_size


def video_token_count(num_frames: int, height: int, width: int, preset: VisionPreset) -> int:
    """``<|video_pad|>`` tokens of one video: t*h*w / merge_size^2 (Qwen3-VL adds timestamp text; see chat)."""
    t, h, w = video_grid_thw(num_frames, height, width, preset)
    return t * h * w // (preset.merge_size**2)


def second_per_grid_t(preset: VisionPreset, fps: float | None = None) -> float:
    """Seconds covered by one temporal grid step: temporal_patch_size / fps (of the sampled frames)."""
    return preset.temporal_patch_size / float(fps if fps is not None else preset.video_fps)


def _resize_normalize(rgb: np.ndarray, height: int, width: int, preset: VisionPreset) -> np.ndarray:
    """uint8 HWC -> float32 CHW resized to (height, width), rescaled by 1/255 and normalised.

    The float reference (the pre-issue-13 path); :func:`energon_pack.pixels.normalization_lut` computes the same
    float32 operations once per channel value."""
    if rgb.shape[0] != height or rgb.shape[1] != width:
        rgb = np.asarray(Image.fromarray(rgb).resize((width, height), resample=RESAMPLE[preset.resample]))
    arr = rgb.astype(np.float32) * np.float32(1 / 255)
    mean = np.asarray(preset.image_mean, dtype=np.float32)
    std = np.asarray(preset.image_std, dtype=np.float32)
    arr = (arr - mean) / std
    return np.ascontiguousarray(arr.transpose(2, 0, 1), dtype=np.float32)


def _patchify(frames: np.ndarray, preset: VisionPreset) -> tuple[np.ndarray, tuple[int, int, int]]:
    """float [T, C, H, W] (T a multiple of temporal_patch_size) -> [t*h*w, C*tp*p*p] in HF's order
    (the float reference layout; the pixel path lays out uint8 with :func:`energon_pack.pixels.layout`)."""
    p, m, tp = preset.patch_size, preset.merge_size, preset.temporal_patch_size
    num_frames, channel, height, width = frames.shape
    grid_t, grid_h, grid_w = num_frames // tp, height // p, width // p
    patches = frames.reshape(grid_t, tp, channel, grid_h // m, m, p, grid_w // m, m, p)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w, channel * tp * p * p)
    return np.ascontiguousarray(flat, dtype=np.float32), (grid_t, grid_h, grid_w)


def reference_patchify_image(image: Image.Image | bytes, preset: VisionPreset) -> tuple[np.ndarray, np.ndarray]:
    """The pre-issue-13 float32 path (normalise in float, 9-axis float transpose): the reference
    the fused path is tested against. Full decode, float32 whatever ``preset.pixel_dtype``."""
    rgb = to_rgb_image(open_image(image))
    rh, rw = resized_image_size(rgb.height, rgb.width, preset)
    if (rgb.height, rgb.width) != (rh, rw):
        rgb = rgb.resize((rw, rh), resample=RESAMPLE[preset.resample])
    chw = _resize_normalize(np.asarray(rgb, dtype=np.uint8), rh, rw, preset)
    frames = np.broadcast_to(chw[None], (preset.temporal_patch_size, *chw.shape))
    pixel_values, grid = _patchify(frames, preset)
    return pixel_values, np.asarray([grid], dtype=np.int64)


def _resized_size(preset: VisionPreset):
    """(height, width) -> resized (height, width) of an image under ``preset`` (the pixel engine's ``ResizedSize``)."""
    return lambda height, width: resized_image_size(height, width, preset)


def _draft_target(img: Image.Image, preset: VisionPreset) -> tuple[int, int] | None:
    """(width, height) JPEG draft mode is asked for under ``preset`` (see :func:`energon_pack.pixels.draft_target`)."""
    return draft_target(img, _resized_size(preset))


def decode_for_patchify(image: Image.Image | bytes, preset: VisionPreset) -> tuple[Image.Image, int, int]:
    """(upright 8-bit RGB image, target height, target width) under ``preset``'s resize rule
    (JPEG draft decoding with ``preset.jpeg_draft``; see :func:`energon_pack.pixels.decode_rgb`)."""
    return decode_rgb(image, _resized_size(preset), preset.jpeg_draft)


def warm_pixel_path(preset: VisionPreset) -> bool:
    """Load (or compile) the pixel kernels and verify them against PIL now, e.g. in the main
    process before data-loader workers fork, so no worker pays for it. True if they are used."""
    return pixels.warm(preset)


def _image_frames(
    image: Image.Image | bytes, preset: VisionPreset, kernels, max_pixels: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [1, H, W, 3] resized like HF (PIL's bytes), image_grid_thw int64 [1, 3]); ``max_pixels``: this
    image's own cap (a fitted sample's), else the preset's."""
    rgb, rh, rw = decode_for_patchify(image, with_max_pixels(preset, max_pixels))
    frames = pixels.resize(rgb, rh, rw, preset.resample, kernels is not None)[None]
    return frames, np.asarray([frames_grid(frames, preset)], dtype=np.int64)


def patchify_image(image: Image.Image | bytes, preset: VisionPreset) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values [patches, C*tp*p*p], image_grid_thw int64 [1, 3]) like Qwen2VLImageProcessor.

    PIL's resize on uint8 (reproduced byte for byte by compiled kernels where verified, see
    :mod:`energon_pack.pixels.pil_resample`), then one pass that writes HF's patch order through a per-channel
    256-entry table in ``preset.pixel_dtype``: float32 (exactly the reference float32 values),
    uint16 bit patterns of bfloat16 (the float32 values rounded to nearest even;
    :func:`energon_pack.pixels.pixels_to_torch` views them as ``torch.bfloat16``), or uint8 (normalise later with
    :func:`energon_pack.pixels.normalize_pixels`). Without numba, PIL and numpy give the same values, slower.
    """
    kernels = pixels.compiled(preset.resample)
    frames, grid = _image_frames(image, preset, kernels)
    pixel_values, _ = pixels.layout(frames, preset, kernels)
    return pixel_values, grid


def pending_image(
    image: Image.Image | bytes, preset: VisionPreset, max_pixels: int | None = None
) -> tuple[PendingPatchRows, np.ndarray]:
    """:func:`patchify_image` with the layout left for later: (rows, image_grid_thw); ``max_pixels`` caps this
    image (a fitted sample's), the rows keep ``preset``'s normalisation."""
    frames, grid = _image_frames(image, preset, pixels.compiled(preset.resample), max_pixels)
    return PendingPatchRows([frames], preset), grid


def _video_frames(
    frames: Sequence[Image.Image | bytes], preset: VisionPreset, kernels, max_pixels: int | None = None
) -> np.ndarray:
    """uint8 [T, H, W, 3]: every frame decoded and resized to the size the first frame's maps to (under
    ``max_pixels``, this video's own ``video_max_pixels``, when given)."""
    if len(frames) == 0:
        raise SampleSkipped("empty_video", "video has no frames")
    first = to_rgb_image(open_image(frames[0]))
    rh, rw = resized_video_size(len(frames), first.height, first.width, with_max_pixels(preset, max_pixels, video=True))
    # one frame decoded at a time, written into the final uint8 array (no per-frame lists, no stack copy)
    out = np.empty((len(frames), rh, rw, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        rgb = first if i == 0 else to_rgb_image(open_image(frame))
        out[i] = pixels.resize(rgb, rh, rw, preset.resample, kernels is not None)
        first = None
    return out


def patchify_video(
    frames: Sequence[Image.Image | bytes], preset: VisionPreset, fps: float | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    """(pixel_values_videos [patches, C*tp*p*p], video_grid_thw int64 [1, 3], second_per_grid_ts).

    All frames are resized to the size the first frame's size maps to; frames are padded to a
    multiple of temporal_patch_size by repeating the last one; second_per_grid_ts =
    temporal_patch_size / fps (fps of the given frames; preset.video_fps when None). Frames are
    decoded one at a time into one uint8 array, then laid out and converted like images.
    """
    kernels = pixels.compiled(preset.resample)
    decoded = _video_frames(frames, preset, kernels)
    pixel_values, grid = pixels.layout(decoded, preset, kernels)
    return pixel_values, np.asarray([grid], dtype=np.int64), second_per_grid_t(preset, fps)


def pending_video(
    frames: Sequence[Image.Image | bytes],
    preset: VisionPreset,
    fps: float | None = None,
    max_pixels: int | None = None,
) -> tuple[PendingPatchRows, np.ndarray, float]:
    """:func:`patchify_video` with the layout left for later: (rows, video_grid_thw, second_per_grid_ts);
    ``max_pixels``: this video's own ``video_max_pixels`` (a fitted sample's)."""
    decoded = _video_frames(frames, preset, pixels.compiled(preset.resample), max_pixels)
    grid = np.asarray([frames_grid(decoded, preset)], dtype=np.int64)
    return PendingPatchRows([decoded], preset), grid, second_per_grid_t(preset, fps)
