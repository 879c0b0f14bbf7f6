"""An image's decode path holds its decode and a few strips of rows, not several full-size copies: transparency is
composited on white a strip at a time, and an image too large for a zero-copy view is resized a strip at a time
(same bytes as PIL and as transformers' ``convert_to_rgb``)."""

import numpy as np
import pytest
from PIL import Image

from _hostile_media import flat_jpeg, peak_growth_mb, transparent_png
from energon_pack import pixels as P
from energon_pack.pixels import backend
from energon_pack.pixels import decode as pixel_decode
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.vision import pending_image

PRESET = get_preset("qwen2.5-vl")


def _convert_to_rgb(img: Image.Image) -> Image.Image:
    """transformers' ``convert_to_rgb`` (the whole image at once)."""
    rgba = img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _with_transparency(mode: str, rgba: np.ndarray) -> Image.Image:
    image = Image.fromarray(rgba, "RGBA")
    if mode in ("RGBA", "LA"):
        return image.convert(mode)
    if mode == "PA":
        return Image.merge("PA", (image.convert("RGB").quantize(64), image.getchannel("A")))
    base = image.convert("RGB").quantize(64) if mode == "P" else image.convert(mode)
    base.info["transparency"] = {"P": 5, "L": 90, "RGB": (10, 20, 30)}[mode]
    return base


@pytest.mark.parametrize("mode", ["RGBA", "LA", "PA", "P", "L", "RGB"])
def test_transparency_composited_a_strip_at_a_time_equals_convert_to_rgb(mode, monkeypatch):
    """37x53 images of every alpha-bearing mode, in strips of 5 rows (the last one 3): byte-equal to the
    whole-image composite."""
    rng = np.random.default_rng(7)
    rgba = rng.integers(0, 256, size=(53, 37, 4), dtype=np.uint8)
    rgba[::4, :, 3] = 0  # fully transparent rows and opaque ones next to partial alpha
    rgba[1::4, :, 3] = 255
    rgba[:, :4, :3] = (10, 20, 30)  # the RGB transparency colour
    image = _with_transparency(mode, rgba)
    expected = _convert_to_rgb(image)
    monkeypatch.setattr(pixel_decode, "STRIP_PIXELS", 37 * 5)
    got = P.to_rgb_image(image)
    assert got.mode == "RGB" and got.size == (37, 53)
    assert got.tobytes() == expected.tobytes()
    assert len(np.unique(np.asarray(expected).reshape(-1, 3), axis=0)) > 20  # not trivially flat


@pytest.mark.parametrize("resample", ["bicubic", "bilinear"])
def test_resizing_a_strip_at_a_time_equals_pil(resample, monkeypatch):
    """Down- and upscaling, one axis only, both of Pillow 13's pass orders: the strip path gives PIL's bytes."""
    if backend.compiled(resample) is None:
        pytest.skip("no compiled resize here")
    strips = []
    monkeypatch.setattr(backend, "rgbx_view", lambda img: None)  # as for an image over one Pillow block
    monkeypatch.setattr(backend, "STRIP_PIXELS", 400)
    real_rows = backend.rgb_rows
    monkeypatch.setattr(backend, "rgb_rows", lambda img, y0, y1: strips.append((y0, y1)) or real_rows(img, y0, y1))
    rng = np.random.default_rng(3)
    cases = [
        (97, 61, 30, 20),
        (61, 47, 19, 47),
        (64, 48, 20, 60),
        (40, 90, 56, 40),
        (45, 45, 97, 13),
        (300, 40, 12, 40),
    ]
    for h, w, oh, ow in cases:
        src = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        src[: h // 2] = src[: h // 2, :1]
        image = Image.fromarray(src)
        strips.clear()
        got = P.resize(image, oh, ow, resample, fast=True)
        expected = np.asarray(image.resize((ow, oh), resample=backend.RESAMPLE[resample]))
        np.testing.assert_array_equal(got, expected, err_msg=f"{(h, w)} -> {(oh, ow)}")
        assert len(strips) > 1 and max(y1 - y0 for y0, y1 in strips) < h


def test_an_image_over_one_block_is_resized_in_strips_to_pils_bytes():
    """A real 2100x2100 photo-like image (17.6 MB: more than one Pillow block, so no zero-copy view)."""
    if backend.compiled("bicubic") is None:
        pytest.skip("no compiled resize here")
    rng = np.random.default_rng(5)
    src = np.repeat(np.repeat(rng.integers(0, 256, size=(300, 300, 3), dtype=np.uint8), 7, 0), 7, 1)
    image = Image.fromarray(src)
    got = P.resize(image, 1008, 980, "bicubic", fast=True)
    np.testing.assert_array_equal(got, np.asarray(image.resize((980, 1008), resample=Image.Resampling.BICUBIC)))


def _encode(path) -> list:
    _, grid = pending_image(path.read_bytes(), PRESET)
    return grid.tolist()


@pytest.mark.parametrize(
    "kind,build,bound_mb",
    [
        # decoded RGB(X) 192 MB + the 38 MB resized output; was +459 MB (a full-size RGB array and a full-height pass)
        ("jpeg", lambda: flat_jpeg(8000, 6000, components=3), 350),
        # decoded RGBA 192 MB + its RGB 192 MB; was +917 MB (four full-size RGBA copies more)
        ("png_rgba", lambda: transparent_png(8000, 6000), 600),
    ],
)
def test_a_48_megapixel_image_costs_its_decode_and_strips(kind, build, bound_mb, tmp_path):
    """The encoder's image path on an 8000x6000 image, in a forked child: the peak grows by the decode (and the
    RGB of a transparent image) and a few strips (measured +264 / +430 MB), no longer by full-size copies."""
    P.warm(PRESET)
    path = tmp_path / kind
    path.write_bytes(build())
    grid, grown_mb = peak_growth_mb(_encode, path)
    assert grid == [[1, 220, 294]]
    assert grown_mb < bound_mb
