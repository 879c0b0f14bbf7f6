"""Compiled (numba) loops of the worker's pixel path: PIL's fixed-point resampling passes and the
fused patch layout. Integer arithmetic only in the resampling passes, so any loop order gives
PIL's exact bytes; the layout writes each output row once, in order, through a lookup table.

Why numba and not numpy: each pass is a short multiply-accumulate over a few neighbours or a
scatter into HF's patch order; in numpy that is one temporary array per tap and per axis, slower
than PIL itself. numba compiles the loops to vectorised machine code (``cache=True`` keeps the
compiled code on disk, so worker processes load it instead of compiling). This module imports
numba at import time; :mod:`.pil_resample` imports it lazily and falls back to PIL and numpy
where numba is missing.
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: PIL's fixed-point precision for 8-bit resampling (``PRECISION_BITS`` in libImaging/Resample.c)
PRECISION_BITS = 32 - 8 - 2
#: rows transposed into one tile by the horizontal pass (tile = source width x TILE_ROWS x 3 bytes)
TILE_ROWS = 32
HALF = 1 << (PRECISION_BITS - 1)
#: filter kinds of :func:`coefficients`, with Resample.c's support radius
FILTER_KINDS = {"bicubic": (0, 2.0), "bilinear": (1, 1.0)}


@numba.njit(cache=True, nogil=True)
def _filter(kind, x):  # pragma: no cover - compiled
    """Resample.c's ``bicubic_filter`` (a = -0.5; kind 0) and ``bilinear_filter`` (kind 1)."""
    if x < 0.0:
        x = -x
    if kind == 0:
        a = -0.5
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0
    if x < 1.0:
        return 1.0 - x
    return 0.0


@numba.njit(cache=True, nogil=True)
def coefficients(in_size, out_size, kind, base_support):  # pragma: no cover - compiled
    """(first source index, tap count, int32 weights [out_size, ksize]) of one axis: Resample.c's
    ``precompute_coeffs`` + ``normalize_coeffs_8bpc``, the same double operations in the same order
    (no fast-math, so the fixed-point integers are PIL's)."""
    scale = in_size / out_size
    filterscale = scale if scale > 1.0 else 1.0
    support = base_support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    first = np.empty(out_size, np.int64)
    count = np.empty(out_size, np.int64)
    fixed = np.zeros((out_size, ksize), np.int32)
    w = np.empty(ksize, np.float64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        lo = int(center - support + 0.5)
        if lo < 0:
            lo = 0
        hi = int(center + support + 0.5)
        if hi > in_size:
            hi = in_size
        n = hi - lo
        total = 0.0
        for x in range(n):
            v = _filter(kind, (x + lo - center + 0.5) * ss)
            w[x] = v
            total += v
        for x in range(n):
            if total != 0.0:
                w[x] /= total
        for x in range(n):
            scaled = w[x] * (1 << PRECISION_BITS)
            fixed[xx, x] = int(-0.5 + scaled) if w[x] < 0 else int(0.5 + scaled)
        first[xx] = lo
        count[xx] = n
    return first, count, fixed


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate(acc, n, rows, first, count, weights):  # pragma: no cover - compiled
    """acc[:n] = HALF + sum_j rows[first + j, :n] * weights[j]: one output's taps, over a vector."""
    for i in range(n):
        acc[i] = HALF
    for j in range(count):
        k = weights[j]
        r = rows[first + j]
        for i in range(n):
            acc[i] += np.int32(r[i]) * k


@numba.njit(cache=True, nogil=True)
def horizontal(src, y0, y1, xmin, xlen, coef, out):  # pragma: no cover - compiled
    """out[y - y0, xx, c] = clip((HALF + sum_j src[y, xmin[xx] + j, c] * coef[xx, j]) >> PRECISION_BITS)
    for y in [y0, y1). A band of rows is transposed into a tile so the taps run over contiguous
    vectors; the results go to an output tile the same way (the clip and narrowing vectorise)
    and are copied back into the band's rows at the end (31% less time than clipping straight
    into ``out``, whose pixels for one output column lie in 32 different rows)."""
    out_w = xmin.shape[0]
    width = src.shape[1]
    tile = np.empty((width, TILE_ROWS * 3), np.uint8)
    out_tile = np.empty((out_w, TILE_ROWS * 3), np.uint8)
    acc = np.empty(TILE_ROWS * 3, np.int32)
    for yb in range(y0, y1, TILE_ROWS):
        nb = min(TILE_ROWS, y1 - yb)
        n3 = nb * 3
        for r in range(nb):
            row = src[yb + r]
            for x in range(width):
                tile[x, r * 3] = row[x, 0]
                tile[x, r * 3 + 1] = row[x, 1]
                tile[x, r * 3 + 2] = row[x, 2]
        for xx in range(out_w):
            _accumulate(acc, n3, tile, xmin[xx], xlen[xx], coef[xx])
            column = out_tile[xx]
            for i in range(n3):
                column[i] = min(max(acc[i] >> PRECISION_BITS, 0), 255)
        for r in range(nb):
            orow = out[yb + r - y0]
            for xx in range(out_w):
                orow[xx, 0] = out_tile[xx, r * 3]
                orow[xx, 1] = out_tile[xx, r * 3 + 1]
                orow[xx, 2] = out_tile[xx, r * 3 + 2]


@numba.njit(cache=True, nogil=True)
def vertical(src, ymin, ylen, coef, out):  # pragma: no cover - compiled
    """out[yy] = clip((HALF + sum_j src[ymin[yy] + j] * coef[yy, j]) >> PRECISION_BITS), row-vectorised."""
    out_h = ymin.shape[0]
    n = src.shape[1] * src.shape[2]
    flat_in = src.reshape(src.shape[0], n)
    flat_out = out.reshape(out_h, n)
    acc = np.empty(n, np.int32)
    for yy in range(out_h):
        _accumulate(acc, n, flat_in, ymin[yy], ylen[yy], coef[yy])
        orow = flat_out[yy]
        for i in range(n):
            orow[i] = min(max(acc[i] >> PRECISION_BITS, 0), 255)


@numba.njit(cache=True, nogil=True)
def layout(frames, patch, merge, lut, out):  # pragma: no cover - compiled
    """uint8 frames [T, H, W, 3] -> out [N, 3 * tp * patch^2] in HF's patch order (temporal
    group, merge block rows, merge block columns, rows and columns inside the block), each
    value ``lut[channel, byte]``. Frame index g * tp + t past the end repeats the last frame
    (a single image fills every temporal slot); a repeated slot is copied, not recomputed."""
    num_frames, height, width, _ = frames.shape
    gh = height // patch
    gw = width // patch
    pp = patch * patch
    tp = out.shape[1] // (3 * pp)
    gt = out.shape[0] // (gh * gw)
    n = 0
    for g in range(gt):
        for bh in range(gh // merge):
            for bw in range(gw // merge):
                for mh in range(merge):
                    for mw in range(merge):
                        y0 = (bh * merge + mh) * patch
                        x0 = (bw * merge + mw) * patch
                        row = out[n]
                        for c in range(3):
                            table = lut[c]
                            for t in range(tp):
                                f = min(g * tp + t, num_frames - 1)
                                base = (c * tp + t) * pp
                                if t > 0 and f == min(g * tp + t - 1, num_frames - 1):
                                    for i in range(pp):
                                        row[base + i] = row[base - pp + i]
                                    continue
                                img = frames[f]
                                for iy in range(patch):
                                    src = img[y0 + iy]
                                    for ix in range(patch):
                                        row[base + iy * patch + ix] = table[src[x0 + ix, c]]
                        n += 1
