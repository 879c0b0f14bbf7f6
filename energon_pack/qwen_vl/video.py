"""Qwen-VL's rules for a video file: from its header to frame indices, frame size, grid and tokens.

The official pipeline reads a video with qwen-vl-utils (``fetch_video``: time-based sampling,
then every frame resized with a per-frame budget that shrinks as frames add up) and hands the
frames to transformers' processor (Qwen2/2.5-VL: the video processor's own resize keeps that
size; Qwen3-VL: called with ``do_resize=False``, as its model card does). :func:`plan_video`
computes all of it from a :class:`~energon_pack.video.VideoHeader` alone, so the packer costs a
video before any frame is decoded; :func:`pending_video_file` decodes the planned frames of a
selected sample into the pixel engine's patch rows (:mod:`energon_pack.pixels`).

Per version: patch 14 (factor 28) for Qwen2/2.5-VL, 16 (factor 32) for Qwen3-VL; Qwen2.5-VL's
``second_per_grid_ts`` is temporal_patch_size / sampled fps (transformers' ``sampled_fps``);
Qwen3-VL writes ``<t seconds>`` before each temporal step, t averaging the original-time of the
step's first and last frame (transformers' ``_calculate_timestamps``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import pixels
from ..errors import ConfigError, SampleSkipped
from ..video import decode as video_decode
from ..video import probe as video_probe
from ..video.probe import VideoHeader
from ..video.sampling import FrameSampling, sample_frame_indices, smart_nframes
from . import vision as V
from .presets import VisionPreset


@dataclass(frozen=True)
class VideoPlan:
    """What the model gets from one video file, known before decoding."""

    frame_indices: tuple[int, ...]  # frames of the file to decode (presentation order)
    video_fps: float  # the file's frame rate
    total_frames: int  # the file's frame count
    width: int  # the file's frame size
    height: int
    resized_height: int
    resized_width: int
    grid_thw: tuple[int, int, int]

    @property
    def num_frames(self) -> int:
        return len(self.frame_indices)

    @property
    def sampled_fps(self) -> float:
        """Frame rate of the sampled frames (qwen-vl-utils' ``sample_fps``, transformers' ``sampled_fps``)."""
        return self.num_frames / self.total_frames * self.video_fps

    @property
    def frame_times(self) -> list[float]:
        """Original time (s) of each sampled frame: index / video fps."""
        return [i / self.video_fps for i in self.frame_indices]


@dataclass(frozen=True)
class VideoFile:
    """An encoded video file and its plan: what a packing buffer holds for a video (bytes, no pixels)."""

    data: bytes
    plan: VideoPlan


def qwen_vl_utils_resize(height: int, width: int, factor: int, min_pixels: float, max_pixels: float) -> tuple[int, int]:
    """qwen-vl-utils' ``smart_resize`` (sides at least ``factor`` before the budget check, none after
    a downscale; transformers' version differs there). ValueError for aspect ratio > 200."""
    if max(height, width) / min(height, width) > V.MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {V.MAX_ASPECT_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def frame_pixel_budget(nframes: int, preset: VisionPreset, sampling: FrameSampling) -> float:
    """Per-frame max pixels of a video of ``nframes`` sampled frames (qwen-vl-utils ``fetch_video``):
    the preset's per-frame max, at most an even share of the total-video budget, at least 1.05 x
    the per-frame min."""
    factor = preset.factor
    total_pixels = sampling.max_video_tokens * factor * factor * 0.9
    max_pixels = max(
        min(preset.video_max_pixels, total_pixels / nframes * sampling.frame_factor),
        int(preset.video_min_pixels * 1.05),
    )
    return min(preset.video_max_pixels, max_pixels)


def check_sampling(sampling: FrameSampling, preset: VisionPreset) -> FrameSampling:
    """``sampling`` validated for ``preset`` (ConfigError otherwise): counts rounded to its temporal patch."""
    sampling.validate()
    if sampling.frame_factor != preset.temporal_patch_size:
        raise ConfigError(
            "frame_factor",
            f"{sampling.frame_factor} != the preset's temporal_patch_size {preset.temporal_patch_size}",
            "use the temporal patch size (2 for every Qwen-VL)",
        )
    return sampling


def plan_video(header: VideoHeader, preset: VisionPreset, sampling: FrameSampling | None = None) -> VideoPlan:
    """The :class:`VideoPlan` of a video from its header; SampleSkipped for too few frames, an
    aspect ratio over 200 or a frame size below one patch."""
    sampling = check_sampling(sampling or FrameSampling(), preset)
    nframes = smart_nframes(header.num_frames, header.fps, sampling)
    indices = sample_frame_indices(header.num_frames, nframes)
    decoded = len(indices) * header.width * header.height
    if decoded > video_probe.MAX_SAMPLE_PIXELS:
        raise SampleSkipped(
            "video_too_large",
            f"{len(indices)} sampled {header.width}x{header.height} frames ({decoded:,} pixels to decode) exceed "
            f"energon_pack.video.probe.MAX_SAMPLE_PIXELS ({video_probe.MAX_SAMPLE_PIXELS:,}); raise it, or sample "
            "fewer frames (video_sampling max_frames / fps)",
        )
    try:
        rh, rw = qwen_vl_utils_resize(
            header.height,
            header.width,
            preset.factor,
            preset.video_min_pixels,
            frame_pixel_budget(nframes, preset, sampling),
        )
    except ValueError as exc:
        raise SampleSkipped("extreme_aspect_ratio", str(exc)) from None
    if rh < preset.factor or rw < preset.factor:
        raise SampleSkipped(
            "extreme_aspect_ratio",
            f"video {header.width}x{header.height} resizes to {rw}x{rh}, below one merged patch ({preset.factor})",
        )
    grid = (-(-nframes // preset.temporal_patch_size), rh // preset.patch_size, rw // preset.patch_size)
    return VideoPlan(
        frame_indices=tuple(indices),
        video_fps=header.fps,
        total_frames=header.num_frames,
        width=header.width,
        height=header.height,
        resized_height=rh,
        resized_width=rw,
        grid_thw=grid,
    )


def video_file_frames(data: bytes, plan: VideoPlan, preset: VisionPreset) -> np.ndarray:
    """uint8 [T, H, W, 3]: the planned frames of ``data`` decoded one at a time and resized (PIL's
    bicubic bytes, :func:`energon_pack.pixels.resize`, the engine images use too) straight into the output."""
    fast = pixels.compiled(preset.resample) is not None
    out = np.empty((plan.num_frames, plan.resized_height, plan.resized_width, 3), dtype=np.uint8)
    count = 0
    for i, image in enumerate(video_decode.decode_frames(data, plan.frame_indices)):
        if image.size != (plan.width, plan.height):
            raise SampleSkipped(
                "video_size_mismatch",
                f"frame {plan.frame_indices[i]} is {image.size[0]}x"
                f"{image.size[1]}, the header said {plan.width}x{plan.height}",
            )
        out[i] = pixels.resize(image, plan.resized_height, plan.resized_width, preset.resample, fast)
        count += 1
    if count != plan.num_frames:
        raise SampleSkipped("corrupt_video", f"decoded {count} of {plan.num_frames} planned frames")
    return out


def pending_video_file(
    data: bytes, plan: VideoPlan, preset: VisionPreset
) -> tuple[pixels.PendingPatchRows, np.ndarray]:
    """(patch rows left for the pack's layout, video_grid_thw int64 [1, 3]) of a planned video file."""
    frames = video_file_frames(data, plan, preset)
    return pixels.PendingPatchRows([frames], preset), np.asarray([plan.grid_thw], dtype=np.int64)
