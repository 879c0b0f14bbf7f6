"""The optional AVX-512 patch layout of one image (``_pixel_simd.c``), loaded with ctypes.

Same values, bit for bit, as :func:`.pixel_kernels.layout` with the preset's storage table
(float32, bfloat16 bits or uint8), about 3x faster for float32: the channel bytes are spread
with one permute per patch row, normalised with the table's float32 operations (bfloat16:
then rounded to nearest even), and each patch row is streamed out with non-temporal stores
(the output is written once and never read back in the worker). Used for single images;
videos keep the numba kernel. :func:`layout_image` returns False whenever the extension is
absent (not built: no compiler or not x86-64), the CPU lacks AVX-512 VBMI, or
``ENERGON_PACK_PIXEL_SIMD=off``; callers then use the numba kernel.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util

import numpy as np

from ..env import switched_off

#: environment variable: "off" keeps the numba layout even where this one is available
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
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.ep_layout_image.argtypes = [ptr, i32, i32, i32, i32, i32, i32, ctypes.c_float, ptr, ptr, ptr]
    lib.ep_layout_image.restype = ctypes.c_int
    return lib


def available() -> bool:
    """True when :func:`layout_image` runs the SIMD kernel here."""
    if switched_off(PIXEL_SIMD_ENV):
        return False
    return _library() is not None


@functools.lru_cache(maxsize=64)
def _constants(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)


#: output dtype -> the C kernel's kind (float32 values, bfloat16 bit patterns, the bytes)
_KINDS = {np.dtype(np.float32): 0, np.dtype(np.uint16): 1, np.dtype(np.uint8): 2}


def layout_image(frame: np.ndarray, patch: int, merge: int, temporal: int, mean: tuple[float, ...],
                 std: tuple[float, ...], out: np.ndarray) -> bool:
    """Write one uint8 image [H, W, 3] into ``out`` ([(H/p)*(W/p), 3*tp*p*p], C-contiguous; float32
    values, uint16 bfloat16 bits or uint8 bytes, as :func:`.vision._storage_table` stores them)
    in HF's patch order, every temporal slot a copy of the image. False (nothing written) where
    the SIMD kernel is not available or the sizes are outside what it handles."""
    kind = _KINDS.get(out.dtype)
    if kind is None or not out.flags.c_contiguous or not available():
        return False
    rows = (frame.shape[0] // patch) * (frame.shape[1] // patch) if frame.ndim == 3 else -1
    if rows < 0 or frame.shape[2] != 3 or out.shape != (rows, 3 * temporal * patch * patch):
        raise ValueError(f"layout_image: image {frame.shape} and output {out.shape} do not match "
                         f"(patch {patch}, temporal {temporal})")
    frame = np.ascontiguousarray(frame, dtype=np.uint8)
    mean_f32, std_f32 = _constants(tuple(mean), tuple(std))
    done = _library().ep_layout_image(
        frame.ctypes.data, frame.shape[0], frame.shape[1], patch, merge, temporal, kind, np.float32(1 / 255),
        mean_f32.ctypes.data, std_f32.ctypes.data, out.ctypes.data)
    return done == 0
