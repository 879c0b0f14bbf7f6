"""Vision presets, resize/count rules and pixel parity with transformers' Qwen2VLImageProcessor."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from PIL import Image

from energon_pack import pixels as PX
from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.qwen_vl import presets as P
from energon_pack.qwen_vl import vision as V

transformers = pytest.importorskip("transformers")


def _hf_processor(preset: P.VisionPreset):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import Qwen2VLImageProcessor

        return Qwen2VLImageProcessor(
            patch_size=preset.patch_size,
            merge_size=preset.merge_size,
            temporal_patch_size=preset.temporal_patch_size,
            min_pixels=preset.min_pixels,
            max_pixels=preset.max_pixels,
            image_mean=list(preset.image_mean),
            image_std=list(preset.image_std),
        )


def _image(width: int, height: int, mode: str, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    # smooth-ish content plus noise so resize filters matter
    yy, xx = np.mgrid[0:height, 0:width]
    rgb[..., 0] = ((xx * 7 + yy * 3) % 256).astype(np.uint8)
    img = Image.fromarray(rgb, "RGB")
    if mode == "L":
        return img.convert("L")
    if mode == "RGBA":
        alpha = rng.integers(0, 256, size=(height, width), dtype=np.uint8)
        rgba = img.convert("RGBA")
        rgba.putalpha(Image.fromarray(alpha, "L"))
        return rgba
    if mode == "P":
        return img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    if mode == "LA":
        return img.convert("LA")
    return img


CASES = [
    (10, 10, "RGB"),  # tiny: upscaled to min_pixels
    (300, 500, "RGB"),
    (56, 56, "RGB"),
    (1000, 28, "RGB"),  # tall-thin
    (1999, 37, "L"),
    (640, 480, "RGBA"),
    (123, 457, "P"),
    (2600, 1900, "RGB"),  # huge: downscaled to max_pixels (qwen2-vl)
    (33, 4000, "LA"),
    (29, 29, "RGB"),
]


@pytest.mark.parametrize("preset_name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_hf_image_parity(preset_name):
    preset = P.get_preset(preset_name)
    if preset_name != "qwen2-vl":  # keep the huge-image cost bounded for the bigger budgets
        preset = P.get_preset(preset_name, max_pixels=1_600_000)
    proc = _hf_processor(preset)
    for i, (w, h, mode) in enumerate(CASES):
        img = _image(w, h, mode, seed=i)
        ours_pv, ours_grid = V.patchify_image(img, preset)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = proc(images=[img], return_tensors="np")
        np.testing.assert_array_equal(ours_grid, ref["image_grid_thw"], err_msg=f"{w}x{h} {mode}")
        assert ours_pv.dtype == np.float32 and ours_pv.shape == ref["pixel_values"].shape
        np.testing.assert_allclose(ours_pv, ref["pixel_values"], atol=1e-5, rtol=1e-5, err_msg=f"{w}x{h} {mode}")
        # count from the size alone (no pixels) agrees
        t, gh, gw = ref["image_grid_thw"][0].tolist()
        assert V.visual_token_count(h, w, preset) == t * gh * gw // preset.merge_size**2


def test_hf_qwen2vl_class_defaults_match_preset():
    preset = P.get_preset("qwen2-vl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import Qwen2VLImageProcessor

        proc = Qwen2VLImageProcessor()
    img = _image(500, 300, "RGB", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = proc(images=[img], return_tensors="np")
    pv, grid = V.patchify_image(img, preset)
    assert grid.tolist() == [[1, 22, 36]] == ref["image_grid_thw"].tolist()
    np.testing.assert_allclose(pv, ref["pixel_values"], atol=1e-5)
    assert V.visual_token_count(300, 500, preset) == 198


def test_environment_measurements():
    # shared/reference/environment.md 3b measured values
    q25, q3 = P.get_preset("qwen2.5-vl"), P.get_preset("qwen3-vl")
    assert V.image_grid_thw(300, 500, q25) == (1, 22, 36)
    assert V.image_grid_thw(56, 56, q25) == (1, 4, 4)
    assert V.image_grid_thw(300, 500, q3) == (1, 18, 32)
    assert V.image_grid_thw(56, 56, q3) == (1, 16, 16)
    assert V.visual_token_count(56, 56, q3) == 64


def test_smart_resize_matches_hf_randomised():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_video_resize

    rng = np.random.default_rng(0)
    for _ in range(2000):
        h, w = (int(x) for x in rng.integers(1, 5000, size=2))
        if max(h, w) / min(h, w) > 200:
            continue
        factor = int(rng.choice([28, 32]))
        lo = int(rng.choice([3136, 65536, 200704]))
        hi = int(rng.choice([1003520, 12845056, 16777216]))
        assert V.smart_resize(h, w, factor, lo, hi) == hf_smart_resize(h, w, factor, lo, hi)
        n = int(rng.integers(2, 40))
        try:
            ref = hf_video_resize(n, h, w, 2, factor, 131072, 786432)
        except ValueError:
            with pytest.raises(ValueError):
                V.video_smart_resize(n, h, w, 2, factor, 131072, 786432)
            continue
        assert V.video_smart_resize(n, h, w, 2, factor, 131072, 786432) == ref


def test_video_counts_match_hf_count_helpers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_video_resize

    q2, q3 = P.get_preset("qwen2.5-vl"), P.get_preset("qwen3-vl")
    for n, h, w in [(2, 100, 200), (5, 480, 640), (16, 1080, 1920), (3, 20, 30)]:
        rh, rw = hf_smart_resize(h, w, 28, q2.video_min_pixels, q2.video_max_pixels)
        assert V.video_grid_thw(n, h, w, q2) == ((n + 1) // 2, rh // 14, rw // 14)
        rh, rw = hf_video_resize(n, h, w, 2, 32, q3.video_min_pixels, q3.video_max_pixels)
        assert V.video_grid_thw(n, h, w, q3) == ((n + 1) // 2, rh // 16, rw // 16)
        assert V.video_token_count(n, h, w, q3) == ((n + 1) // 2) * (rh // 16) * (rw // 16) // 4


def test_patchify_video_pads_last_frame_and_matches_images():
    preset = P.get_preset("qwen2-vl", video_min_pixels=3136, video_max_pixels=200 * 200)
    frames = [_image(90, 60, "RGB", s) for s in range(3)]
    pv, grid, spg = V.patchify_video(frames, preset, fps=4.0)
    t, gh, gw = grid[0].tolist()
    assert t == 2 and (gh, gw) == V.video_grid_thw(3, 60, 90, preset)[1:]
    assert spg == pytest.approx(0.5)
    assert pv.shape == (t * gh * gw, preset.patch_dim)
    # a 1-frame "video" of a repeated image equals the image patchify when both use the same resize
    same = P.get_preset("qwen2-vl", video_min_pixels=preset.min_pixels, video_max_pixels=preset.max_pixels)
    img = frames[0]
    pv_img, grid_img = V.patchify_image(img, same)
    pv_vid, grid_vid, _ = V.patchify_video([img, img], same)
    np.testing.assert_array_equal(grid_img, grid_vid)
    np.testing.assert_allclose(pv_img, pv_vid)
    # last-frame repetition: frames [a, b, c] == [a, b, c, c]
    pv4, grid4, _ = V.patchify_video(frames + [frames[-1]], preset)
    np.testing.assert_array_equal(grid, grid4)
    np.testing.assert_allclose(pv, pv4)


def test_image_size_from_bytes_header_only():
    buf = io.BytesIO()
    _image(321, 123, "RGB", 0).save(buf, format="PNG")
    data = buf.getvalue()
    assert PX.image_size_from_bytes(data) == (321, 123)
    # truncated body: the header still gives the size without decoding
    assert PX.image_size_from_bytes(data[:200]) == (321, 123)
    with pytest.raises(SampleSkipped) as err:
        PX.image_size_from_bytes(b"not an image at all")
    assert err.value.reason == "corrupt_image"
    with pytest.raises(SampleSkipped) as err:
        V.patchify_image(data[:200], P.get_preset("qwen2-vl"))
    assert err.value.reason == "corrupt_image"


def test_bad_images_skip():
    preset = P.get_preset("qwen2-vl")
    with pytest.raises(SampleSkipped) as err:
        V.visual_token_count(28, 2000 * 3, preset)
    assert err.value.reason == "extreme_aspect_ratio"
    with pytest.raises(SampleSkipped) as err:
        V.visual_token_count(0, 10, preset)
    assert err.value.reason == "corrupt_image"
    img16 = Image.new("I;16", (40, 40))
    with pytest.raises(SampleSkipped) as err:
        V.patchify_image(img16, preset)
    assert err.value.reason == "unsupported_image_mode"
    with pytest.raises(SampleSkipped) as err:
        V.video_token_count(1, 100, 100, P.get_preset("qwen3-vl"))
    assert err.value.reason == "video_too_few_frames"


def test_presets_and_validation():
    assert set(P.PRESETS) == {"qwen2-vl", "qwen2.5-vl", "qwen3-vl"}
    q3 = P.get_preset("qwen3-vl")
    assert (q3.patch_size, q3.factor, q3.image_mean, q3.patch_dim) == (16, 32, (0.5, 0.5, 0.5), 1536)
    q2 = P.get_preset("qwen2-vl", max_pixels=200704, image_mean=[0.1, 0.2, 0.3])
    assert q2.max_pixels == 200704 and q2.image_mean == (0.1, 0.2, 0.3)
    with pytest.raises(AttributeError):
        q2.patch_size = 16  # frozen
    for kwargs, knob in [
        ({"patch_size": 0}, "patch_size"),
        ({"min_pixels": 10**9}, "min_pixels"),
        ({"resample": "cubic"}, "resample"),
        ({"rope_style": "qwen4"}, "rope_style"),
        ({"bogus": 1}, "bogus"),
        ({"image_std": (1, 0, 1)}, "image_std"),
        ({"max_pixels": 100, "min_pixels": 10}, "max_pixels"),
    ]:
        with pytest.raises(ConfigError) as err:
            P.get_preset("qwen2-vl", **kwargs)
        assert err.value.knob == knob
        assert isinstance(err.value, ValueError)
    with pytest.raises(ConfigError) as err:
        P.get_preset("qwen9")
    assert err.value.knob == "preset"
