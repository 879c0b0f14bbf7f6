"""The compiled pixel path: PIL's resize byte for byte, the fused patch layout equal to the
PIL + numpy path, and the fallbacks (no numba / unverified filter / turned off)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from energon_pack import pixels as P
from energon_pack.bench.pixel_bench import make_image_set
from energon_pack.pixels import pil_resample as R
from energon_pack.pixels import pixel_kernels as K
from energon_pack.pixels import pixel_simd
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl import vision as V


def _pil(src: np.ndarray, out_h: int, out_w: int, resample: str) -> np.ndarray:
    return np.asarray(Image.fromarray(src).resize((out_w, out_h), resample=getattr(Image.Resampling, resample.upper())))


def _random_case(rng: np.random.Generator, max_in: int = 260, max_out: int = 330):
    h, w = (int(v) for v in rng.integers(1, max_in, 2))
    out_h, out_w = (int(v) for v in rng.integers(1, max_out, 2))
    src = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    if rng.random() < 0.5:  # blocks and hard edges: clipping at 0 and 255 happens there
        src = np.repeat(np.repeat(src[::7, ::5], 7, axis=0), 5, axis=1)[:h, :w].copy()
    return src, out_h, out_w


def _assert_same_patches(images, expected, preset) -> None:
    """patchify_image of each image gives exactly ``expected`` (values, dtype and grid)."""
    for data, (pv, grid) in zip(images, expected):
        got_pv, got_grid = V.patchify_image(data, preset)
        assert got_pv.dtype == pv.dtype
        np.testing.assert_array_equal(got_pv, pv)
        np.testing.assert_array_equal(got_grid, grid)


def test_the_compiled_path_is_verified_here():
    """numba is a dependency: the fast path must be on in this environment, for both filters."""
    assert R.fast_resize_available("bicubic") and R.fast_resize_available("bilinear")
    assert not R.fast_resize_available("lanczos")


@pytest.mark.parametrize("resample", ["bicubic", "bilinear"])
def test_resize_equals_pil_byte_for_byte(resample):
    rng = np.random.default_rng(11 if resample == "bicubic" else 12)
    cases = [_random_case(rng) for _ in range(150)]
    # one-axis, 1-pixel sides, strong down- and upscaling, both pass orders
    edge = [
        (1, 1, 5, 7),
        (1, 200, 1, 3),
        (200, 1, 3, 1),
        (97, 13, 97, 300),
        (300, 40, 12, 40),
        (9, 300, 300, 9),
        (61, 47, 19, 47),
        (64, 48, 20, 60),
        (250, 250, 28, 252),
    ]
    for h, w, oh, ow in edge:
        cases.append((rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), oh, ow))
    for src, oh, ow in cases:
        got = R.resize_rgb(src, oh, ow, resample)
        assert got.dtype == np.uint8 and got.shape == (oh, ow, 3)
        np.testing.assert_array_equal(got, _pil(src, oh, ow, resample), err_msg=f"{src.shape} -> {(oh, ow)}")


def test_real_photos_resize_to_pils_bytes():
    preset = get_preset("qwen2.5-vl")
    for im in make_image_set(12, seed=3):
        rgb = np.asarray(P.to_rgb_image(P.open_image(im["data"])))
        oh, ow = V.resized_image_size(rgb.shape[0], rgb.shape[1], preset)
        np.testing.assert_array_equal(R.resize_rgb(rgb, oh, ow), _pil(rgb, oh, ow, "bicubic"))


def test_the_probe_tells_the_pass_orders_apart():
    """The two pass orders PIL has had give different bytes where the height shrinks much more
    than the width; the verified rule is the one that matches the installed Pillow."""
    rng = np.random.default_rng(5)
    src = rng.integers(0, 256, size=(109, 181, 3), dtype=np.uint8)
    ref = _pil(src, 19, 235, "bicubic")
    by_rule = {rule: R._resize(src, 19, 235, "bicubic", rule) for rule in R.ORDER_RULES}
    assert not np.array_equal(*by_rule.values())
    rule = R._verified_rule("bicubic")
    assert np.array_equal(by_rule[rule], ref)
    other = next(r for r in R.ORDER_RULES if r != rule)
    assert not np.array_equal(by_rule[other], ref)


def test_coefficients_are_pils_fixed_point_weights():
    """Each output's weights sum to 1.0 in 22-bit fixed point (within rounding of its taps), and
    the tap windows stay inside the source."""
    for in_size, out_size in ((100, 37), (37, 100), (1411, 1008), (5, 5), (1, 9)):
        xmin, xlen, fixed = R.coefficients(in_size, out_size, "bicubic")
        assert (xmin >= 0).all() and (xlen >= 1).all() and (xmin + xlen <= in_size).all()
        sums = fixed.astype(np.int64).sum(axis=1)
        assert np.abs(sums - (1 << K.PRECISION_BITS)).max() <= fixed.shape[1]
        assert not fixed.flags.writeable


def test_unverified_filter_falls_back_to_pil():
    rng = np.random.default_rng(2)
    src = rng.integers(0, 256, size=(40, 30, 3), dtype=np.uint8)
    np.testing.assert_array_equal(R.resize_rgb(src, 17, 61, "lanczos"), _pil(src, 17, 61, "lanczos"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
def test_compiled_and_numpy_paths_give_identical_images_and_videos(dtype, monkeypatch):
    preset = get_preset("qwen2.5-vl", pixel_dtype=dtype)
    video_preset = get_preset("qwen3-vl", pixel_dtype=dtype)
    images = [im["data"] for im in make_image_set(8, seed=7)]
    frames = [images[i] for i in (0, 0, 1, 1, 2)]  # 5 frames: the last is repeated to fill tp=2
    fast = [V.patchify_image(d, preset) for d in images], V.patchify_video(frames, video_preset, fps=2.0)
    assert P.compiled(preset.resample) is not None
    monkeypatch.setenv(P.PIXEL_KERNELS_ENV, "off")
    assert P.compiled(preset.resample) is None
    slow = [V.patchify_image(d, preset) for d in images], V.patchify_video(frames, video_preset, fps=2.0)
    for (pf, gf), (ps, gs) in zip(fast[0], slow[0]):
        assert pf.dtype == ps.dtype
        np.testing.assert_array_equal(pf, ps)
        np.testing.assert_array_equal(gf, gs)
    for a, b in zip(fast[1], slow[1]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_without_numba_the_pixel_path_still_works(monkeypatch):
    """An environment where numba cannot be imported: same pixels from PIL and numpy."""
    import builtins
    import sys

    preset = get_preset("qwen2-vl")
    data = make_image_set(3, seed=9)
    fast = [V.patchify_image(im["data"], preset) for im in data]
    real_import = builtins.__import__

    def no_numba(name, *args, **kwargs):
        if name == "numba" or name.startswith("numba."):
            raise ImportError("no numba here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numba)
    monkeypatch.delitem(sys.modules, "energon_pack.pixels.pixel_kernels", raising=False)
    monkeypatch.delattr(sys.modules["energon_pack.pixels"], "pixel_kernels", raising=False)
    R._verified_rule.cache_clear()
    try:
        assert not R.fast_resize_available("bicubic")
        assert V.warm_pixel_path(preset) is False
        _assert_same_patches([im["data"] for im in data], fast, preset)
    finally:
        R._verified_rule.cache_clear()


def test_a_kernel_that_cannot_run_here_falls_back_to_pil_with_one_warning(monkeypatch):
    """numba may fail at compile or cache time (read-only install, no writable home): the probe
    catches it, warns once, and every image still gets PIL's exact pixels."""

    def broken(*args, **kwargs):
        raise RuntimeError("cannot cache function 'horizontal': no locator available")

    preset = get_preset("qwen2.5-vl")
    data = make_image_set(2, seed=4)
    fast = [V.patchify_image(im["data"], preset) for im in data]
    monkeypatch.setenv(pixel_simd.PIXEL_SIMD_ENV, "off")  # else the SIMD passes would stand in for numba's
    monkeypatch.setattr(K, "horizontal", broken)
    monkeypatch.setattr(K, "vertical", broken)
    R._verified_rule.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="compiled pixel kernels unavailable"):
            assert not R.fast_resize_available("bicubic")
        _assert_same_patches([im["data"] for im in data], fast, preset)
    finally:
        R._verified_rule.cache_clear()


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_warming_compiles_every_kernel_variant_real_images_need(dtype):
    """Decoded images are read-only arrays, resize outputs writable ones; numba compiles one
    variant per kind. After warm_pixel_path (what the task encoder runs before workers fork),
    real images, resized or not, in both pass orders, compile nothing more."""
    import io

    preset = get_preset("qwen2.5-vl", pixel_dtype=dtype)
    assert V.warm_pixel_path(preset)
    counts = lambda: {n: len(getattr(K, n).signatures) for n in ("horizontal", "vertical", "layout", "coefficients")}
    before = counts()
    exact = io.BytesIO()
    Image.new("RGB", (448, 448), (10, 20, 30)).save(exact, "PNG")  # already on the grid: no resize
    tall = io.BytesIO()
    Image.new("RGB", (300, 2000), (1, 2, 3)).save(tall, "PNG")  # height shrinks most: vertical pass first
    for data in [im["data"] for im in make_image_set(6, seed=1)] + [exact.getvalue(), tall.getvalue()]:
        V.patchify_image(data, preset)
    wide = np.asarray(Image.new("RGB", (3000, 40), (4, 5, 6)))  # 10x narrower: past the SIMD pass's reach (6x)
    R.resize_rgb(wide, 30, 300, preset.resample)  # numba's horizontal pass (read-only source), then vertical
    assert counts() == before
