"""Vision presets per Qwen-VL model version (the processors' and hub configs' values, cited below).

Qwen2-VL values are the class defaults of transformers' ``Qwen2VLImageProcessor`` /
``Qwen2VLVideoProcessor``; Qwen2.5-VL uses the same image processor with ``max_pixels``
12845056 (hub preprocessor_config) and ``tokens_per_second`` 2 for video M-RoPE; Qwen3-VL uses
patch 16, mean/std 0.5 and the ``Qwen3VLVideoProcessor`` defaults. Every field can be overridden
through :func:`get_preset`. ``default_system_prompt`` is the official Instruct template's
(:mod:`energon_pack.chat.templates`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..chat.templates import template_system_prompt
from ..errors import ConfigError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)

#: ``pixel_values`` dtypes through the loader: float32 (exact, HF's values), bfloat16 (the float32
#: values rounded to nearest even, half the bytes), uint8 (resized RGB in patch order, a quarter
#: of the bytes; normalise on the GPU with :func:`energon_pack.qwen_vl.normalize_pixels`)
PIXEL_DTYPES = ("float32", "bfloat16", "uint8")
RESAMPLE_MODES = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
ROPE_STYLES = ("qwen2", "qwen2.5", "qwen3")


@dataclass(frozen=True)
class VisionPreset:
    """Everything that decides pixel values, grids and visual token counts for one model version."""

    name: str
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    resample: str  # one of RESAMPLE_MODES (PIL filter name)
    video_min_pixels: int
    video_max_pixels: int
    video_fps: float  # frame rate assumed for a video given as frames without its own fps
    tokens_per_second: float  # Qwen2.5-VL temporal M-RoPE scale (t index = t * sec_per_grid * tps)
    rope_style: str  # "qwen2" | "qwen2.5" | "qwen3"
    default_system_prompt: str | None = None  # what the official Instruct template inserts without a system turn
    pixel_dtype: str = "float32"  # one of PIXEL_DTYPES: dtype of pixel_values / pixel_values_videos
    jpeg_draft: bool = False  # decode large JPEGs at 1/2..1/8 scale (PIL draft) when the target allows; not bit-exact

    @property
    def factor(self) -> int:
        """Side multiple of a resized image (patch_size x merge_size)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Width of one pixel_values row: C * temporal_patch_size * patch_size^2."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    def validate(self) -> VisionPreset:
        for knob in (
            "patch_size",
            "merge_size",
            "temporal_patch_size",
            "min_pixels",
            "max_pixels",
            "video_min_pixels",
            "video_max_pixels",
        ):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(
                    knob, f"must be a positive int, got {value!r}", f"set {knob} to e.g. the preset default"
                )
        if self.min_pixels > self.max_pixels:
            raise ConfigError(
                "min_pixels", f"{self.min_pixels} > max_pixels {self.max_pixels}", "use min_pixels <= max_pixels"
            )
        if self.video_min_pixels > self.video_max_pixels:
            raise ConfigError(
                "video_min_pixels",
                f"{self.video_min_pixels} > video_max_pixels {self.video_max_pixels}",
                "use video_min_pixels <= video_max_pixels",
            )
        if self.max_pixels < self.factor**2:
            raise ConfigError(
                "max_pixels",
                f"{self.max_pixels} is below one merged patch ({self.factor}^2)",
                f"use max_pixels >= {self.factor**2}",
            )
        for knob in ("image_mean", "image_std"):
            value = getattr(self, knob)
            if len(value) != 3 or not all(isinstance(v, (int, float)) for v in value):
                raise ConfigError(knob, f"must be 3 floats (R, G, B), got {value!r}", "pass a 3-tuple")
        if any(v <= 0 for v in self.image_std):
            raise ConfigError("image_std", f"must be > 0, got {self.image_std}", "pass positive stds")
        if self.resample not in RESAMPLE_MODES:
            raise ConfigError("resample", f"unknown mode {self.resample!r}", f"use one of {RESAMPLE_MODES}")
        if self.rope_style not in ROPE_STYLES:
            raise ConfigError("rope_style", f"unknown style {self.rope_style!r}", f"use one of {ROPE_STYLES}")
        if not self.video_fps > 0:
            raise ConfigError(
                "video_fps", f"must be > 0, got {self.video_fps!r}", "pass the frame rate of sampled frames"
            )
        if self.default_system_prompt is not None and not isinstance(self.default_system_prompt, str):
            raise ConfigError(
                "default_system_prompt",
                f"must be a string or None, got {self.default_system_prompt!r}",
                "pass the template's system prompt text, or None",
            )
        if self.pixel_dtype not in PIXEL_DTYPES:
            raise ConfigError(
                "pixel_dtype",
                f"unknown pixel dtype {self.pixel_dtype!r}",
                f"use one of {PIXEL_DTYPES} (uint8: normalise on the GPU with normalize_pixels)",
            )
        if not isinstance(self.jpeg_draft, bool):
            raise ConfigError(
                "jpeg_draft",
                f"must be True or False, got {self.jpeg_draft!r}",
                "jpeg_draft=True decodes large JPEGs at reduced size (opt-in)",
            )
        if not self.tokens_per_second > 0:
            raise ConfigError("tokens_per_second", f"must be > 0, got {self.tokens_per_second!r}", "use 2 (Qwen2.5-VL)")
        return self


#: the built-in vision presets by name: Qwen2-VL, Qwen2.5-VL and Qwen3-VL as their released processors configure them
PRESETS: dict[str, VisionPreset] = {
    "qwen2-vl": VisionPreset(
        name="qwen2-vl",
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        resample="bicubic",
        video_min_pixels=128 * 28 * 28,
        video_max_pixels=28 * 28 * 768,
        video_fps=2.0,
        tokens_per_second=1.0,
        rope_style="qwen2",
        default_system_prompt=template_system_prompt("qwen2-vl"),
    ),
    "qwen2.5-vl": VisionPreset(
        name="qwen2.5-vl",
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=3136,
        max_pixels=12845056,
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        resample="bicubic",
        video_min_pixels=128 * 28 * 28,
        video_max_pixels=28 * 28 * 768,
        video_fps=2.0,
        tokens_per_second=2.0,
        rope_style="qwen2.5",
        default_system_prompt=template_system_prompt("qwen2.5-vl"),
    ),
    "qwen3-vl": VisionPreset(
        name="qwen3-vl",
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=65536,
        max_pixels=16777216,
        image_mean=HALF,
        image_std=HALF,
        resample="bicubic",
        video_min_pixels=128 * 32 * 32,
        video_max_pixels=32 * 32 * 768,
        video_fps=2.0,
        tokens_per_second=1.0,
        rope_style="qwen3",
        default_system_prompt=template_system_prompt("qwen3-vl"),
    ),
}


def get_preset(name: str | VisionPreset, **overrides) -> VisionPreset:
    """The preset ``name`` (or a given preset) with ``overrides`` applied, validated.

    Args:
        name: ``"qwen2-vl"``, ``"qwen2.5-vl"`` or ``"qwen3-vl"`` (:data:`PRESETS`), or a :class:`VisionPreset`
            to start from.
        overrides: :class:`VisionPreset` fields to change, e.g. ``max_pixels=1024 * 28 * 28`` (fewer visual
            tokens per image), ``pixel_dtype="uint8"`` (a quarter of the bytes through the loader) or
            ``jpeg_draft=True``; an unknown field is a ConfigError.
    """
    if isinstance(name, VisionPreset):
        base = name
    else:
        if name not in PRESETS:
            raise ConfigError("preset", f"unknown preset {name!r}", f"use one of {sorted(PRESETS)}")
        base = PRESETS[name]
    fields = {f.name for f in dataclasses.fields(VisionPreset)}
    for key in overrides:
        if key not in fields:
            raise ConfigError(key, "is not a vision preset field", f"use one of {sorted(fields)}")
    for key in ("image_mean", "image_std"):
        if key in overrides and overrides[key] is not None:
            overrides[key] = tuple(float(v) for v in overrides[key])
    return dataclasses.replace(base, **overrides).validate()
