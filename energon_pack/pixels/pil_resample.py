"""PIL's resize of 8-bit RGB, byte for byte, at a fraction of its cost.

Transformers' Qwen-VL image processors resize with ``PIL.Image.resize`` (bicubic), and that
resize was over half of our worker's pixel time. This module computes PIL's own fixed-point
filter coefficients (``precompute_coeffs`` / ``normalize_coeffs_8bpc`` of Pillow's
``libImaging/Resample.c``: the same double arithmetic in the same order), runs the two separable
passes with compiled integer kernels (:mod:`.pixel_kernels`), and follows the installed Pillow's
pass order: Pillow 13 runs the vertical pass first when the height shrinks more than twice as
much as the width, older Pillow always runs the horizontal pass first.

Trust, but check: :func:`resize_rgb` is used only after :func:`fast_resize_available` has resized
a set of probe images both ways and found our bytes equal to the installed Pillow's for that
filter; otherwise (no numba, an unknown Pillow change, another filter) callers use PIL itself.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import numpy as np
from PIL import Image

from . import pixel_simd

#: resample names with a compiled path (the others always use PIL)
FILTERS = ("bicubic", "bilinear")
#: pass-order rules PIL has had: "vertical_when_height_shrinks_more" (Pillow 13+), "horizontal_first"
ORDER_RULES = ("vertical_when_height_shrinks_more", "horizontal_first")


@functools.lru_cache(maxsize=4096)
def coefficients(in_size: int, out_size: int, resample: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first source index, tap count, int32 fixed-point weights [out_size, ksize]) of one axis,
    PIL's own integers (see :func:`.pixel_kernels.coefficients`); read-only, cached per size pair."""
    from . import pixel_kernels as K

    kind, support = K.FILTER_KINDS[resample]
    arrays = K.coefficients(in_size, out_size, kind, support)
    for arr in arrays:
        arr.flags.writeable = False
    return arrays


def _horizontal_first(height: int, width: int, out_h: int, out_w: int, rule: str) -> bool:
    if rule == "horizontal_first":
        return True
    shrink_h, shrink_w = height - out_h, width - out_w
    return not (shrink_h > 0 and shrink_h > shrink_w * 2)


def horizontal(src: np.ndarray, y0: int, y1: int, out_w: int, resample: str) -> np.ndarray:
    """PIL's horizontal pass over source rows [y0, y1): the SIMD kernel where it runs, else numba."""
    from . import pixel_kernels as K

    xmin, xlen, xcoef = coefficients(src.shape[1], out_w, resample)
    out = np.empty((y1 - y0, out_w, 3), dtype=np.uint8)
    if not pixel_simd.resize_horizontal(src, y0, y1, xmin, xlen, xcoef, out):
        K.horizontal(np.ascontiguousarray(src), y0, y1, xmin, xlen, xcoef, out)
    return out


def vertical(src: np.ndarray, ymin: np.ndarray, ylen: np.ndarray, ycoef: np.ndarray) -> np.ndarray:
    """PIL's vertical pass: the SIMD kernel where it runs, else numba."""
    from . import pixel_kernels as K

    out = np.empty((ymin.shape[0], src.shape[1], 3), dtype=np.uint8)
    if not pixel_simd.resize_vertical(src, ymin, ylen, ycoef, out):
        K.vertical(np.ascontiguousarray(src), ymin, ylen, ycoef, out)
    return out


def _resize(hwc: np.ndarray, out_h: int, out_w: int, resample: str, rule: str) -> np.ndarray:
    """Both passes in the installed Pillow's order; ``hwc`` may be a strided view (RGBX rows)."""
    height, width, _ = hwc.shape
    need_h, need_v = out_w != width, out_h != height
    if hwc.dtype != np.uint8:
        hwc = hwc.astype(np.uint8)
    if not (need_h or need_v):
        return np.array(hwc, order="C")
    ymin, ylen, ycoef = coefficients(height, out_h, resample)
    if _horizontal_first(height, width, out_h, out_w, rule):
        cur = hwc
        if need_h:
            y0, y1 = (int(ymin[0]), int(ymin[-1] + ylen[-1])) if need_v else (0, height)
            cur, ymin = horizontal(hwc, y0, y1, out_w, resample), ymin - y0
        return vertical(cur, ymin, ylen, ycoef) if need_v else cur
    cur = vertical(hwc, ymin, ylen, ycoef) if need_v else hwc
    return horizontal(cur, 0, out_h, out_w, resample) if need_h else cur


def resize_strips(
    read: Callable[[int, int], np.ndarray], height: int, width: int, out_h: int, out_w: int, resample: str, strip: int
) -> np.ndarray:
    """:func:`resize_rgb` of a ``height`` x ``width`` source that ``read(y0, y1)`` gives a strip of rows at a time
    (about ``strip`` source pixels): both passes per strip of output rows, in the installed Pillow's order, so
    memory is the output and one strip, never the whole source as an array (the bytes are the same: each pass is
    per row or per output row). Needs :func:`fast_resize_available`."""
    rule = _verified_rule(resample)
    if rule is None:
        raise ValueError(f"resize_strips: no verified compiled resize for {resample!r}")
    need_h, need_v = out_w != width, out_h != height
    ymin, ylen, ycoef = coefficients(height, out_h, resample)
    step = max(1, (strip // max(width, 1)) * out_h // height)
    out = np.empty((out_h, out_w, 3), dtype=np.uint8)
    for j0 in range(0, out_h, step):
        j1 = min(out_h, j0 + step)
        y0, y1 = (int(ymin[j0]), int((ymin[j0:j1] + ylen[j0:j1]).max())) if need_v else (j0, j1)
        rows = read(y0, y1)
        first, count, weights = ymin[j0:j1] - y0, ylen[j0:j1], ycoef[j0:j1]
        if _horizontal_first(height, width, out_h, out_w, rule):
            rows = horizontal(rows, 0, y1 - y0, out_w, resample) if need_h else rows
            out[j0:j1] = vertical(rows, first, count, weights) if need_v else rows
        else:
            rows = vertical(rows, first, count, weights) if need_v else rows
            out[j0:j1] = horizontal(rows, 0, j1 - j0, out_w, resample) if need_h else rows
    return out


#: (source h, w, target h, w): one-axis cases, both orders of Pillow 13, up- and downscaling, and
#: a 12x narrowing the SIMD horizontal pass leaves to numba's (so both passes' code is checked)
PROBE_SIZES = (
    (37, 53, 37, 80),
    (61, 47, 19, 47),
    (64, 48, 20, 60),
    (30, 90, 56, 40),
    (45, 45, 97, 13),
    (200, 31, 41, 29),
    (6, 1200, 6, 100),
)


@functools.cache
def _verified_rule(resample: str) -> str | None:
    """The pass-order rule under which our resize equals the installed Pillow's on every probe
    image, or None (numba missing, filter not supported here, or no rule matches)."""
    if resample not in FILTERS:
        return None
    try:
        from . import pixel_kernels  # noqa: F401  (numba)
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    probes = []
    for h, w, oh, ow in PROBE_SIZES:
        src = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        src[: h // 2] = src[: h // 2, :1]  # flat stretches and edges, not only noise
        ref = np.asarray(Image.fromarray(src).resize((ow, oh), resample=getattr(Image.Resampling, resample.upper())))
        probes.append((src, oh, ow, ref))
    try:
        for rule in ORDER_RULES:
            if all(np.array_equal(_resize(src, oh, ow, resample, rule), ref) for src, oh, ow, ref in probes):
                return rule
    except Exception as exc:  # e.g. numba cannot compile or cache here (read-only install, no home)
        warnings.warn(
            f"energon_pack: compiled pixel kernels unavailable ({type(exc).__name__}: {exc}); using PIL "
            f"for resizing (same pixels, slower). Setting NUMBA_CACHE_DIR to a writable folder may help.",
            RuntimeWarning,
            stacklevel=2,
        )
    return None


def fast_resize_available(resample: str) -> bool:
    """True when :func:`resize_rgb` reproduces this Pillow's ``resample`` resize (checked once per process)."""
    return _verified_rule(resample) is not None


def resize_rgb(hwc: np.ndarray, out_h: int, out_w: int, resample: str = "bicubic") -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [out_h, out_w, 3], equal to ``Image.fromarray(hwc).resize((out_w,
    out_h), resample)``; PIL itself does it when the fast path is not verified for ``resample``."""
    rule = _verified_rule(resample)
    if rule is None:
        img = Image.fromarray(np.ascontiguousarray(hwc, dtype=np.uint8))
        return np.asarray(img.resize((out_w, out_h), resample=getattr(Image.Resampling, resample.upper())))
    return _resize(hwc, out_h, out_w, resample, rule)
