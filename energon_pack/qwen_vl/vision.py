"""Qwen-VL resize rules, visual token counts from sizes alone, and HF-identical patchify.

Counting (``visual_token_count`` / ``video_token_count``) needs only (height, width[, frames]):
the packer can size a sample from its image headers (:func:`image_size_from_bytes`) and decode
pixels later, only for the samples it actually emits.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from ..env import switched_off
from ..errors import SampleSkipped
from . import pixel_simd
from .pil_pixels import rgbx_view
from .presets import VisionPreset

MAX_ASPECT_RATIO = 200

# Modes PIL converts to 8-bit RGB faithfully. 16-bit / 32-bit int / float modes would be clipped
# silently by convert("RGB"), so they are skipped as "unsupported_image_mode".
SUPPORTED_MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"})

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """Resized (height, width), both multiples of ``factor``, pixels within [min, max], aspect kept.

    Identical to transformers' ``qwen2_vl.image_processing_qwen2_vl.smart_resize`` (Python
    ``round`` = banker's rounding included). Raises ValueError when the aspect ratio exceeds 200.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {max(height, width) / min(height, width)}"
        )
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


def video_smart_resize(num_frames: int, height: int, width: int, temporal_factor: int = 2, factor: int = 32,
                       min_pixels: int = 128 * 32 * 32, max_pixels: int = 32 * 32 * 768) -> tuple[int, int]:
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
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {max(height, width) / min(height, width)}"
        )
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
        raise SampleSkipped("extreme_aspect_ratio",
                            f"{what} {width}x{height} has aspect ratio > {MAX_ASPECT_RATIO} (Qwen-VL resize refuses it)")


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
            raise SampleSkipped("video_too_few_frames",
                                f"{num_frames} frame(s) < temporal_patch_size {preset.temporal_patch_size} (Qwen3-VL needs >=)")
        try:
            return video_smart_resize(num_frames, height, width, preset.temporal_patch_size, preset.factor,
                                      preset.video_min_pixels, preset.video_max_pixels)
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


EXIF_ORIENTATION = 0x0112
#: EXIF orientation -> the transpose that shows the image upright (PIL.ImageOps.exif_transpose's map)
_ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def exif_orientation(img: Image.Image) -> int:
    """The EXIF Orientation (1-8) of an opened image, read from its header: 1 when absent or invalid.

    PIL reads EXIF (and the XMP ``tiff:Orientation`` fallback, as ``exif_transpose`` does) at
    open time for JPEG, WebP and TIFF, so no pixel is decoded. A PNG whose ``eXIf`` chunk comes
    after the image data would need a decode to see it: it counts as 1 here, and the decode
    phase's size check turns the disagreement into a counted ``image_size_mismatch``.
    """
    try:
        if img.format == "PNG" and "exif" not in img.info and not getattr(img, "_exif", None):
            return 1
        value = img.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # malformed EXIF: treat as upright (both phases agree)
        return 1
    return value if isinstance(value, int) and value in _ORIENTATION_TRANSPOSE else 1


def image_size_from_bytes(data: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image *as displayed*, read from its header only (PIL lazy
    open, no decode): EXIF orientations 5-8 (rotated by 90 degrees) swap width and height, as
    transformers' ``load_image`` (``PIL.ImageOps.exif_transpose``) does before resizing."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            orientation = exif_orientation(img)
    except Exception as exc:  # PIL raises many types for garbage
        raise SampleSkipped("corrupt_image", f"unreadable image header: {type(exc).__name__}: {exc}") from None
    if width <= 0 or height <= 0:
        raise SampleSkipped("corrupt_image", f"zero-size image ({width}x{height})")
    return (height, width) if orientation >= 5 else (width, height)


def open_image(data: bytes | Image.Image) -> Image.Image:
    """A decoded PIL image from bytes (or a PIL image), upright: the EXIF orientation is applied
    like ``PIL.ImageOps.exif_transpose`` (what transformers' ``load_image`` does); SampleSkipped
    when it cannot be decoded."""
    try:
        if isinstance(data, Image.Image):
            img = data
            img.load()
        else:
            img = Image.open(io.BytesIO(data))
            img.load()
        orientation = exif_orientation(img)
        if orientation != 1:
            img = img.transpose(_ORIENTATION_TRANSPOSE[orientation])
    except Exception as exc:
        raise SampleSkipped("corrupt_image", f"cannot decode image: {type(exc).__name__}: {exc}") from None
    if img.width <= 0 or img.height <= 0:
        raise SampleSkipped("corrupt_image", f"zero-size image ({img.width}x{img.height})")
    return img


def to_rgb_image(img: Image.Image) -> Image.Image:
    """8-bit RGB like transformers' ``convert_to_rgb``: transparency composited on white. An RGB
    image is returned as is (no copy: a decoded 8000x8000 photo is 192 MB)."""
    if img.mode not in SUPPORTED_MODES:
        raise SampleSkipped("unsupported_image_mode", f"image mode {img.mode!r} is not 8-bit RGB-convertible")
    has_alpha = "A" in img.getbands() or img.info.get("transparency") is not None
    if has_alpha:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def to_rgb_array(img: Image.Image) -> np.ndarray:
    """uint8 [H, W, 3] like transformers' ``convert_to_rgb``: transparency composited on white."""
    return np.asarray(to_rgb_image(img), dtype=np.uint8)


def _resize_normalize(rgb: np.ndarray, height: int, width: int, preset: VisionPreset) -> np.ndarray:
    """uint8 HWC -> float32 CHW resized to (height, width), rescaled by 1/255 and normalised.

    The float reference (the pre-issue-13 path); :func:`normalization_lut` computes the same
    float32 operations once per channel value."""
    if rgb.shape[0] != height or rgb.shape[1] != width:
        rgb = np.asarray(Image.fromarray(rgb).resize((width, height), resample=_RESAMPLE[preset.resample]))
    arr = rgb.astype(np.float32) * np.float32(1 / 255)
    mean = np.asarray(preset.image_mean, dtype=np.float32)
    std = np.asarray(preset.image_std, dtype=np.float32)
    arr = (arr - mean) / std
    return np.ascontiguousarray(arr.transpose(2, 0, 1), dtype=np.float32)


@functools.lru_cache(maxsize=64)
def _luts(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    values = np.arange(256, dtype=np.uint8).astype(np.float32) * np.float32(1 / 255)
    lut = (values[None, :] - np.asarray(mean, dtype=np.float32)[:, None]) / np.asarray(std, dtype=np.float32)[:, None]
    lut = np.ascontiguousarray(lut, dtype=np.float32)
    bf16_bits = torch.from_numpy(lut).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    lut.flags.writeable = False
    bf16_bits.flags.writeable = False
    return lut, bf16_bits


def normalization_lut(preset: VisionPreset) -> np.ndarray:
    """float32 [3, 256]: the normalised value of each uint8 channel value, computed with exactly
    the float32 operations of the reference path ``(x * float32(1/255) - mean) / std``."""
    return _luts(tuple(preset.image_mean), tuple(preset.image_std))[0]


def _patch_layout_u8(frames: np.ndarray, p: int, m: int, tp: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 [T, H, W, C] (T a multiple of ``tp``) -> uint8 [t*h*w, C, tp, p*p]: HF's patch order
    (patch ``p``, merge ``m``, temporal patch ``tp``), laid out on uint8 data (one copy)."""
    num_frames, height, width, channel = frames.shape
    grid_t, grid_h, grid_w = num_frames // tp, height // p, width // p
    x = frames.reshape(grid_t, tp, grid_h // m, m, p, grid_w // m, m, p, channel)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)  # t, h/m, w/m, m, m, C, tp, p, p
    return np.ascontiguousarray(x).reshape(grid_t * grid_h * grid_w, channel, tp, p * p), (grid_t, grid_h, grid_w)


def _finish(layout: np.ndarray, preset: VisionPreset, repeat_t: bool = False) -> np.ndarray:
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


def pixels_to_torch(pixel_values: np.ndarray, preset: VisionPreset) -> torch.Tensor:
    """The patchify output as a tensor of ``preset.pixel_dtype`` (zero-copy; bfloat16 is a view of
    the uint16 bit patterns)."""
    t = torch.from_numpy(pixel_values)
    return t.view(torch.bfloat16) if preset.pixel_dtype == "bfloat16" else t


def normalize_pixels(pixel_values: torch.Tensor, preset: VisionPreset,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
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


def _patchify(frames: np.ndarray, preset: VisionPreset) -> tuple[np.ndarray, tuple[int, int, int]]:
    """float [T, C, H, W] (T a multiple of temporal_patch_size) -> [t*h*w, C*tp*p*p] in HF's order
    (the float reference layout; the pixel path lays out uint8 with :func:`_patch_layout_u8`)."""
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
        rgb = rgb.resize((rw, rh), resample=_RESAMPLE[preset.resample])
    chw = _resize_normalize(np.asarray(rgb, dtype=np.uint8), rh, rw, preset)
    frames = np.broadcast_to(chw[None], (preset.temporal_patch_size, *chw.shape))
    pixel_values, grid = _patchify(frames, preset)
    return pixel_values, np.asarray([grid], dtype=np.int64)


def _draft_target(img: Image.Image, preset: VisionPreset) -> tuple[int, int] | None:
    """(width, height) to ask JPEG draft mode for, in stored orientation, when the resize target
    is at most half the source in each side; None otherwise (or for non-JPEG)."""
    if img.format != "JPEG":
        return None
    width, height = img.size
    orientation = exif_orientation(img)
    shown_w, shown_h = (height, width) if orientation >= 5 else (width, height)
    rh, rw = resized_image_size(shown_h, shown_w, preset)
    if orientation >= 5:
        rh, rw = rw, rh
    if 2 * rw > width or 2 * rh > height:
        return None
    return rw, rh


def decode_for_patchify(image: Image.Image | bytes, preset: VisionPreset) -> tuple[Image.Image, int, int]:
    """(upright 8-bit RGB image, target height, target width).

    With ``preset.jpeg_draft`` a JPEG whose target is at most half its size in each side is
    decoded at a reduced scale (PIL draft: 1/2, 1/4 or 1/8, never below the target); the target
    still comes from the *full* header size (EXIF orientation included, read at open time for
    JPEG), so grids and token counts never change. Everything else decodes in full."""
    if preset.jpeg_draft and isinstance(image, (bytes, bytearray)):
        try:
            img = Image.open(io.BytesIO(image))
            target = _draft_target(img, preset)
            if target is not None:
                full_w, full_h = img.size
                orientation = exif_orientation(img)
                img.draft(img.mode, target)
        except SampleSkipped:
            raise
        except Exception as exc:
            raise SampleSkipped("corrupt_image", f"cannot decode image: {type(exc).__name__}: {exc}") from None
        if target is not None:
            shown_h, shown_w = (full_w, full_h) if orientation >= 5 else (full_h, full_w)
            rgb = to_rgb_image(open_image(img))
            return (rgb, *resized_image_size(shown_h, shown_w, preset))
        image = img  # not a draft case: full decode of the opened image
    rgb = to_rgb_image(open_image(image))
    rh, rw = resized_image_size(rgb.height, rgb.width, preset)
    return rgb, rh, rw


_IDENTITY_U8 = np.ascontiguousarray(np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 256)))
_IDENTITY_U8.flags.writeable = False


def _storage_table(preset: VisionPreset) -> np.ndarray:
    """[3, 256] table from a channel byte to its stored value in ``preset.pixel_dtype``: the float32
    LUT, the bfloat16 bit patterns of it, or the byte itself (uint8)."""
    if preset.pixel_dtype == "uint8":
        return _IDENTITY_U8
    f32, bf16 = _luts(tuple(preset.image_mean), tuple(preset.image_std))
    return f32 if preset.pixel_dtype == "float32" else bf16


#: environment variable: "off" makes every worker use the PIL + numpy pixel path (same values)
PIXEL_KERNELS_ENV = "ENERGON_PACK_PIXEL_KERNELS"


def _fast_kernels(preset: VisionPreset):
    """:mod:`.pixel_kernels` when the compiled path reproduces PIL's ``preset.resample`` resize
    here (numba installed, probe passed, not turned off by ``ENERGON_PACK_PIXEL_KERNELS=off``);
    None otherwise (the PIL + numpy path)."""
    from .pil_resample import fast_resize_available

    if switched_off(PIXEL_KERNELS_ENV):
        return None
    if not fast_resize_available(preset.resample):
        return None
    from . import pixel_kernels

    return pixel_kernels


def warm_pixel_path(preset: VisionPreset) -> bool:
    """Load (or compile) the pixel kernels and verify them against PIL now, e.g. in the main
    process before data-loader workers fork, so no worker pays for it. True if they are used."""
    kernels = _fast_kernels(preset)
    if kernels is None:
        return False
    from .pil_resample import coefficients, resize_rgb

    side = 2 * preset.factor
    # decoded images arrive read-only (np.asarray of a PIL image), resize outputs writable: numba
    # compiles each kind once, so warm both, with both pass orders, here rather than in a worker;
    # the numba passes directly too, for images the SIMD passes leave to them (over ~6x down)
    readonly = np.zeros((side + 7, side + 5, 3), dtype=np.uint8)
    readonly.flags.writeable = False
    for out_h, out_w in ((side, side), (side // 4, side + 9)):
        resize_rgb(readonly, out_h, out_w, preset.resample)
    for src in (readonly, readonly.copy()):
        height, width, _ = src.shape
        kernels.horizontal(src, 0, height, *coefficients(width, side, preset.resample),
                           np.empty((height, side, 3), np.uint8))
        kernels.vertical(src, *coefficients(height, side, preset.resample), np.empty((side, width, 3), np.uint8))
    frames = np.zeros((1, side, side, 3), dtype=np.uint8)
    _patch_rows(frames, preset, kernels)
    frames.flags.writeable = False
    _patch_rows(frames, preset, kernels)
    return True


def _resized_u8(rgb: Image.Image, height: int, width: int, preset: VisionPreset, fast: bool) -> np.ndarray:
    """uint8 [height, width, 3] of an RGB image, resized exactly like ``rgb.resize`` (PIL's bytes).
    Where the SIMD kernels run, they read the pixels in PIL's own memory (no RGB copy first)."""
    source = None
    if fast and pixel_simd.available():
        source = rgbx_view(rgb)
    if source is None:
        source = np.asarray(rgb, dtype=np.uint8)
    if (rgb.height, rgb.width) == (height, width):
        return source
    if fast:
        from .pil_resample import resize_rgb

        return resize_rgb(source, height, width, preset.resample)
    return np.asarray(rgb.resize((width, height), resample=_RESAMPLE[preset.resample]), dtype=np.uint8)


def _frames_grid(frames: np.ndarray, preset: VisionPreset) -> tuple[int, int, int]:
    """(t, h, w) patch grid of uint8 frames [T, H, W, 3]: T padded up to a multiple of tp."""
    p = preset.patch_size
    return -(-frames.shape[0] // preset.temporal_patch_size), frames.shape[1] // p, frames.shape[2] // p


def _patch_rows(frames: np.ndarray, preset: VisionPreset, kernels,
                out: np.ndarray | None = None) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 frames [T, H, W, 3] -> ([t*h*w, C*tp*p*p] in ``preset.pixel_dtype``'s storage, grid),
    written into ``out`` when given (C-contiguous, that shape and storage dtype). Frames past T
    (up to a multiple of tp) repeat the last one; a single image fills every slot."""
    p, m, tp = preset.patch_size, preset.merge_size, preset.temporal_patch_size
    num_frames = frames.shape[0]
    grid = _frames_grid(frames, preset)
    if kernels is not None:
        table = _storage_table(preset)
        if out is None:
            out = np.empty((math.prod(grid), preset.patch_dim), dtype=table.dtype)
        if not pixel_simd.layout_frames(frames, p, m, tp, preset.image_mean, preset.image_std, out):
            kernels.layout(frames, p, m, table, out)
        return out, grid
    if num_frames == 1:  # one temporal slot; _finish repeats it tp times while writing
        layout, _ = _patch_layout_u8(frames, p, m, 1)
        values = _finish(layout, preset, repeat_t=True)
    else:
        total = grid[0] * tp
        if total != num_frames:
            frames = np.concatenate([frames, np.repeat(frames[-1:], total - num_frames, axis=0)])
        layout, _ = _patch_layout_u8(frames, p, m, tp)
        values = _finish(layout, preset)
    if out is None:
        return values, grid
    out[...] = values
    return out, grid


#: torch dtype of the pixel tensors of each ``pixel_dtype`` (bfloat16 is stored as its uint16 bits)
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "uint8": torch.uint8}


class PendingPatchRows:
    """Patch rows decoded and resized, not laid out yet: the uint8 frames of one or more images or
    videos (a quarter of the float32 rows' bytes), and :meth:`write_into`, which runs the layout
    into the caller's tensor. The THD builder writes them straight into the pack's buffer (shared
    memory in a loader worker), so each value is written once, where before it went into a
    per-sample array and was then copied into the pack. Decoding happened already, so a corrupt
    image was a counted skip before any pack was built; the layout itself cannot fail.

    ``shape`` and ``dtype`` are those of the tensor :meth:`to_tensor` returns: exactly what
    :func:`patchify_image` / :func:`patchify_video` give, concatenated in order."""

    def __init__(self, items: Sequence[np.ndarray], preset: VisionPreset) -> None:
        self._items = list(items)  # uint8 frames [T, H, W, 3] (an image: T = 1)
        self.preset = preset
        self._rows = [math.prod(_frames_grid(frames, preset)) for frames in self._items]
        self.shape = (sum(self._rows), preset.patch_dim)
        self.dtype = _TORCH_DTYPES[preset.pixel_dtype]

    @classmethod
    def join(cls, parts: Sequence[PendingPatchRows]) -> PendingPatchRows:
        """The rows of ``parts`` one after another (e.g. a sample's images); one preset for all."""
        if not parts or any(part.preset != parts[0].preset for part in parts):
            raise ValueError("PendingPatchRows.join needs at least one part, all of one preset")
        return cls([item for part in parts for item in part._items], parts[0].preset)

    def write_into(self, out: torch.Tensor) -> None:
        """Lay the rows out into ``out`` (a contiguous CPU tensor of ``shape`` and ``dtype``)."""
        if (tuple(out.shape) != self.shape or out.dtype != self.dtype or out.device.type != "cpu"
                or not out.is_contiguous()):
            raise ValueError(f"PendingPatchRows.write_into: needs a contiguous CPU {self.dtype} tensor of shape "
                             f"{self.shape}, got {out.dtype} {tuple(out.shape)} on {out.device}")
        storage = out.view(torch.int16).numpy().view(np.uint16) if self.dtype == torch.bfloat16 else out.numpy()
        kernels = _fast_kernels(self.preset)
        start = 0
        for frames, rows in zip(self._items, self._rows):
            _patch_rows(frames, self.preset, kernels, out=storage[start:start + rows])
            start += rows

    def to_tensor(self) -> torch.Tensor:
        """The rows as a new tensor of ``dtype``."""
        out = torch.empty(self.shape, dtype=self.dtype)
        self.write_into(out)
        return out


def _image_frames(image: Image.Image | bytes, preset: VisionPreset, kernels) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [1, H, W, 3] resized like HF (PIL's bytes), image_grid_thw int64 [1, 3])."""
    rgb, rh, rw = decode_for_patchify(image, preset)
    frames = _resized_u8(rgb, rh, rw, preset, kernels is not None)[None]
    return frames, np.asarray([_frames_grid(frames, preset)], dtype=np.int64)


def patchify_image(image: Image.Image | bytes, preset: VisionPreset) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values [patches, C*tp*p*p], image_grid_thw int64 [1, 3]) like Qwen2VLImageProcessor.

    PIL's resize on uint8 (reproduced byte for byte by compiled kernels where verified, see
    :mod:`.pil_resample`), then one pass that writes HF's patch order through a per-channel
    256-entry table in ``preset.pixel_dtype``: float32 (exactly the reference float32 values),
    uint16 bit patterns of bfloat16 (the float32 values rounded to nearest even;
    :func:`pixels_to_torch` views them as ``torch.bfloat16``), or uint8 (normalise later with
    :func:`normalize_pixels`). Without numba, PIL and numpy give the same values, slower.
    """
    kernels = _fast_kernels(preset)
    frames, grid = _image_frames(image, preset, kernels)
    pixel_values, _ = _patch_rows(frames, preset, kernels)
    return pixel_values, grid


def pending_image(image: Image.Image | bytes, preset: VisionPreset) -> tuple[PendingPatchRows, np.ndarray]:
    """:func:`patchify_image` with the layout left for later: (rows, image_grid_thw)."""
    frames, grid = _image_frames(image, preset, _fast_kernels(preset))
    return PendingPatchRows([frames], preset), grid


def _video_frames(frames: Sequence[Image.Image | bytes], preset: VisionPreset, kernels) -> np.ndarray:
    """uint8 [T, H, W, 3]: every frame decoded and resized to the size the first frame's maps to."""
    if len(frames) == 0:
        raise SampleSkipped("empty_video", "video has no frames")
    first = to_rgb_image(open_image(frames[0]))
    rh, rw = resized_video_size(len(frames), first.height, first.width, preset)
    # one frame decoded at a time, written into the final uint8 array (no per-frame lists, no stack copy)
    out = np.empty((len(frames), rh, rw, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        rgb = first if i == 0 else to_rgb_image(open_image(frame))
        out[i] = _resized_u8(rgb, rh, rw, preset, kernels is not None)
        first = None
    return out


def patchify_video(frames: Sequence[Image.Image | bytes], preset: VisionPreset,
                   fps: float | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """(pixel_values_videos [patches, C*tp*p*p], video_grid_thw int64 [1, 3], second_per_grid_ts).

    All frames are resized to the size the first frame's size maps to; frames are padded to a
    multiple of temporal_patch_size by repeating the last one; second_per_grid_ts =
    temporal_patch_size / fps (fps of the given frames; preset.video_fps when None). Frames are
    decoded one at a time into one uint8 array, then laid out and converted like images.
    """
    kernels = _fast_kernels(preset)
    decoded = _video_frames(frames, preset, kernels)
    pixel_values, grid = _patch_rows(decoded, preset, kernels)
    return pixel_values, np.asarray([grid], dtype=np.int64), second_per_grid_t(preset, fps)


def pending_video(frames: Sequence[Image.Image | bytes], preset: VisionPreset,
                  fps: float | None = None) -> tuple[PendingPatchRows, np.ndarray, float]:
    """:func:`patchify_video` with the layout left for later: (rows, video_grid_thw, second_per_grid_ts)."""
    decoded = _video_frames(frames, preset, _fast_kernels(preset))
    grid = np.asarray([_frames_grid(decoded, preset)], dtype=np.int64)
    return PendingPatchRows([decoded], preset), grid, second_per_grid_t(preset, fps)
