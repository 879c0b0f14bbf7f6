"""Hugging Face transformers: run our packed THD rows through Qwen2-VL / Qwen2.5-VL / Qwen3-VL.

Three pieces, for transformers :data:`SUPPORTED_TRANSFORMERS` (``models/qwen2_vl``, ``qwen2_5_vl``,
``qwen3_vl``; CI runs the packed-vs-per-sample parity tests on 4.57.6, 5.12.1, 5.17.0 and 5.24.0):

* :func:`hf_forward_kwargs`: one packed batch (micro-batch size 1) -> the keyword arguments of
  the models' ``forward``. Positions are ``(4, 1, T)``: row 0 holds the text positions that
  restart at 0 in every segment (HF's text model reads packing from that row), rows 1-3 our
  M-RoPE. No attention mask, ``use_cache=False``, and the flash varlen kwargs
  ``cu_seq_lens_q/_k`` + ``max_length_q/_k`` from the *padded* cu_seqlens (each segment's
  physical span; an alignment gap trails its segment and is loss-masked).
* :func:`register_varlen_attention` / :func:`use_varlen_attention`: an attention function for
  HF's ``AttentionInterface`` that attends inside each cu_seqlens segment: PyTorch's
  ``varlen_attn`` (flash) on CUDA in fp16/bf16, SDPA with a block-diagonal mask otherwise.
  Its name contains "flash", so the vision towers hand it their own (window/full) cu_seqlens
  instead of looping over images.
* :func:`packed_loss` / :func:`normalize_by_global_tokens`: the summed cross entropy on our
  pre-shifted labels, and its normalisation by the supervised tokens of all data-parallel ranks.

Where transformers releases differ, the route is chosen by what the installed release has, never
by its version string:

* Vision towers and the text model's varlen kwargs: the VL models hand their ``**kwargs`` to the
  vision towers on some releases (5.12.1 and 5.17.0 among the tested: ``get_image_features(...,
  **kwargs)`` without 5.24's filter), whose attention then gets ``cu_seq_lens_q`` twice (a TypeError). Every tower of a
  model we are given gets a forward pre-hook that drops the four text varlen kwargs
  (:func:`guard_vision_towers`; a no-op where the release drops or never forwards them).
* Vision attention: where the towers call ``is_flash_attention_requested`` (5.x) any "flash" name
  gets their cu_seqlens in one call; where they test ``== "flash_attention_2"`` (4.57) they call
  the attention function once per image (or window) without cu_seqlens, which our function takes
  as one segment: the same numbers, more calls.
* Precomputed vision tensors (:func:`vision_precomputed_kwargs`): only the keys the installed
  tower reads (``accepts_precomputed_kwargs`` and the ``transformers.vision_utils`` helpers its
  modeling module imports); none on releases without them.
* Video M-RoPE (:func:`mrope_conventions`): the model's own ``get_rope_index`` is run once on a
  synthetic video; where it places positions differently from the task encoder (4.57: the text
  after a video resumes at the block's largest position + 1; 4.57-5.17 Qwen2.5-VL truncates
  ``second_per_grid_t`` to an integer), the segments with videos get the release's positions.

Static packs (``static_visual=True``, :mod:`energon_pack.qwen_vl.static_visual`): ``hf_forward_kwargs`` passes the
padded vision rows and fixed-length precomputed vision tensors (:func:`static_vision_kwargs`) under one kwarg that a
forward pre-hook (:func:`use_static_visual`) turns into ``inputs_embeds``: every tensor the model sees then has one
shape, so ``torch.compile`` compiles once and CUDA graphs can capture it.

Batches from another model version or vision geometry (:func:`check_vision_preset`): the task encoder's
batches record their preset (``vision_preset``), and with ``model=`` a record that does not fit the
model's config (version, patch sizes, merge size), or pixel rows of another width (also in hand-built
batches), get a :class:`ConfigError` before the forward instead of wrong video positions or an error
from inside the vision tower.

Older releases than :data:`SUPPORTED_TRANSFORMERS` get a :class:`ConfigError` from our entry
points; transformers is imported inside functions only, so importing this module costs nothing.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from energon_pack.errors import ConfigError
from energon_pack.qwen_vl.static_visual import (STATIC_FRAMES_KEY, STATIC_GRID_KEY, STATIC_MAX_FRAME_KEY,
                                                STATIC_PIXELS_KEY, full_segment_count, pad_segments,
                                                static_segment_count)
from energon_pack.thd import IGNORE_INDEX, VISION_PRESET_KEY, vision_preset_record

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "VARLEN_ATTENTION",
    "check_transformers_version",
    "check_vision_preset",
    "global_token_count",
    "guard_vision_towers",
    "hf_forward_kwargs",
    "mm_token_type_ids",
    "mrope_conventions",
    "normalize_by_global_tokens",
    "packed_forward",
    "packed_loss",
    "register_varlen_attention",
    "static_vision_kwargs",
    "use_static_visual",
    "use_varlen_attention",
    "varlen_attention_forward",
    "vision_precompute_keys",
    "vision_precomputed_kwargs",
]

#: Name under which :func:`varlen_attention_forward` is registered. It must contain "flash":
#: HF's Qwen-VL vision attention (transformers 5.x) checks ``"flash" in config._attn_implementation``
#: (``is_flash_attention_requested``) and only then passes ``cu_seq_lens_q/_k`` and
#: ``is_causal=False`` to the attention function (otherwise it loops over images). 4.57's checks
#: ``== "flash_attention_2"``, so there the towers loop over images (windows) for this name too.
VARLEN_ATTENTION = "energon_pack_flash_varlen"

#: The transformers releases this module supports: 4.57 (the first with Qwen3-VL) through the newest
#: one tested. pyproject's ``hf`` and ``test`` extras declare the same range.
SUPPORTED_TRANSFORMERS = ">=4.57,<5.25"
_OLDEST_TRANSFORMERS = "4.57"
_NEWEST_TESTED_TRANSFORMERS = "5.24"

_VL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
#: What the text model's flash attention reads; never meant for a vision tower.
_TEXT_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_VISUAL_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
_CACHE_WHY = (
    "with a cache HF's mask builder skips packed-sequence detection (it reads the restarting text "
    "positions only when attention_mask and cache are both None), so under sdpa/eager every token "
    "attends across segment boundaries; a training forward never needs a cache"
)


# --------------------------------------------------------------------------------- release checks
_VERSION_CHECKED: str | None = None


def check_transformers_version() -> str | None:
    """The installed transformers version, refused with a :class:`ConfigError` when older than
    :data:`SUPPORTED_TRANSFORMERS` (their Qwen-VL code lacks what the packed forward needs; Qwen3-VL
    does not exist before 4.57). A release newer than the newest tested one gets a warning, once.
    ``None`` where transformers is not installed. Read from the package metadata: no import."""
    global _VERSION_CHECKED
    if _VERSION_CHECKED is not None:
        return _VERSION_CHECKED
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("transformers")
    except PackageNotFoundError:
        return None
    from packaging.version import Version

    parsed = Version(installed)
    if parsed.release[:2] < Version(_OLDEST_TRANSFORMERS).release[:2]:
        raise ConfigError("transformers", f"version {installed} is installed; energon_pack.integrations.hf supports "
                          f"transformers{SUPPORTED_TRANSFORMERS}",
                          f"pip install 'transformers{SUPPORTED_TRANSFORMERS}' (e.g. energon-pack[hf])")
    if parsed.release[:2] > Version(_NEWEST_TESTED_TRANSFORMERS).release[:2]:
        warnings.warn(f"transformers {installed} is newer than the newest release energon_pack.integrations.hf is "
                      f"tested with (transformers{SUPPORTED_TRANSFORMERS}); the packed-vs-per-sample parity tests "
                      "(tests/test_integration_hf.py) tell whether it works", stacklevel=3)
    _VERSION_CHECKED = installed
    return installed


def _drop_text_varlen_kwargs(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    if not any(key in kwargs for key in _TEXT_VARLEN_KWARGS):
        return None
    return args, {k: v for k, v in kwargs.items() if k not in _TEXT_VARLEN_KWARGS}


def guard_vision_towers(model: Any) -> None:
    """Make every vision tower (a ``visual`` submodule) of ``model`` drop the text model's varlen
    kwargs (``cu_seq_lens_q/_k``, ``max_length_q/_k``) from its inputs. Idempotent and cheap.

    Some transformers releases hand the VL forward's ``**kwargs`` on to the towers, whose vision
    attention passes its own ``cu_seq_lens_q`` plus those kwargs to the attention function: a
    TypeError under any flash implementation. Where the release drops them itself or never forwards
    them, the hook finds nothing to drop. :func:`packed_forward`, :func:`use_varlen_attention` and
    :func:`hf_forward_kwargs` (given ``model``) call it; a caller of ``model(**hf_forward_kwargs(batch))``
    without ``model=`` under HF's own flash attention on such a release calls it once itself.
    """
    model = getattr(model, "module", model)  # DDP / FSDP wrappers
    if not isinstance(model, torch.nn.Module) or getattr(model, "_energon_pack_towers_guarded", False):
        return
    for module in model.modules():
        tower = getattr(module, "visual", None)
        if isinstance(tower, torch.nn.Module) and not getattr(tower, "_energon_pack_guarded", False):
            tower.register_forward_pre_hook(_drop_text_varlen_kwargs, with_kwargs=True)
            tower._energon_pack_guarded = True
    model._energon_pack_towers_guarded = True


# --------------------------------------------------------------------------------- forward kwargs
def _config_of(model: Any) -> Any:
    return getattr(model, "config", model)


def _is_vision_language(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def _forward_params(model: Any) -> set[str] | None:
    forward = getattr(model, "forward", None)
    if forward is None:
        return None
    return set(inspect.signature(forward).parameters)


def mm_token_type_ids(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """HF's token types (0 text, 1 image pad, 2 video pad) for ``input_ids``, from the model config.

    transformers 5.x needs them to compute M-RoPE itself (unpacked forward without
    ``position_ids``); packed forwards get our positions and do not need them.
    """
    config = _config_of(config)
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    types[input_ids == config.image_token_id] = 1
    types[input_ids == config.video_token_id] = 2
    return types


# --------------------------------------------------------------------------------- M-RoPE conventions
#: Our task encoder computes M-RoPE like transformers 5.24 (energon_pack.qwen_vl.mrope): the text
#: after a vision block resumes at the block's start + max(h, w) / merge ("spatial"), and a
#: Qwen2.5-VL video's temporal index is floor(t * second_per_grid_t * tokens_per_second). Older
#: releases differ for videos only: 4.57 resumes at the block's largest position + 1 ("max", the
#: original Qwen code), and 4.57-5.17 Qwen2.5-VL truncates second_per_grid_t to an integer first.
_BATCH_MROPE = ("spatial", False)
_PRESET_OF_MODEL_TYPE = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2.5-vl", "qwen3_vl": "qwen3-vl"}
_MROPE_CONVENTIONS: dict[str, tuple[str, bool]] = {}


def _preset_of_config(config: Any) -> Any:
    from energon_pack.qwen_vl.presets import get_preset

    vision = config.vision_config
    overrides: dict[str, Any] = {"merge_size": int(vision.spatial_merge_size)}
    if getattr(vision, "tokens_per_second", None) is not None:
        overrides["tokens_per_second"] = float(vision.tokens_per_second)
    return get_preset(_PRESET_OF_MODEL_TYPE[config.model_type], **overrides)


# --------------------------------------------------------------------------------- preset checks
_ROPE_STYLE_OF_MODEL_TYPE = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2.5", "qwen3_vl": "qwen3"}


def _model_geometry(config: Any) -> dict[str, Any]:
    """The preset record a batch for ``config`` must carry (name and tokens_per_second where they decide)."""
    vision = config.vision_config
    want = {"name": _PRESET_OF_MODEL_TYPE[config.model_type], "rope_style": _ROPE_STYLE_OF_MODEL_TYPE[config.model_type],
            "patch_size": int(vision.patch_size), "temporal_patch_size": int(vision.temporal_patch_size),
            "merge_size": int(vision.spatial_merge_size)}
    if want["rope_style"] == "qwen2.5" and getattr(vision, "tokens_per_second", None) is not None:
        want["tokens_per_second"] = float(vision.tokens_per_second)
    return want


def _describe(record: Mapping[str, Any]) -> str:
    tps = f", tokens_per_second {record['tokens_per_second']:g}" if record.get("rope_style") == "qwen2.5" else ""
    return (f"M-RoPE {record.get('rope_style')}{tps}, patch {record.get('patch_size')}, temporal patch "
            f"{record.get('temporal_patch_size')}, merge {record.get('merge_size')}")


def _check_record(record: Mapping[str, Any], config: Any, where: str) -> None:
    want = _model_geometry(config)
    if record.get("rope_style") != want["rope_style"]:
        raise ConfigError("preset", f"{where} preset {record.get('name')!r} ({_describe(record)}) is not the "
                          f"{config.model_type} model's ({want['name']!r}: {_describe(want)})",
                          f"build the task encoder with preset={want['name']!r}, the model's version")
    differ = [k for k in ("patch_size", "temporal_patch_size", "merge_size", "tokens_per_second")
              if k in want and float(record.get(k, -1)) != want[k]]
    if differ:
        sizes = ", ".join(f"{k}={want[k]!r}" for k in differ)
        raise ConfigError("preset", f"{where} preset {record.get('name')!r} ({_describe(record)}) does not match the "
                          f"{config.model_type} model's vision_config ({_describe({**record, **want})})",
                          f"build the task encoder with get_preset({record.get('name')!r}, {sizes}) to match it")


def check_vision_preset(batch: Mapping[str, Any], model: Any, *, preset: Any = None) -> None:
    """Refuse, with a :class:`ConfigError`, a batch that does not fit the Qwen-VL ``model`` (or its config).

    The batch's ``vision_preset`` record (the task encoder's batches) and the ``preset`` given for uint8
    normalisation must be the model's version (``config.model_type``) with its ``vision_config``'s patch,
    temporal patch and merge sizes (and Qwen2.5-VL's tokens_per_second). Every batch, also one built by
    hand: pixel rows must be ``in_channels * temporal_patch_size * patch_size**2`` wide, and the
    ``*_grid_thw`` rows must cover them with heights and widths divisible by the merge size.
    """
    config = _config_of(getattr(model, "module", model))
    if not _is_vision_language(config) or config.model_type not in _VL_MODEL_TYPES:
        return
    if batch.get(VISION_PRESET_KEY) is not None:
        _check_record(batch[VISION_PRESET_KEY], config, "the batch's")
    if preset is not None:
        _check_record(vision_preset_record(preset), config, "the preset= argument's")
    vision = config.vision_config
    patch, temporal, merge = int(vision.patch_size), int(vision.temporal_patch_size), int(vision.spatial_merge_size)
    channels = int(getattr(vision, "in_channels", 3))
    width = channels * temporal * patch * patch
    name = _PRESET_OF_MODEL_TYPE[config.model_type]
    for pixels_key, grid_key in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
        pixels, grid = batch.get(pixels_key), batch.get(grid_key)
        if pixels is None:
            continue
        if pixels.dim() != 2 or pixels.shape[-1] != width:
            raise ConfigError(pixels_key, f"rows of shape {tuple(pixels.shape)[1:]} do not fit the {config.model_type} "
                              f"vision tower, which takes rows of in_channels * temporal_patch_size * patch_size^2 = "
                              f"{channels} * {temporal} * {patch}^2 = {width}",
                              f"build the batch with preset={name!r}, or with patch sizes overridden to match the "
                              "model's vision_config")
        grid_rows = grid.detach().cpu().tolist() if grid is not None else []
        covered = sum(t * h * w for t, h, w in grid_rows)
        if covered != pixels.shape[0]:
            raise ConfigError(grid_key, f"covers {covered} patches but {pixels_key} "
                              f"has {pixels.shape[0]} rows", "pass the grids and pixel rows of the same samples, in "
                              "the same order")
        bad = [g for g in grid_rows if g[1] % merge or g[2] % merge]
        if bad:
            raise ConfigError(grid_key, f"grid {bad[0]} is not divisible by the model's spatial_merge_size {merge}",
                              f"build the batch with preset={name!r}, or with merge_size={merge}")


def _rope_index_owner(model: Any) -> Any:
    for candidate in (getattr(model, "model", None), model):
        if candidate is not None and callable(getattr(candidate, "get_rope_index", None)):
            return candidate
    return None


def mrope_conventions(model: Any) -> tuple[str, bool]:
    """How the installed transformers' ``get_rope_index`` of ``model`` places video M-RoPE positions:
    ``(resume, truncates_second_per_grid_t)``, resume ``"spatial"`` or ``"max"`` (see
    :func:`energon_pack.qwen_vl.mrope.mrope_position_ids`). Probed once per model type by running the
    model's own ``get_rope_index`` on one synthetic video (4 temporal steps, 1.5 s per step) and matching
    the result against the candidate conventions; the batch's own ``("spatial", False)`` for Qwen3-VL
    (its video blocks are single frames, where the conventions agree) and where nothing can be probed.
    """
    config = _config_of(model)
    model_type = getattr(config, "model_type", None)
    if model_type not in ("qwen2_vl", "qwen2_5_vl"):
        return _BATCH_MROPE
    if model_type in _MROPE_CONVENTIONS:
        return _MROPE_CONVENTIONS[model_type]
    owner = _rope_index_owner(model)
    if owner is None:
        return _BATCH_MROPE
    from energon_pack.qwen_vl.mrope import mrope_position_ids

    merge = int(config.vision_config.spatial_merge_size)
    steps, spg = 4, 1.5
    input_ids = torch.tensor([[config.vision_start_token_id] + [config.video_token_id] * steps
                              + [config.vision_end_token_id] * 2])
    grid = torch.tensor([[steps, merge, merge]])
    params = inspect.signature(owner.get_rope_index).parameters
    probe: dict[str, Any] = {"input_ids": input_ids, "image_grid_thw": None, "video_grid_thw": grid,
                             "second_per_grid_ts": torch.tensor([spg]), "attention_mask": None,
                             "mm_token_type_ids": mm_token_type_ids(input_ids, config)}
    with torch.no_grad():
        got = owner.get_rope_index(**{k: v for k, v in probe.items() if k in params})[0][:, 0].cpu()
    preset = _preset_of_config(config)
    found = None
    for resume in ("spatial", "max"):
        for truncate in (False, True):
            want = mrope_position_ids(input_ids[0], None, grid, [float(int(spg)) if truncate else spg], preset=preset,
                                      image_pad_id=config.image_token_id, video_pad_id=config.video_token_id,
                                      resume=resume)
            if found is None and torch.equal(got.to(want.dtype), want):
                found = (resume, truncate)
    if found is None:
        warnings.warn(f"the installed transformers places {model_type} video M-RoPE positions in a way energon_pack "
                      f"does not know (probe {got.tolist()}); packed rows keep the task encoder's positions, which "
                      "may differ from this release's per-sample forward for videos", stacklevel=3)
        found = _BATCH_MROPE
    _MROPE_CONVENTIONS[model_type] = found
    return found


def _mrope_for_release(batch: Mapping[str, Any], mrope: torch.Tensor, config: Any,
                       conventions: tuple[str, bool]) -> torch.Tensor:
    """The batch's (3, 1, T) M-RoPE with every segment that holds a video recomputed in ``conventions``."""
    from energon_pack.qwen_vl.mrope import mrope_position_ids

    resume, truncate = conventions
    preset = _preset_of_config(config)
    merge2 = preset.merge_size ** 2
    ids = batch["input_ids"][0].detach().cpu()
    starts = batch["cu_seqlens_q_padded"].detach().cpu().tolist()
    real = batch["cu_seqlens_q"].detach().cpu()
    lengths = (real[1:] - real[:-1]).tolist()
    grids = {kind: (batch.get(f"{kind}_grid_thw").detach().cpu().tolist() if batch.get(f"{kind}_grid_thw") is not None
                    else []) for kind in ("image", "video")}
    spg_all = batch.get("second_per_grid_ts")
    spg_all = spg_all.detach().cpu().tolist() if spg_all is not None else [1.0] * len(grids["video"])
    cursor = {"image": 0, "video": 0}
    out = mrope.detach().cpu().clone()

    def take(kind: str, tokens: int) -> list[list[int]]:
        taken = []
        while tokens > 0:
            grid = grids[kind][cursor[kind]]
            cursor[kind] += 1
            tokens -= grid[0] * grid[1] * grid[2] // merge2
            taken.append(grid)
        return taken

    for start, length in zip(starts, lengths):
        seg = ids[start: start + length]
        first_video = cursor["video"]
        images = take("image", int((seg == config.image_token_id).sum()))
        videos = take("video", int((seg == config.video_token_id).sum()))
        if not videos:
            continue
        spg = spg_all[first_video: cursor["video"]]
        spg = [float(int(x)) for x in spg] if truncate else spg
        out[:, 0, start: start + length] = mrope_position_ids(
            seg, images or None, videos, spg, preset=preset, image_pad_id=config.image_token_id,
            video_pad_id=config.video_token_id, resume=resume)
    return out.to(mrope.device)


def hf_forward_kwargs(
    batch: Mapping[str, Any],
    *,
    model: Any = None,
    device: torch.device | str | None = None,
    use_cache: bool = False,
    preset: Any = None,
) -> dict[str, Any]:
    """Keyword arguments for a HF Qwen-VL ``forward`` (ForConditionalGeneration or base model).

    uint8 pixels (``pixel_dtype="uint8"``) are normalised on ``device`` with the vision
    ``preset``'s mean/std (:func:`energon_pack.qwen_vl.normalize_pixels`); without ``preset``
    they are refused, since HF would feed raw 0..255 values to the vision tower.

    ``model`` (optional, a model or its config) enables the checks that need it: the batch's preset and
    pixel rows against the model's version and vision_config (:func:`check_vision_preset`); a text-only LLM
    gets ``(1, T)`` positions and must not receive visual tensors; ``second_per_grid_ts`` is
    passed only where ``forward`` takes it (Qwen2.5-VL). Without ``model`` a Qwen-VL model is
    assumed. ``labels`` are not passed: HF's loss shifts them again; use :func:`packed_loss`.
    """
    if use_cache:
        raise ConfigError("use_cache", f"must be False for packed rows: {_CACHE_WHY}", "leave use_cache=False")
    check_transformers_version()
    input_ids = batch["input_ids"]
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ConfigError(
            "micro_batch_size", f"input_ids must be one packed row [1, T], got {shape}",
            "use micro-batch size 1 (one THD row per step; the packer fills the row instead of MBS)",
        )
    total = input_ids.shape[1]
    position_ids = batch["position_ids"]
    if tuple(position_ids.shape) != (1, total):
        raise ConfigError("position_ids", f"expected shape (1, {total}), got {tuple(position_ids.shape)}",
                          "pass the batch as built by the task encoder (micro-batch size 1)")
    config = _config_of(model) if model is not None else None
    vision_language = config is None or _is_vision_language(config)
    if config is not None and _is_vision_language(config) and config.model_type not in _VL_MODEL_TYPES:
        raise ConfigError("model", f"model_type {config.model_type!r} is not a Qwen-VL model",
                          f"use one of {_VL_MODEL_TYPES} (or a text-only LLM)")
    if config is not None:
        check_vision_preset(batch, config, preset=preset)
    static = batch.get(STATIC_PIXELS_KEY) is not None
    if static and (config is None or not _is_vision_language(config) or not hasattr(model, "register_forward_pre_hook")):
        raise ConfigError("model", "a static-visual batch (visual_pixel_values) needs the Qwen-VL model that runs it",
                          "pass model= (hf_forward_kwargs / packed_forward)")
    has_visual = static or any(batch.get(k) is not None for k in _VISUAL_FORWARD_KEYS)
    mrope = batch.get("mrope_position_ids")

    if vision_language:
        if mrope is None:
            if has_visual:
                raise ConfigError(
                    "mrope_position_ids", "the batch carries images/videos but no M-RoPE positions",
                    "build it with QwenVLPackingTaskEncoder (it computes mrope_position_ids per segment)",
                )
            # Text only: HF's M-RoPE of a text sample is its text position on all three axes.
            mrope = position_ids.unsqueeze(0).expand(3, 1, total)
        if tuple(mrope.shape) != (3, 1, total):
            raise ConfigError("mrope_position_ids", f"expected shape (3, 1, {total}), got {tuple(mrope.shape)}",
                              "use micro-batch size 1 and the batch as built by the task encoder")
        if model is not None and batch.get("video_grid_thw") is not None:
            conventions = mrope_conventions(model)
            if conventions != _BATCH_MROPE:  # an older release: its own per-sample positions for videos
                mrope = _mrope_for_release(batch, mrope, config, conventions)
        positions = torch.cat([position_ids.unsqueeze(0), mrope], dim=0)  # (4, 1, T): text row first
    else:
        if has_visual:
            raise ConfigError("model", f"{config.model_type!r} is a text-only model but the batch has images/videos",
                              "use a Qwen-VL model, or pack text-only data")
        positions = position_ids

    cu_q, cu_k = batch["cu_seqlens_q_padded"], batch["cu_seqlens_kv_padded"]
    # The checks that read values run here, once per batch, on the loader's CPU tensors: the
    # attention function (called once per layer) then needs no device-to-host sync.
    cu_q_host, cu_k_host = cu_q.detach().cpu(), cu_k.detach().cpu()
    for name, cu in (("cu_seqlens_q_padded", cu_q_host), ("cu_seqlens_kv_padded", cu_k_host)):
        if cu.dim() != 1 or int(cu[0]) != 0 or int(cu[-1]) != total:
            raise ConfigError(name, f"must run from 0 to the row length {total}, got {cu.tolist()}",
                              "pass the batch as built by the task encoder (the last span absorbs the tail)")
    same = cu_q is cu_k or torch.equal(cu_q_host, cu_k_host)
    cu_q32 = cu_q.to(torch.int32)
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "position_ids": positions,
        "attention_mask": None,
        "use_cache": False,
        "cu_seq_lens_q": cu_q32,
        # one tensor object for both when equal: the attention function checks q == k by identity
        "cu_seq_lens_k": cu_q32 if same else cu_k.to(torch.int32),
        "max_length_q": int(batch["max_seqlen_q"]),
        "max_length_k": int(batch["max_seqlen_kv"]),
    }
    for key in _VISUAL_FORWARD_KEYS if not static else ():
        if batch.get(key) is not None:
            kwargs[key] = batch[key]
    if static:
        kwargs[_STATIC_KWARG] = static_vision_kwargs(batch, model)
        use_static_visual(model)
    elif batch.get("second_per_grid_ts") is not None:
        params = _forward_params(model) if model is not None and hasattr(model, "forward") else None
        if params is None or "second_per_grid_ts" in params:
            kwargs["second_per_grid_ts"] = batch["second_per_grid_ts"]
    if config is not None and vision_language and has_visual:
        if not static:
            kwargs.update(vision_precomputed_kwargs(batch, config))
        guard_vision_towers(model)
    if device is not None:
        moved: dict[int, Any] = {}  # a tensor passed under two names stays one object on the device

        def to_device(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            if id(v) not in moved:
                moved[id(v)] = v.to(device, non_blocking=True)
            return moved[id(v)]

        kwargs = {k: to_device(v) for k, v in kwargs.items()}
        if static:
            kwargs[_STATIC_KWARG] = {k: to_device(v) for k, v in kwargs[_STATIC_KWARG].items()}
    pixels = kwargs[_STATIC_KWARG] if static else kwargs
    for key in ("pixel_values", "pixel_values_videos"):
        if isinstance(pixels.get(key), torch.Tensor) and pixels[key].dtype == torch.uint8:
            if preset is None:
                raise ConfigError("pixel_dtype", f"{key} is uint8 and would reach the vision tower as raw 0..255 values",
                                  "pass preset=task_encoder.preset (normalised on the device), or use pixel_dtype "
                                  "'float32' / 'bfloat16'")
            from energon_pack.pixels import normalize_pixels

            pixels[key] = normalize_pixels(pixels[key], preset)
    return kwargs


# --------------------------------------------------------------------------------- static visual rows
#: The forward kwarg that carries a static pack's vision input to :func:`use_static_visual`'s hook.
_STATIC_KWARG = "energon_static_visual"
_STATIC_HOOKED = "_energon_pack_static_visual"


def static_vision_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """The vision tower's inputs for a static pack (:mod:`energon_pack.qwen_vl.static_visual`), every
    tensor of a fixed shape: the padded pixel rows, a grid of fixed length, and HF's own precomputed
    positions / cu_seqlens / window index (``transformers.vision_utils``) for the real media followed by
    the padding, cut into its own segments. Full-attention cu_seqlens: the pack's frame budget + padding
    chunks (max_seqlen pinned to the preset's largest frame); Qwen2.5-VL windows: ``budget / merge**2 + 1``
    entries, max_seqlen the window size."""
    config = _config_of(model)
    vision = config.vision_config
    keys = vision_precompute_keys(config.model_type)
    modeling = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    interp = hasattr(modeling, "get_vision_interpolation_indices_and_weights") and config.model_type == "qwen3_vl"
    if not {"position_ids", "cu_seqlens", "max_seqlen"} <= keys:
        raise ConfigError("static_visual", f"this transformers release's {config.model_type} vision tower takes no "
                          "precomputed positions/cu_seqlens, so its shapes cannot be pinned",
                          "use transformers >= 5.12, or build the encoder with static_visual=False")
    from transformers import vision_utils as vu

    merge = vision.spatial_merge_size
    unit = merge * merge
    pixels, grid = batch[STATIC_PIXELS_KEY], batch[STATIC_GRID_KEY].detach().cpu()
    budget = pixels.shape[0]
    n_real = int(grid.prod(-1).sum())
    max_frame = int(batch[STATIC_MAX_FRAME_KEY])
    window = "window_index" in keys
    window_rows = (vision.window_size // vision.patch_size) ** 2 if window else max_frame
    real = len(grid) > 0
    pos = vu.get_vision_position_ids(grid, merge) if real else torch.zeros((0, 2), dtype=torch.int64)
    size = static_segment_count(budget, merge)
    fixed_grid = torch.zeros((size, 3), dtype=torch.int64)
    fixed_grid[: len(grid)] = grid
    out: dict[str, Any] = {
        "pixel_values": pixels, "grid_thw": fixed_grid,
        "position_ids": torch.cat([pos, pos.new_zeros((budget - n_real, pos.shape[1]))]),
        "cu_seqlens": pad_segments(vu.get_vision_cu_seqlens(grid) if real else torch.zeros(1), budget, max_frame, merge,
                                   full_segment_count(budget, int(batch[STATIC_FRAMES_KEY]), max_frame)),
        "max_seqlen": max_frame,
    }
    if window:
        index, cu_window = (vu.get_vision_window_index(grid, spatial_merge_size=merge, window_size=vision.window_size,
                                                       patch_size=vision.patch_size) if real
                            else (torch.zeros(0, dtype=torch.int64), torch.zeros(1)))
        out.update(window_index=torch.cat([index, torch.arange(n_real // unit, budget // unit)]),
                   cu_window_seqlens=pad_segments(cu_window, budget, window_rows, merge), max_window_seqlen=window_rows)
    if interp:
        visual = _visual_tower(model)
        taps = (4 if visual.interpolation_mode == "bilinear" else 16)
        if real:
            idx, w = vu.get_vision_interpolation_indices_and_weights(
                grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
                align_corners=visual.interpolation_align_corners, spatial_merge_size=merge)
        else:
            idx, w = torch.zeros((0, taps), dtype=torch.int64), torch.zeros((0, taps))
        out.update(interp_indices=torch.cat([idx, idx.new_zeros((budget - n_real, idx.shape[1]))]),
                   interp_weights=torch.cat([w, w.new_zeros((budget - n_real, w.shape[1]))]))
    return out


def _visual_tower(model: Any) -> Any:
    base = getattr(model, "model", model)
    return getattr(base, "visual", None) or getattr(model, "visual")


def _deepstack_full_width(self: Any, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor,
                          visual_embeds: torch.Tensor) -> torch.Tensor:
    """Qwen3-VL's deepstack add with row-wide features (zero off the visual tokens): the same sums on
    the visual tokens, ``h + 0`` elsewhere, and no data-dependent shape."""
    if visual_embeds.dim() == hidden_states.dim():
        return hidden_states + visual_embeds.to(hidden_states.dtype)
    return type(self)._deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds)


def _static_visual_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook: run the vision tower on the static rows and place its features by one
    :func:`place_visual_rows` over the image and video tokens (real media first, in token order; the
    padding's features are never read, so they get a zero gradient); the model then gets ``inputs_embeds``."""
    vis = kwargs.pop(_STATIC_KWARG, None)
    if vis is None:
        return None
    vis = dict(vis)
    config = _config_of(module)
    visual = _visual_tower(module)
    pixels = vis.pop("pixel_values").to(next(visual.parameters()).dtype)
    out = visual(pixels, grid_thw=vis.pop("grid_thw"), **vis)
    feats = out.pooler_output if hasattr(out, "pooler_output") else (out[0] if isinstance(out, tuple) else out)
    ids = kwargs["input_ids"]
    embeds = module.get_input_embeddings()(ids)
    visual_tokens = (ids == config.image_token_id) | (ids == config.video_token_id)
    kwargs.update(input_ids=None, inputs_embeds=place_visual_rows(embeds, visual_tokens, feats))
    deepstack = getattr(out, "deepstack_features", None)
    if deepstack:
        text = getattr(module, "model", module).language_model
        text._energon_deepstack = (visual_tokens, [place_visual_rows(torch.zeros_like(embeds), visual_tokens, f)
                                                   for f in deepstack])
    return args, kwargs


def place_visual_rows(embeds: torch.Tensor, visual_tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``embeds`` with its visual tokens' rows replaced, in token order, by the first rows of ``rows``:
    the numbers of HF's ``embeds.masked_scatter(mask, rows)``, without its data-dependent size.

    Each token gathers row ``cumsum(visual) - 1`` (an ``index_select`` of fixed shape) and a
    ``where`` keeps it on visual tokens only, so forward and backward (an ``index_add``) have one
    shape per pack width and patch budget and no host sync: a CUDA-graph capture of the step can
    hold them, where ``masked_scatter``'s backward (a ``masked_select``) cannot. Rows past the
    visual tokens (a static pack's padding) are never read and get a zero gradient."""
    if rows.shape[0] == 0:
        return embeds
    source = (visual_tokens.reshape(-1).cumsum(0) - 1).clamp(min=0)
    placed = rows.to(embeds.dtype).index_select(0, source).view_as(embeds)
    return torch.where(visual_tokens.unsqueeze(-1), placed, embeds)


def _deepstack_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    stash = module.__dict__.pop("_energon_deepstack", None)
    if stash is None:
        return None
    kwargs.update(visual_pos_masks=stash[0], deepstack_visual_embeds=stash[1])
    return args, kwargs


def use_static_visual(model: Any) -> None:
    """Let ``model`` (a HF Qwen-VL model) take static packs: a forward pre-hook reads the
    ``energon_static_visual`` kwarg :func:`hf_forward_kwargs` adds (idempotent; Qwen3-VL's deepstack
    features go to the text model as row-wide tensors)."""
    import types

    if getattr(model, _STATIC_HOOKED, False):
        return
    model.register_forward_pre_hook(_static_visual_hook, with_kwargs=True)
    text = getattr(getattr(model, "model", model), "language_model", None)
    if text is not None and hasattr(text, "_deepstack_process"):
        text.register_forward_pre_hook(_deepstack_hook, with_kwargs=True)
        text._deepstack_process = types.MethodType(_deepstack_full_width, text)
    setattr(model, _STATIC_HOOKED, True)


_PRECOMPUTE_KEYS: dict[str, frozenset[str]] = {}


def vision_precompute_keys(model_type: str) -> frozenset[str]:
    """The precomputed vision tensors (names without the ``image_``/``video_`` prefix) that the installed
    transformers' ``model_type`` tower reads from its kwargs; empty where it reads none.

    Read off the modeling module: ``accepts_precomputed_kwargs`` (``image_cu_seqlens`` -> the tower's
    ``cu_seqlens``) and the ``transformers.vision_utils`` helpers it imports, which take each value
    from the kwargs when given: ``get_vision_position_ids`` (``position_ids``),
    ``get_vision_attention_seqlens`` (``cu_seqlens`` + ``max_seqlen``, and with the window index
    ``max_window_seqlen``) or only ``get_vision_cu_seqlens`` (``cu_seqlens``; ``max_seqlen`` is
    recomputed), ``get_vision_window_index`` (``window_index`` + ``cu_window_seqlens``, Qwen2.5-VL).
    """
    if model_type not in _PRECOMPUTE_KEYS:
        try:
            modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ImportError:
            modeling = None
        keys: set[str] = set()
        if modeling is not None and hasattr(modeling, "accepts_precomputed_kwargs"):
            if hasattr(modeling, "get_vision_position_ids"):
                keys.add("position_ids")
            if hasattr(modeling, "get_vision_attention_seqlens"):
                keys |= {"cu_seqlens", "max_seqlen"}
            elif hasattr(modeling, "get_vision_cu_seqlens"):
                keys.add("cu_seqlens")
            if hasattr(modeling, "get_vision_window_index"):
                keys |= {"window_index", "cu_window_seqlens"}
                if "max_seqlen" in keys:
                    keys.add("max_window_seqlen")
        _PRECOMPUTE_KEYS[model_type] = frozenset(keys)
    return _PRECOMPUTE_KEYS[model_type]


def vision_precomputed_kwargs(batch: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """The vision tower's data-dependent tensors, computed on the CPU from the batch's ``*_grid_thw``.

    HF's Qwen-VL vision towers compute their rotary positions, cu_seqlens, max_seqlen and (Qwen2.5-VL)
    window index from ``grid_thw`` with ``.tolist()`` / ``.item()``: device-to-host syncs and many
    small launches per image in every forward. transformers 5.x (from 5.12) lets the caller pass them
    precomputed (``image_cu_seqlens``, ``video_position_ids``, ...; ``accepts_precomputed_kwargs``): we
    compute them here with transformers' own functions on the loader's CPU tensors, so the values are
    exactly HF's. Only under a "flash" attention implementation (HF computes max_seqlen only then),
    and only the keys the installed release's tower reads (:func:`vision_precompute_keys`); ``{}``
    otherwise.
    """
    vision = getattr(config, "vision_config", None)
    impl = getattr(vision, "_attn_implementation", None) or getattr(config, "_attn_implementation", None) or ""
    if vision is None or config.model_type not in _VL_MODEL_TYPES or "flash" not in impl:
        return {}
    keys = vision_precompute_keys(config.model_type)
    if not keys:
        return {}
    from transformers import vision_utils as vu

    merge = vision.spatial_merge_size
    out: dict[str, Any] = {}
    for prefix, key in (("image", "image_grid_thw"), ("video", "video_grid_thw")):
        grid = batch.get(key)
        if grid is None:
            continue
        grid = grid.detach().cpu()
        values: dict[str, Any] = {}
        if "position_ids" in keys:
            values["position_ids"] = vu.get_vision_position_ids(grid, merge)
        if "cu_seqlens" in keys:
            cu = vu.get_vision_cu_seqlens(grid)
            values["cu_seqlens"] = cu
            values["max_seqlen"] = int((cu[1:] - cu[:-1]).max())
        if "window_index" in keys:
            window_index, cu_window = vu.get_vision_window_index(
                grid, spatial_merge_size=merge, window_size=vision.window_size, patch_size=vision.patch_size)
            values.update(window_index=window_index, cu_window_seqlens=cu_window,
                          max_window_seqlen=int((cu_window[1:] - cu_window[:-1]).max()))
        out.update({f"{prefix}_{name}": v for name, v in values.items() if name in keys})
    return out


def packed_forward(model: Any, batch: Mapping[str, Any], *, preset: Any = None, **extra: Any) -> Any:
    """``model(**hf_forward_kwargs(batch, model=model, preset=preset), **extra)``, refusing overrides
    that break packing.

    ``model`` may be wrapped (DDP, FSDP): the wrapper is called, its ``.module`` configures the kwargs."""
    if extra.get("use_cache"):
        raise ConfigError("use_cache", f"must be False for packed rows: {_CACHE_WHY}", "drop use_cache=True")
    refused = {
        "cache": _CACHE_WHY,
        "past_key_values": _CACHE_WHY,
        "attention_mask": "a mask disables HF's packed-sequence detection; the segments come from cu_seqlens",
        "labels": "HF's loss shifts labels again, ours are pre-shifted; use packed_loss(logits, batch)",
    }
    for bad, why in refused.items():
        if extra.get(bad) is not None:
            raise ConfigError(bad, f"must not be passed for a packed row: {why}", f"drop {bad}=")
    extra.pop("use_cache", None)
    inner = getattr(model, "module", model)  # DDP / FSDP wrappers: the config lives on the wrapped model
    guard_vision_towers(inner)
    device = next(model.parameters()).device
    return model(**hf_forward_kwargs(batch, model=inner, device=device, preset=preset), **extra)


# --------------------------------------------------------------------------------- varlen attention
def _segments_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """cu_seqlens (int32) of one row whose positions restart at 0 in every segment."""
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).reshape(-1)
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    return torch.cat([starts, starts.new_tensor([pos.numel()])]).to(torch.int32)


def _block_mask(cu: torch.Tensor, total: int, causal: bool, device: torch.device) -> torch.Tensor:
    """bool [T, T]: True where query i may attend key j (same cu segment, and j <= i if causal)."""
    lengths = (cu[1:] - cu[:-1]).to(device=device, dtype=torch.int64)
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
    mask = segment[:, None] == segment[None, :]
    if causal:
        mask = mask & torch.ones(total, total, dtype=torch.bool, device=device).tril()
    return mask


_VARLEN_FN: Any = False  # not looked up yet
_VARLEN_PARAMS: set[str] = set()


def _torch_varlen():
    """torch's ``varlen_attn`` (None before torch 2.10), looked up once."""
    global _VARLEN_FN, _VARLEN_PARAMS
    if _VARLEN_FN is False:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:  # torch < 2.10
            varlen_attn = None
        _VARLEN_PARAMS = _varlen_params(varlen_attn) if varlen_attn is not None else set()
        _VARLEN_FN = varlen_attn
    return _VARLEN_FN


def _varlen_params(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _same_segments(cu_q: torch.Tensor, cu_k: torch.Tensor) -> bool:
    """q and k segments equal: by identity (hf_forward_kwargs and the vision towers pass one tensor for
    both), by value on the CPU, and only otherwise by a device-to-host read."""
    if cu_q is cu_k:
        return True
    if cu_q.shape != cu_k.shape:
        return False
    return torch.equal(cu_q.cpu(), cu_k.cpu())


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    position_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF attention function: attention inside each ``cu_seq_lens`` segment of one packed row.

    ``query``/``key``/``value`` are ``(1, heads, T, head_dim)`` (GQA allowed); returns
    ``((1, T, heads, head_dim), None)`` like HF's sdpa/flash functions. Causality comes from the
    ``is_causal`` kwarg (the vision towers pass False) or else ``module.is_causal`` (decoder
    layers: True). Without ``cu_seq_lens_q`` the segments come from ``position_ids`` restarts.

    Hot path (once per layer): no device-to-host syncs when the caller passes one cu_seqlens tensor
    for q and k and an int max length (:func:`hf_forward_kwargs` does, and checks the row's
    segments once per batch on the CPU; HF's vision towers do too). The end of device cu_seqlens is
    not re-read here; CPU ones are checked.
    """
    if sliding_window is not None or softcap is not None:
        raise ConfigError("attn_implementation", f"{VARLEN_ATTENTION} supports neither sliding windows nor softcap",
                          "use flash_attention_2 or sdpa for such models")
    batch, heads_q, total, head_dim = query.shape
    heads_k = key.shape[1]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    cu_q, cu_k = cu_seq_lens_q, cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q
    if cu_q is None:
        if position_ids is not None and batch == 1 and position_ids.numel() == total:
            cu_q = cu_k = _segments_from_positions(position_ids)
        else:
            cu_q = cu_k = torch.tensor([0, total], dtype=torch.int32)
    if batch != 1:
        raise ConfigError("micro_batch_size", f"{VARLEN_ATTENTION} expects one packed row, got batch {batch}",
                          "use micro-batch size 1 (THD)")
    end_ok = cu_q.is_cuda or int(cu_q[-1]) == total  # device cu_seqlens: checked by hf_forward_kwargs
    if key.shape[2] != total or not end_ok or not _same_segments(cu_q, cu_k):
        raise ConfigError("cu_seq_lens_q", f"self-attention segments must cover the row of {total} tokens "
                          f"(cu_q ends at {int(cu_q[-1])}, keys {key.shape[2]})",
                          "pass the padded cu_seqlens of the batch (hf_forward_kwargs does) and use_cache=False")
    if attention_mask is not None:
        raise ConfigError("attention_mask", f"{VARLEN_ATTENTION} takes its segments from cu_seqlens",
                          "pass attention_mask=None (hf_forward_kwargs does)")
    q, k, v = (t.transpose(1, 2)[0] for t in (query, key, value))  # (T, H, D)
    varlen_attn = _torch_varlen()
    flash_ok = (varlen_attn is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
                and (dropout == 0.0 or not module.training) and head_dim <= 256)
    if flash_ok:
        if max_length_q is None:
            max_length_q = (cu_q[1:] - cu_q[:-1]).max()
        max_q = int(max_length_q)  # a Python int costs nothing; a tensor is read once here
        params = _VARLEN_PARAMS
        extra: dict[str, Any] = {}
        if "window_size" in params:  # torch >= 2.11: causal is window (-1, 0)
            extra["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            extra["is_causal"] = causal
        if heads_q != heads_k:
            if "enable_gqa" in params:
                extra["enable_gqa"] = True
            else:  # query head h uses kv head h // (heads_q // heads_k), as HF's repeat_kv
                k, v = (t.repeat_interleave(heads_q // heads_k, dim=1) for t in (k, v))
        cu_dev = cu_q if (cu_q.device == query.device and cu_q.dtype == torch.int32) else cu_q.to(query.device, torch.int32)
        out = varlen_attn(q, k, v, cu_dev, cu_dev, max_q, max_q, scale=scaling, **extra)
        return out.unsqueeze(0), None
    mask = _block_mask(cu_q, total, causal, query.device)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
        scale=scaling, enable_gqa=heads_q != heads_k,
    )
    return out.transpose(1, 2).contiguous(), None


def register_varlen_attention(name: str = VARLEN_ATTENTION) -> str:
    """Register :func:`varlen_attention_forward` with transformers' ``AttentionInterface``; returns the name.

    Idempotent. ``name`` must contain "flash" so the vision towers pass their cu_seqlens. It is
    deliberately not registered as a mask function: HF then builds no mask (our segments come
    from ``cu_seq_lens_q``). Set it on a model with :func:`use_varlen_attention`.
    """
    if "flash" not in name:
        raise ConfigError("name", f"{name!r} lacks 'flash'", "HF's vision towers pass cu_seqlens only to 'flash' names")
    check_transformers_version()
    from transformers import AttentionInterface

    _torch_varlen()  # looked up now: a lookup on the first compiled call would change a global dynamo guards on
    AttentionInterface.register(name, varlen_attention_forward)
    return name


def use_varlen_attention(model: Any, name: str = VARLEN_ATTENTION) -> str:
    """Register the varlen attention and make ``model`` (and every sub-model: vision tower, LLM) use it.

    Sets ``config._attn_implementation`` directly: ``model.set_attn_implementation(name)`` would
    treat any "flash" name that is not ``flash_attention_N`` as a hub kernel to download. Also
    :func:`guard_vision_towers`, so ``model(**hf_forward_kwargs(batch))`` works on every release.
    """
    from transformers import PreTrainedModel

    register_varlen_attention(name)
    guard_vision_towers(model)
    configs = [model.config] + [m.config for m in model.modules() if isinstance(m, PreTrainedModel)]
    seen: set[int] = set()
    while configs:
        config = configs.pop()
        if id(config) in seen:
            continue
        seen.add(id(config))
        config._attn_implementation_internal = name
        configs.extend(getattr(config, key) for key in getattr(config, "sub_configs", {}) if getattr(config, key, None) is not None)
    return name


# --------------------------------------------------------------------------------- loss
def packed_loss(
    logits: torch.Tensor, batch: Mapping[str, Any], num_supervised_tokens: int | float | torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross entropy on the batch's PRE-SHIFTED ``labels`` (``labels[i]`` is the target at position i).

    Per-token loss (fp32) weighted by ``loss_mask`` and summed. Returns ``(loss, local_count)``:
    ``loss`` is the sum, or the sum divided by ``num_supervised_tokens`` when given (e.g. from
    :func:`global_token_count`); ``local_count`` is this row's supervised tokens (a tensor).
    """
    labels, loss_mask = batch["labels"], batch["loss_mask"]
    vocab = logits.shape[-1]
    if logits.shape[:-1] != labels.shape:
        raise ConfigError("logits", f"shape {tuple(logits.shape)} does not match labels {tuple(labels.shape)}",
                          "pass the full logits of the packed row (logits_to_keep=0)")
    labels = labels.to(logits.device)
    loss_mask = loss_mask.to(logits.device, torch.float32)
    token_loss = F.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1).clamp(min=0),
                                 reduction="none")
    weight = loss_mask.reshape(-1) * (labels.reshape(-1) != IGNORE_INDEX)
    loss = (token_loss * weight).sum()
    count = weight.sum()
    if num_supervised_tokens is not None:
        loss = loss / torch.as_tensor(num_supervised_tokens, dtype=loss.dtype, device=loss.device).clamp(min=1)
    return loss, count


def global_token_count(local_count: torch.Tensor | float, group: Any = None) -> torch.Tensor:
    """Supervised tokens summed over the data-parallel ranks (``all_reduce``); the local count without dist."""
    count = torch.as_tensor(local_count, dtype=torch.float32).detach().clone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        backend = torch.distributed.get_backend(group)
        if backend == "nccl" and not count.is_cuda:
            count = count.cuda()
        torch.distributed.all_reduce(count, group=group)
    return count


def normalize_by_global_tokens(
    loss_sum: torch.Tensor, local_count: torch.Tensor | float, *, group: Any = None, grads_averaged: bool = True
) -> torch.Tensor:
    """``loss_sum`` divided by the supervised tokens of all ranks: every token weighs the same.

    DDP/FSDP average gradients over ranks, so with ``grads_averaged`` the result is multiplied
    by the world size to make the averaged gradient the true token mean.
    """
    total = global_token_count(local_count, group).to(loss_sum.device).clamp(min=1)
    world = 1
    if grads_averaged and torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size(group)
    return loss_sum * world / total
