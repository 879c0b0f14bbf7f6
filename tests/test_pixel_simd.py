"""The optional AVX-512 float32 layout gives the numba kernel's values bit for bit, and steps aside cleanly."""

from __future__ import annotations

import importlib.util
import io
import platform
import shutil

import numpy as np
import pytest
from PIL import Image

from energon_pack.qwen_vl import pixel_kernels as K
from energon_pack.qwen_vl import pixel_simd
from energon_pack.qwen_vl import vision as V
from energon_pack.qwen_vl.presets import get_preset

needs_simd = pytest.mark.skipif(not pixel_simd.available(), reason="AVX-512 VBMI layout not available here")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or shutil.which("gcc") is None,
                    reason="the extension is only built on x86-64 with a C compiler")
def test_the_extension_is_built_by_the_install():
    assert importlib.util.find_spec("energon_pack.qwen_vl._pixel_simd") is not None


def _numba_layout(img: np.ndarray, preset) -> np.ndarray:
    p, table = preset.patch_size, V._storage_table(preset)
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
        out = np.full_like(ref, 0x7F)
        assert pixel_simd.layout_image(img, p, m, tp, preset.image_mean, preset.image_std, out)
        if dtype == "float32":  # compare bit patterns: -0.0 and 0.0 told apart
            out, ref = out.view(np.uint32), ref.view(np.uint32)
        np.testing.assert_array_equal(out, ref)


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
        pixel_simd.layout_image(img, 14, 2, 2, preset.image_mean, preset.image_std, out)


def test_other_dtypes_and_the_off_switch_leave_the_numba_kernel_in_charge(monkeypatch):
    preset = get_preset("qwen2.5-vl")
    img = np.zeros((28, 28, 3), np.uint8)
    as_f64 = np.empty((4, preset.patch_dim), np.float64)  # not a storage dtype
    assert not pixel_simd.layout_image(img, 14, 2, 2, preset.image_mean, preset.image_std, as_f64)
    monkeypatch.setenv(pixel_simd.PIXEL_SIMD_ENV, "off")
    out = np.empty((4, preset.patch_dim), np.float32)
    assert not pixel_simd.layout_image(img, 14, 2, 2, preset.image_mean, preset.image_std, out)
