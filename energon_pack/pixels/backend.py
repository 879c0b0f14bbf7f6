"""The one backend dispatch of the pixel engine: which code resizes and lays out pixels here.

Every choice between the four ways of computing the same bytes is made in this module, for
images and video frames alike (only the per-pass SIMD-or-numba fallback of a compiled resize lives
with the passes, in :mod:`.pil_resample`):

* **SIMD** (:mod:`.pixel_simd`, the optional AVX-512 extension): both resampling passes and the
  layout, where the extension is built, the CPU has VBMI + VNNI and ``ENERGON_PACK_PIXEL_SIMD``
  is not ``off``; it declines (returns False) sizes it does not handle, and numba takes them;
* **numba** (:mod:`.pixel_kernels`): the compiled passes and layout, used when PIL's resize of the
  filter is reproduced byte for byte here (:func:`.pil_resample.fast_resize_available`) and
  ``ENERGON_PACK_PIXEL_KERNELS`` is not ``off``;
* **PIL + numpy** otherwise: ``Image.resize`` and the numpy layout of :mod:`.layout`.

All paths give the same values (tested); only the speed differs.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
from PIL import Image

from ..env import switched_off
from . import pixel_simd
from .layout import PixelSpec, finish, frames_grid, patch_layout_u8, storage_table
from .pil_pixels import STRIP_PIXELS, rgb_rows, rgbx_view
from .pil_resample import coefficients, fast_resize_available, resize_rgb, resize_strips

#: environment variable: "off" makes every worker use the PIL + numpy pixel path (same values)
PIXEL_KERNELS_ENV = "ENERGON_PACK_PIXEL_KERNELS"

#: PIL filter of each ``resample`` name
RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def compiled(resample: str):
    """:mod:`.pixel_kernels` when the compiled path reproduces PIL's ``resample`` resize here
    (numba installed, probe passed, not turned off by ``ENERGON_PACK_PIXEL_KERNELS=off``); None
    otherwise (the PIL + numpy path)."""
    if switched_off(PIXEL_KERNELS_ENV):
        return None
    if not fast_resize_available(resample):
        return None
    from . import pixel_kernels

    return pixel_kernels


def resize(rgb: Image.Image, height: int, width: int, resample: str, fast: bool) -> np.ndarray:
    """uint8 [height, width, 3] of an RGB image, resized exactly like ``rgb.resize`` (PIL's bytes);
    ``fast``: :func:`compiled` said yes for ``resample``. Where the SIMD kernels run, they read
    the pixels in PIL's own memory (no RGB copy first); an image over :data:`.pil_pixels.STRIP_PIXELS` that
    they cannot read so is resized a strip of rows at a time, and PIL's own resize reads it in place."""
    same = (rgb.height, rgb.width) == (height, width)
    if not (fast or same):
        return np.asarray(rgb.resize((width, height), resample=RESAMPLE[resample]), dtype=np.uint8)
    source = rgbx_view(rgb) if fast and pixel_simd.available() else None
    if source is None and not same and rgb.width * rgb.height > STRIP_PIXELS:
        return resize_strips(partial(rgb_rows, rgb), rgb.height, rgb.width, height, width, resample, STRIP_PIXELS)
    if source is None:
        source = np.asarray(rgb, dtype=np.uint8)
    return source if same else resize_rgb(source, height, width, resample)


def layout(
    frames: np.ndarray, spec: PixelSpec, kernels, out: np.ndarray | None = None
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 frames [T, H, W, 3] -> ([t*h*w, C*tp*p*p] in ``spec.pixel_dtype``'s storage, grid),
    written into ``out`` when given (C-contiguous, that shape and storage dtype). Frames past T
    (up to a multiple of tp) repeat the last one; a single image fills every slot. ``kernels``:
    what :func:`compiled` gave (None: numpy)."""
    p, m, tp = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    num_frames = frames.shape[0]
    grid = frames_grid(frames, spec)
    if kernels is not None:
        table = storage_table(spec)
        if out is None:
            out = np.empty((math.prod(grid), spec.patch_dim), dtype=table.dtype)
        if not pixel_simd.layout_frames(frames, p, m, tp, spec.image_mean, spec.image_std, out):
            kernels.layout(frames, p, m, table, out)
        return out, grid
    if num_frames == 1:  # one temporal slot; finish repeats it tp times while writing
        rows, _ = patch_layout_u8(frames, p, m, 1)
        values = finish(rows, spec, repeat_t=True)
    else:
        total = grid[0] * tp
        if total != num_frames:
            frames = np.concatenate([frames, np.repeat(frames[-1:], total - num_frames, axis=0)])
        rows, _ = patch_layout_u8(frames, p, m, tp)
        values = finish(rows, spec)
    if out is None:
        return values, grid
    out[...] = values
    return out, grid


def warm(spec: PixelSpec) -> bool:
    """Load (or compile) the pixel kernels and verify them against PIL now, e.g. in the main
    process before data-loader workers fork, so no worker pays for it. True if they are used."""
    kernels = compiled(spec.resample)
    if kernels is None:
        return False
    side = 2 * spec.patch_size * spec.merge_size
    # decoded images arrive read-only (np.asarray of a PIL image), resize outputs writable: numba
    # compiles each kind once, so warm both, with both pass orders, here rather than in a worker;
    # the numba passes directly too, for images the SIMD passes leave to them (over ~6x down)
    readonly = np.zeros((side + 7, side + 5, 3), dtype=np.uint8)
    readonly.flags.writeable = False
    for out_h, out_w in ((side, side), (side // 4, side + 9)):
        resize_rgb(readonly, out_h, out_w, spec.resample)
    for src in (readonly, readonly.copy()):
        height, width, _ = src.shape
        kernels.horizontal(
            src, 0, height, *coefficients(width, side, spec.resample), np.empty((height, side, 3), np.uint8)
        )
        kernels.vertical(src, *coefficients(height, side, spec.resample), np.empty((side, width, 3), np.uint8))
    frames = np.zeros((1, side, side, 3), dtype=np.uint8)
    layout(frames, spec, kernels)
    frames.flags.writeable = False
    layout(frames, spec, kernels)
    return True
