"""Patch layout of uint8 frames into a model's pixel rows, numpy side: the per-channel value
tables (float32, bfloat16 bits, bytes), HF's patch order, and the tensor views of the result.

Model-neutral: a layout is described by a :class:`PixelSpec` (patch, merge and temporal patch
sizes, normalisation mean/std, storage dtype); Qwen-VL's ``VisionPreset`` is one. The compiled
and SIMD layouts of the same values are picked in :mod:`.backend`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch


class PixelSpec(Protocol):
    """What the pixel engine reads of a model's vision config (e.g. Qwen-VL's ``VisionPreset``)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    image_mean: Sequence[float]
    image_std: Sequence[float]
    pixel_dtype: str  # "float32", "bfloat16" or "uint8"
    resample: str  # PIL filter name, e.g. "bicubic"

    @property
    def patch_dim(self) -> int: ...


@functools.lru_cache(maxsize=64)
def _luts(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    values = np.arange(256, dtype=np.uint8).astype(np.float32) * np.float32(1 / 255)
    lut = (values[None, :] - np.asarray(mean, dtype=np.float32)[:, None]) / np.asarray(std, dtype=np.float32)[:, None]
    lut = np.ascontiguousarray(lut, dtype=np.float32)
    bf16_bits = torch.from_numpy(lut).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    lut.flags.writeable = False
    bf16_bits.flags.writeable = False
    return lut, bf16_bits


def normalization_lut(preset: PixelSpec) -> np.ndarray:
    """float32 [3, 256]: the normalised value of each uint8 channel value, computed with exactly
    the float32 operations of the reference path ``(x * float32(1/255) - mean) / std``."""
    return _luts(tuple(preset.image_mean), tuple(preset.image_std))[0]


def patch_layout_u8(frames: np.ndarray, p: int, m: int, tp: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 [T, H, W, C] (T a multiple of ``tp``) -> uint8 [t*h*w, C, tp, p*p]: HF's patch order
    (patch ``p``, merge ``m``, temporal patch ``tp``), laid out on uint8 data (one copy)."""
    num_frames, height, width, channel = frames.shape
    grid_t, grid_h, grid_w = num_frames // tp, height // p, width // p
    x = frames.reshape(grid_t, tp, grid_h // m, m, p, grid_w // m, m, p, channel)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)  # t, h/m, w/m, m, m, C, tp, p, p
    return np.ascontiguousarray(x).reshape(grid_t * grid_h * grid_w, channel, tp, p * p), (grid_t, grid_h, grid_w)


def finish(layout: np.ndarray, preset: PixelSpec, repeat_t: bool = False) -> np.ndarray:
    """uint8 [N, C, tp or 1, p*p] in patch order -> [N, C*tp*p*p] in ``preset.pixel_dtype``'s storage:
    float32 (LUT gather), uint16 holding bfloat16 bit patterns (LUT gather), or uint8 (as is).
    ``repeat_t``: ``layout`` has one temporal slot, repeated tp times (an image)."""
    n, channel, t_in, pp = layout.shape
    tp = preset.temporal_patch_size if repeat_t else t_in
    dtype = preset.pixel_dtype
    if dtype == "uint8":
        if repeat_t:
            layout = np.broadcast_to(layout, (n, channel, tp, pp))
        return np.ascontiguousarray(layout).reshape(n, channel * tp * pp)
    f32, bf16 = _luts(tuple(preset.image_mean), tuple(preset.image_std))
    lut = f32 if dtype == "float32" else bf16
    out = np.empty((n, channel, tp, pp), dtype=lut.dtype)
    for c in range(channel):
        if repeat_t:
            np.take(lut[c], layout[:, c, 0], out=out[:, c, 0])
            out[:, c, 1:] = out[:, c, :1]
        else:
            np.take(lut[c], layout[:, c], out=out[:, c])
    return out.reshape(n, channel * tp * pp)


#: torch dtype of the pixel tensors of each ``pixel_dtype`` (bfloat16 is stored as its uint16 bits)
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "uint8": torch.uint8}


def pixels_to_torch(pixel_values: np.ndarray, preset: PixelSpec) -> torch.Tensor:
    """The patchify output as a tensor of ``preset.pixel_dtype`` (zero-copy; bfloat16 is a view of
    the uint16 bit patterns)."""
    t = torch.from_numpy(pixel_values)
    return t.view(torch.bfloat16) if preset.pixel_dtype == "bfloat16" else t


def normalize_pixels(pixel_values: torch.Tensor, preset: PixelSpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 ``pixel_values`` ([patches, C*tp*p*p], ``pixel_dtype="uint8"``) -> normalised values
    on the same device: ``(x * float32(1/255) - mean) / std`` in float32 (each op rounded like
    the CPU path, so float32 output equals ``pixel_dtype="float32"``), then cast to ``dtype``.

    Use it on the GPU right before the vision tower: ``pv = normalize_pixels(batch["pixel_values"].cuda(), preset,
    torch.bfloat16)``. A float input is returned (cast to ``dtype``) unchanged.
    """
    if pixel_values.dtype != torch.uint8:
        return pixel_values.to(dtype)
    cols = pixel_values.shape[-1]
    per_channel = cols // 3
    if cols != preset.patch_dim:
        raise ValueError(f"pixel_values rows have {cols} values, the preset's patch_dim is {preset.patch_dim}")
    dev = pixel_values.device
    mean = torch.tensor(preset.image_mean, dtype=torch.float32, device=dev).repeat_interleave(per_channel)
    std = torch.tensor(preset.image_std, dtype=torch.float32, device=dev).repeat_interleave(per_channel)
    x = pixel_values.to(torch.float32)
    x.mul_(torch.tensor(1 / 255, dtype=torch.float32, device=dev)).sub_(mean).div_(std)
    return x if dtype == torch.float32 else x.to(dtype)


_IDENTITY_U8 = np.ascontiguousarray(np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 256)))
_IDENTITY_U8.flags.writeable = False


def storage_table(preset: PixelSpec) -> np.ndarray:
    """[3, 256] table from a channel byte to its stored value in ``preset.pixel_dtype``: the float32
    LUT, the bfloat16 bit patterns of it, or the byte itself (uint8)."""
    if preset.pixel_dtype == "uint8":
        return _IDENTITY_U8
    f32, bf16 = _luts(tuple(preset.image_mean), tuple(preset.image_std))
    return f32 if preset.pixel_dtype == "float32" else bf16


def frames_grid(frames: np.ndarray, preset: PixelSpec) -> tuple[int, int, int]:
    """(t, h, w) patch grid of uint8 frames [T, H, W, 3]: T padded up to a multiple of tp."""
    p = preset.patch_size
    return -(-frames.shape[0] // preset.temporal_patch_size), frames.shape[1] // p, frames.shape[2] // p
