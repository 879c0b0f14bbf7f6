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
import math

import numpy as np
from PIL import Image

PRECISION_BITS = 32 - 8 - 2


def _bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    out = np.zeros_like(x)
    near = x < 1.0
    far = ~near & (x < 2.0)
    xn, xf = x[near], x[far]
    out[near] = ((a + 2.0) * xn - (a + 3.0)) * xn * xn + 1
    out[far] = (((xf - 5) * xf + 8) * xf - 4) * a
    return out


def _bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


#: resample name -> (filter, support), as in Resample.c
FILTERS = {"bicubic": (_bicubic, 2.0), "bilinear": (_bilinear, 1.0)}
#: pass-order rules PIL has had: "vertical_when_height_shrinks_more" (Pillow 13+), "horizontal_first"
ORDER_RULES = ("vertical_when_height_shrinks_more", "horizontal_first")


@functools.lru_cache(maxsize=4096)
def coefficients(in_size: int, out_size: int, resample: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first source index, tap count, int32 fixed-point weights [out_size, ksize]) of one axis,
    computed with Resample.c's double operations in its order (so the integers are PIL's)."""
    filt, base_support = FILTERS[resample]
    scale = float(np.float32(in_size)) / out_size  # (double)(in1 - in0) / outSize, box in float32
    filterscale = max(scale, 1.0)
    support = base_support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xlen = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    weights = np.zeros((out_size, ksize), dtype=np.float64)
    total = np.zeros(out_size, dtype=np.float64)
    for j in range(ksize):  # one tap at a time: the sum is accumulated in C's order
        w = filt(((j + xmin).astype(np.float64) - center + 0.5) * (1.0 / filterscale))
        w[j >= xlen] = 0.0
        weights[:, j] = w
        total = total + w
    nonzero = total != 0.0
    weights[nonzero] /= total[nonzero, None]
    scaled = weights * (1 << PRECISION_BITS)
    fixed = np.where(weights < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled)).astype(np.int32)
    for arr in (xmin, xlen, fixed):
        arr.flags.writeable = False
    return xmin, xlen, fixed


def _horizontal_first(height: int, width: int, out_h: int, out_w: int, rule: str) -> bool:
    if rule == "horizontal_first":
        return True
    shrink_h, shrink_w = height - out_h, width - out_w
    return not (shrink_h > 0 and shrink_h > shrink_w * 2)


def _resize(hwc: np.ndarray, out_h: int, out_w: int, resample: str, rule: str) -> np.ndarray:
    from . import pixel_kernels as K

    height, width, _ = hwc.shape
    need_h, need_v = out_w != width, out_h != height
    cur = np.ascontiguousarray(hwc, dtype=np.uint8)
    if not (need_h or need_v):
        return cur.copy()
    ymin, ylen, ycoef = coefficients(height, out_h, resample)
    if _horizontal_first(height, width, out_h, out_w, rule):
        if need_h:
            xmin, xlen, xcoef = coefficients(width, out_w, resample)
            y0, y1 = (int(ymin[0]), int(ymin[-1] + ylen[-1])) if need_v else (0, height)
            tmp = np.empty((y1 - y0, out_w, 3), dtype=np.uint8)
            K.horizontal(cur, y0, y1, xmin, xlen, xcoef, tmp)
            cur, ymin = tmp, ymin - y0
        if need_v:
            out = np.empty((out_h, out_w, 3), dtype=np.uint8)
            K.vertical(cur, ymin, ylen, ycoef, out)
            cur = out
        return cur
    if need_v:
        tmp = np.empty((out_h, width, 3), dtype=np.uint8)
        K.vertical(cur, ymin, ylen, ycoef, tmp)
        cur = tmp
    if need_h:
        xmin, xlen, xcoef = coefficients(width, out_w, resample)
        out = np.empty((out_h, out_w, 3), dtype=np.uint8)
        K.horizontal(cur, 0, out_h, xmin, xlen, xcoef, out)
        cur = out
    return cur


#: (source h, w, target h, w): one-axis cases, both orders of Pillow 13, up- and downscaling
PROBE_SIZES = ((37, 53, 37, 80), (61, 47, 19, 47), (64, 48, 20, 60), (30, 90, 56, 40), (45, 45, 97, 13),
               (200, 31, 41, 29))


@functools.lru_cache(maxsize=None)
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
    for rule in ORDER_RULES:
        if all(np.array_equal(_resize(src, oh, ow, resample, rule), ref) for src, oh, ow, ref in probes):
            return rule
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
