"""The optional AVX-512 float32 layout gives the numba kernel's values bit for bit, and steps aside cleanly."""

from __future__ import annotations

import importlib.util
import io
import platform
import shutil

import numpy as np
import pytest
from PIL import Image

from energon_pack import pixels as P
from energon_pack.pixels import pixel_kernels as K
from energon_pack.pixels import pixel_simd
from energon_pack.qwen_vl import vision as V
from energon_pack.qwen_vl.presets import get_preset

needs_simd = pytest.mark.skipif(not pixel_simd.available(), reason="AVX-512 VBMI layout not available here")


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or shutil.which("gcc") is None,
    reason="the extension is only built on x86-64 with a C compiler",
)
def test_the_extension_is_built_by_the_install():
    assert importlib.util.find_spec("energon_pack.pixels._pixel_simd") is not None


def _numba_layout(img: np.ndarray, preset) -> np.ndarray:
    p, table = preset.patch_size, P.storage_table(preset)
    out = np.empty(((img.shape[0] // p) * (img.shape[1] // p), preset.patch_dim), table.dtype)
    K.layout(img[None], p, preset.merge_size, table, out)
    return out


@needs_simd
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_simd_layout_equals_the_numba_kernel_bit_for_bit(name, dtype):
    preset = get_preset(name, pixel_dtype=dtype)
    p, m, tp = preset.patch_size, preset.merge_size, preset.temporal_patch_size
    f = p * m
    rng = np.random.default_rng(7)
    for h, w in ((1, 1), (3, 5), (7, 2), (1, 40), (37, 41)):
        img = rng.integers(0, 256, (h * f, w * f, 3), dtype=np.uint8)
        img[0, 0] = (0, 0, 0)
        img[-1, -1] = (255, 255, 255)  # both ends of every channel's table
        if h == 3:
            img.flags.writeable = False  # decoded images arrive read-only
        ref = _numba_layout(img, preset)
        rgbx = np.concatenate([img, rng.integers(0, 256, img.shape[:2] + (1,), dtype=np.uint8)], axis=2)
        for source in (img, rgbx[:, :, :3]):  # RGB, and PIL's own RGBX rows (4-byte pixels) in place
            out = np.full_like(ref, 0x7F)
            assert pixel_simd.layout_frames(source[None], p, m, tp, preset.image_mean, preset.image_std, out)
            if dtype == "float32":  # compare bit patterns: -0.0 and 0.0 told apart
                out, ref_bits = out.view(np.uint32), ref.view(np.uint32)
            else:
                ref_bits = ref
            np.testing.assert_array_equal(out, ref_bits)


@needs_simd
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
@pytest.mark.parametrize("name", ["qwen2.5-vl", "qwen3-vl"])
def test_simd_video_layout_equals_the_numba_kernel_bit_for_bit(name, dtype):
    """Frames of a video: temporal slot t of group g is frame g*tp + t, the last frame repeats
    past the end (odd counts), for 1..5 frames, contiguous and strided (every other frame)."""
    preset = get_preset(name, pixel_dtype=dtype)
    p, m, tp = preset.patch_size, preset.merge_size, preset.temporal_patch_size
    f, table = p * m, P.storage_table(preset)
    rng = np.random.default_rng(11)
    for count in range(1, 6):
        every = rng.integers(0, 256, (2 * count, 2 * f, 3 * f, 3), dtype=np.uint8)
        for frames in (np.ascontiguousarray(every[:count]), every[::2]):
            rows = -(-count // tp) * 2 * m * 3 * m
            ref = np.empty((rows, preset.patch_dim), table.dtype)
            K.layout(np.ascontiguousarray(frames), p, m, table, ref)
            out = np.full_like(ref, 0x7F)
            assert pixel_simd.layout_frames(frames, p, m, tp, preset.image_mean, preset.image_std, out)
            np.testing.assert_array_equal(out.view(np.uint8), ref.view(np.uint8), err_msg=f"{count} frames")


@needs_simd
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
def test_patchify_image_is_unchanged_with_the_simd_layout(monkeypatch, dtype):
    preset = get_preset("qwen2.5-vl", pixel_dtype=dtype)
    rng = np.random.default_rng(3)
    datas = []
    for fmt, size in (("JPEG", (517, 389)), ("PNG", (1203, 95)), ("JPEG", (64, 900))):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, fmt)
        datas.append(buf.getvalue())
    with_simd = [V.patchify_image(d, preset) for d in datas]
    monkeypatch.setenv(pixel_simd.PIXEL_SIMD_ENV, "off")
    assert not pixel_simd.available()
    without = [V.patchify_image(d, preset) for d in datas]
    for (a, ga), (b, gb) in zip(with_simd, without):
        np.testing.assert_array_equal(ga, gb)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@needs_simd
def test_mismatched_output_is_refused_before_any_write():
    preset = get_preset("qwen2.5-vl")
    img = np.zeros((56, 56, 3), np.uint8)
    out = np.empty((15, preset.patch_dim), np.float32)  # 16 rows needed
    with pytest.raises(ValueError, match="do not match"):
        pixel_simd.layout_frames(img[None], 14, 2, 2, preset.image_mean, preset.image_std, out)


def test_other_dtypes_and_the_off_switch_leave_the_numba_kernel_in_charge(monkeypatch):
    preset = get_preset("qwen2.5-vl")
    img = np.zeros((28, 28, 3), np.uint8)
    as_f64 = np.empty((4, preset.patch_dim), np.float64)  # not a storage dtype
    assert not pixel_simd.layout_frames(img[None], 14, 2, 2, preset.image_mean, preset.image_std, as_f64)
    monkeypatch.setenv(pixel_simd.PIXEL_SIMD_ENV, "off")
    out = np.empty((4, preset.patch_dim), np.float32)
    assert not pixel_simd.layout_frames(img[None], 14, 2, 2, preset.image_mean, preset.image_std, out)


@needs_simd
@pytest.mark.parametrize("resample", ["bicubic", "bilinear"])
def test_simd_resize_passes_equal_the_numba_passes_byte_for_byte(resample):
    """Both passes, RGB and RGBX sources, up- and downscaling (600 -> 100 needs the 256-byte
    window); past the horizontal pass's reach (over ~6x down) it declines and writes nothing."""
    from energon_pack.pixels.pil_resample import coefficients

    rng = np.random.default_rng(3 if resample == "bicubic" else 4)
    sizes = [tuple(int(v) for v in rng.integers(1, 300, 4)) for _ in range(60)]
    sizes += [(1, 1, 1, 5), (5, 1, 1, 1), (40, 17, 40, 16), (33, 600, 33, 100), (9, 1200, 9, 100), (300, 9, 50, 9)]
    declined = 0
    for h, w, out_h, out_w in sizes:
        rgbx = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
        if rng.random() < 0.5:  # hard edges: clipping at 0 and 255
            rgbx = np.where(rgbx > 127, 255, 0).astype(np.uint8)
        for src in (np.ascontiguousarray(rgbx[:, :, :3]), rgbx[:, :, :3]):
            xmin, xlen, xcoef = coefficients(w, out_w, resample)
            ref = np.empty((h - 1, out_w, 3), np.uint8)
            K.horizontal(np.ascontiguousarray(src), 1, h, xmin, xlen, xcoef, ref)  # rows [1, h)
            out = np.full_like(ref, 7)
            if pixel_simd.resize_horizontal(src, 1, h, xmin, xlen, xcoef, out):
                np.testing.assert_array_equal(out, ref, err_msg=f"horizontal {(h, w)} -> {out_w}")
            else:
                declined += 1
                assert (out == 7).all()
            ymin, ylen, ycoef = coefficients(h, out_h, resample)
            ref = np.empty((out_h, w, 3), np.uint8)
            K.vertical(np.ascontiguousarray(src), ymin, ylen, ycoef, ref)
            out = np.empty_like(ref)
            assert pixel_simd.resize_vertical(src, ymin, ylen, ycoef, out)
            np.testing.assert_array_equal(out, ref, err_msg=f"vertical {(h, w)} -> {out_h}")
    assert declined >= 2  # (9, 1200) -> 100 is 12x down: both its sources were declined


@needs_simd
def test_simd_resize_refuses_mismatched_shapes():
    from energon_pack.pixels.pil_resample import coefficients

    src = np.zeros((10, 20, 3), np.uint8)
    xmin, xlen, xcoef = coefficients(20, 8, "bicubic")
    with pytest.raises(ValueError, match="do not fit"):
        pixel_simd.resize_horizontal(src, 0, 10, xmin, xlen, xcoef, np.empty((9, 8, 3), np.uint8))
    ymin, ylen, ycoef = coefficients(10, 4, "bicubic")
    with pytest.raises(ValueError, match="does not fit"):
        pixel_simd.resize_vertical(src, ymin, ylen, ycoef, np.empty((4, 21, 3), np.uint8))


@needs_simd
def test_simd_resize_declines_weights_it_cannot_split_exactly():
    """Each weight is split into a high and a low 16-bit word; a weight whose high word would
    not fit (never one of PIL's, whose weights are below 2^23) is declined, not miscomputed."""
    src = np.full((4, 6, 3), 9, np.uint8)
    first, count = np.zeros(2, np.int64), np.full(2, 2, np.int64)
    huge = np.full((2, 2), 1 << 28, np.int32)
    out = np.full((4, 2, 3), 7, np.uint8)
    assert not pixel_simd.resize_horizontal(src, 0, 4, first, count, huge, out)
    assert (out == 7).all()
    out = np.full((2, 6, 3), 7, np.uint8)
    assert not pixel_simd.resize_vertical(src, first, count, huge, out)
    assert (out == 7).all()
