"""The optional AVX-512 pixel kernels (``_pixel_simd.c``), loaded with ctypes: PIL's two
resampling passes and the patch layout of images and videos.

The resampling passes give :func:`.pixel_kernels.horizontal` and :func:`.pixel_kernels.vertical`'s
bytes (PIL's integers), about 2x faster: each weight is split into two 16-bit words so two taps
at a time go through VNNI's word dot product, and the horizontal pass picks each output byte's
taps out of a 128- or 256-byte window of the source row with byte permutes, so it needs no
transpose. Both read RGB arrays or PIL's own RGBX rows in place (4-byte pixels, see :mod:`.pil_pixels`).

The layout gives :func:`.pixel_kernels.layout`'s values bit for bit with the preset's storage
table (float32, bfloat16 bits or uint8), about 3x faster for float32: the channel bytes are spread
with one permute per patch row, normalised with the table's float32 operations (bfloat16:
then rounded to nearest even), and each patch row is streamed out with non-temporal stores
(the output is written once and never read back in the worker), for images and videos alike.
Every function here returns False (nothing written) whenever the extension is absent (not
built: no compiler or not x86-64), the CPU lacks AVX-512 VBMI and VNNI, or
``ENERGON_PACK_PIXEL_SIMD=off``; callers then use the numba kernels.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util

import numpy as np

from ..env import switched_off

#: environment variable: "off" keeps the numba kernels even where these are available
PIXEL_SIMD_ENV = "ENERGON_PACK_PIXEL_SIMD"


@functools.lru_cache(maxsize=1)
def _library():
    spec = importlib.util.find_spec(f"{__package__}._pixel_simd")
    if spec is None or not spec.origin:
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError:
        return None
    lib.ep_simd_supported.restype = ctypes.c_int
    if not lib.ep_simd_supported():
        return None
    ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    lib.ep_layout_frames.argtypes = [
        ptr,
        i64,
        i32,
        i64,
        i32,
        i32,
        i32,
        i32,
        i32,
        i32,
        i32,
        ctypes.c_float,
        ptr,
        ptr,
        ptr,
    ]
    lib.ep_resize_horizontal.argtypes = [ptr, i64, i32, i32, i32, i32, ptr, ptr, ptr, i32, ptr]
    lib.ep_resize_vertical.argtypes = [ptr, i64, i32, i32, i32, ptr, ptr, ptr, i32, ptr]
    for fn in (lib.ep_layout_frames, lib.ep_resize_horizontal, lib.ep_resize_vertical):
        fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """True when the SIMD kernels run here."""
    if switched_off(PIXEL_SIMD_ENV):
        return False
    return _library() is not None


@functools.lru_cache(maxsize=64)
def _constants(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)


#: output dtype -> the C kernel's kind (float32 values, bfloat16 bit patterns, the bytes)
_KINDS = {np.dtype(np.float32): 0, np.dtype(np.uint16): 1, np.dtype(np.uint8): 2}


def layout_frames(
    frames: np.ndarray,
    patch: int,
    merge: int,
    temporal: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    out: np.ndarray,
) -> bool:
    """Write uint8 frames [T, H, W, 3] (an image: T = 1) into ``out`` ([ceil(T/tp)*(H/p)*(W/p),
    3*tp*p*p], C-contiguous; float32 values, uint16 bfloat16 bits or uint8 bytes, as
    :func:`.layout.storage_table` stores them) in HF's patch order: temporal slot t of group g
    holds frame g*tp + t, or the last frame past the end (an image fills every slot). False
    (nothing written) where the SIMD kernel is not available or the sizes are outside what it
    handles."""
    kind = _KINDS.get(out.dtype)
    if kind is None or not out.flags.c_contiguous or not available():
        return False
    if frames.ndim == 4 and frames.shape[0] > 0 and frames.shape[3] == 3:
        rows = -(-frames.shape[0] // temporal) * (frames.shape[1] // patch) * (frames.shape[2] // patch)
    else:
        rows = -1
    if rows < 0 or out.shape != (rows, 3 * temporal * patch * patch):
        raise ValueError(
            f"layout_frames: frames {frames.shape} and output {out.shape} do not match "
            f"(patch {patch}, temporal {temporal})"
        )
    frames, frame_stride, row_stride, pixel_stride = _readable(frames)
    mean_f32, std_f32 = _constants(tuple(mean), tuple(std))
    done = _library().ep_layout_frames(
        frames.ctypes.data,
        frame_stride,
        frames.shape[0],
        row_stride,
        pixel_stride,
        frames.shape[1],
        frames.shape[2],
        patch,
        merge,
        temporal,
        kind,
        np.float32(1 / 255),
        mean_f32.ctypes.data,
        std_f32.ctypes.data,
        out.ctypes.data,
    )
    return done == 0


def _readable(frames: np.ndarray) -> tuple[np.ndarray, int, int, int]:
    """(array, frame stride, row stride, pixel stride) the kernels read: uint8 RGB frames
    [T, H, W, 3] as they are when their pixels are 3 or 4 bytes apart (RGB, or the RGBX view of
    :mod:`.pil_pixels`) in rows and frames of equal stride, else a contiguous copy."""
    t, h, w, _ = frames.shape
    if not (
        frames.dtype == np.uint8
        and frames.strides[3] == 1
        and frames.strides[2] in (3, 4)
        and frames.strides[1] >= frames.strides[2] * w
        and (t == 1 or frames.strides[0] >= frames.strides[1] * h)
    ):
        frames = np.ascontiguousarray(frames, dtype=np.uint8)
    return frames, frames.strides[0], frames.strides[1], frames.strides[2]


def _resize_args(src: np.ndarray, out: np.ndarray, first: np.ndarray, count: np.ndarray, weights: np.ndarray):
    if not (
        available()
        and out.dtype == np.uint8
        and out.flags.c_contiguous
        and weights.dtype == np.int32
        and weights.flags.c_contiguous
        and first.dtype == np.int64
        and count.dtype == np.int64
    ):
        return None
    frames, _, row_stride, pixel_stride = _readable(src[None])
    return frames[0], row_stride, pixel_stride


def resize_horizontal(
    src: np.ndarray, y0: int, y1: int, first: np.ndarray, count: np.ndarray, weights: np.ndarray, out: np.ndarray
) -> bool:
    """PIL's horizontal pass over source rows [y0, y1) into ``out`` [y1 - y0, len(first), 3]
    (arguments as :func:`.pixel_kernels.horizontal`); False (nothing written) where the SIMD
    kernel is not available or the taps of 16 outputs span more than it reaches (over ~6x down)."""
    args = _resize_args(src, out, first, count, weights)
    if args is None:
        return False
    src, row_stride, pixel_stride = args
    if out.shape != (y1 - y0, first.shape[0], 3) or not 0 <= y0 <= y1 <= src.shape[0]:
        raise ValueError(f"resize_horizontal: rows [{y0}, {y1}) of {src.shape} do not fit output {out.shape}")
    done = _library().ep_resize_horizontal(
        src.ctypes.data + y0 * row_stride,
        row_stride,
        pixel_stride,
        y1 - y0,
        src.shape[1],
        first.shape[0],
        first.ctypes.data,
        count.ctypes.data,
        weights.ctypes.data,
        weights.shape[1],
        out.ctypes.data,
    )
    return done == 0


def resize_vertical(
    src: np.ndarray, first: np.ndarray, count: np.ndarray, weights: np.ndarray, out: np.ndarray
) -> bool:
    """PIL's vertical pass into ``out`` [len(first), W, 3] (arguments as
    :func:`.pixel_kernels.vertical`); False (nothing written) where the SIMD kernel is not available."""
    args = _resize_args(src, out, first, count, weights)
    if args is None:
        return False
    src, row_stride, pixel_stride = args
    if out.shape != (first.shape[0], src.shape[1], 3):
        raise ValueError(f"resize_vertical: source {src.shape} does not fit output {out.shape}")
    done = _library().ep_resize_vertical(
        src.ctypes.data,
        row_stride,
        pixel_stride,
        src.shape[1],
        first.shape[0],
        first.ctypes.data,
        count.ctypes.data,
        weights.ctypes.data,
        weights.shape[1],
        out.ctypes.data,
    )
    return done == 0
