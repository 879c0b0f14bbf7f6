"""The zero-copy view of a decoded image's pixels in PIL's memory: PIL's values, alive as long as
the view, None where PIL cannot export, and used by the worker's pixel path where SIMD runs."""

from __future__ import annotations

import gc
import io

import numpy as np
import pytest
from PIL import Image

from energon_pack import pixels as P
from energon_pack.bench.pixel_bench import make_image_set
from energon_pack.pixels import pixel_simd
from energon_pack.pixels.pil_pixels import rgbx_view
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl import vision as V

#: Pillow 11.2+ exports its pixel memory through the Arrow C data interface; older ones (10.x) cannot
ARROW = hasattr(Image.Image, "__arrow_c_array__")
needs_arrow = pytest.mark.skipif(not ARROW, reason="this Pillow has no Arrow export (added in 11.2)")


@pytest.mark.skipif(ARROW, reason="this Pillow has the Arrow export")
def test_no_view_and_the_same_patches_on_a_pillow_without_arrow_export():
    """Pillow 10.x: the worker copies the pixels as before (no view) and patchifies them identically."""
    img = Image.new("RGB", (448, 448), (10, 200, 30))
    assert rgbx_view(img) is None
    pv, _ = V.patchify_image(img, get_preset("qwen2.5-vl"))
    assert pv.shape == (1024, 1176)


@needs_arrow
def test_the_view_holds_pils_pixels_after_the_image_is_gone():
    for im in make_image_set(6, seed=2):
        img = Image.open(io.BytesIO(im["data"])).convert("RGB")
        expected = np.asarray(img).copy()
        view = rgbx_view(img)
        assert view is not None and view.shape == expected.shape and view.strides[1:] == (4, 1)
        assert not view.flags.writeable
        del img
        gc.collect()
        scratch = [np.full(1 << 20, 0xAB, np.uint8) for _ in range(32)]  # reuse freed memory, if any was freed
        np.testing.assert_array_equal(view, expected)
        del scratch


@pytest.mark.parametrize(
    "img",
    [
        Image.new("L", (8, 8)),
        Image.new("RGBA", (8, 8)),
        Image.new("RGB", (0, 4)),
        Image.new("RGB", (2100, 2100)),
    ],  # 17.6 MB: rows in more than one block
    ids=["grey", "rgba", "empty", "over-one-block"],
)
def test_no_view_where_pil_cannot_export_one(img):
    assert rgbx_view(img) is None


@needs_arrow
@pytest.mark.skipif(not pixel_simd.available(), reason="the view is read by the SIMD kernels only")
def test_the_worker_reads_pils_memory_instead_of_copying():
    preset = get_preset("qwen2.5-vl")
    img = Image.new("RGB", (448, 448), (10, 200, 30))  # on the grid already: no resize
    hwc = P.resize(img, 448, 448, preset.resample, fast=True)
    assert hwc.strides[1] == 4  # PIL's 4-byte pixels, not a packed RGB copy
    pv, _ = V.patchify_image(img, preset)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(pixel_simd.PIXEL_SIMD_ENV, "off")
        assert P.resize(img, 448, 448, preset.resample, fast=True).strides[1] == 3
        np.testing.assert_array_equal(V.patchify_image(img, preset)[0], pv)
