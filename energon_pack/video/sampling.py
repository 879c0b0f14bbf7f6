"""Time-based frame sampling: how many frames of a video to use and which ones (qwen-vl-utils' rule).

``smart_nframes`` is qwen-vl-utils' ``smart_nframes`` (fps mode) and :func:`sample_frame_indices`
its readers' ``torch.linspace(0, total - 1, n).round()``, so counts and indices are equal to
Qwen's reference reader for the same header values; nothing here decodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ConfigError, SampleSkipped


@dataclass(frozen=True)
class FrameSampling:
    """Sampling knobs; the defaults are qwen-vl-utils' (``FPS``, ``FPS_MIN_FRAMES``,
    ``FPS_MAX_FRAMES``, ``FRAME_FACTOR``, ``MODEL_SEQ_LEN``)."""

    fps: float = 2.0  # frames sampled per second of video
    min_frames: int = 4
    max_frames: int = 768  # wins over min_frames, as in qwen-vl-utils
    frame_factor: int = 2  # sampled counts are multiples of this (the temporal patch)
    #: total-video pixel budget in tokens (qwen-vl-utils' MODEL_SEQ_LEN): each frame gets at most an
    #: even share of 90% of it, so long videos get smaller frames
    max_video_tokens: int = 128000

    def validate(self) -> FrameSampling:
        if not (isinstance(self.fps, (int, float)) and self.fps > 0):
            raise ConfigError("fps", f"must be > 0, got {self.fps!r}", "use e.g. 2.0 (qwen-vl-utils' FPS)")
        for knob in ("min_frames", "max_frames", "frame_factor", "max_video_tokens"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(knob, f"must be a positive int, got {value!r}", f"use qwen-vl-utils' {knob}")
        return self


def _ceil_by(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def _floor_by(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def smart_nframes(total_frames: int, video_fps: float, sampling: FrameSampling) -> int:
    """Frames to sample from a video of ``total_frames`` at ``video_fps`` (qwen-vl-utils, fps mode).

    SampleSkipped ``video_too_few_frames`` where qwen-vl-utils raises (fewer than ``frame_factor``
    frames would remain)."""
    factor = sampling.frame_factor
    min_frames = _ceil_by(sampling.min_frames, factor)
    max_frames = _floor_by(min(sampling.max_frames, total_frames), factor)
    nframes = total_frames / video_fps * sampling.fps
    nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
    nframes = _floor_by(nframes, factor)
    if not factor <= nframes <= total_frames:
        raise SampleSkipped(
            "video_too_few_frames",
            f"{total_frames} frame(s) give {nframes} sampled, need >= {factor} (qwen-vl-utils refuses it)",
        )
    return nframes


def sample_frame_indices(total_frames: int, nframes: int) -> list[int]:
    """``nframes`` evenly spaced frame indices in [0, total_frames - 1], as qwen-vl-utils' readers
    compute them (float32 ``torch.linspace``, rounded half to even)."""
    return torch.linspace(0, total_frames - 1, nframes).round().long().tolist()
