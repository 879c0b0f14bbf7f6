"""The forward keyword arguments of a HF Qwen-VL model for one of our packed batches (micro-batch size 1).

:func:`hf_forward_kwargs` turns a batch into the models' ``forward`` kwargs: positions ``(4, 1, T)`` (row 0 the
text positions that restart at 0 in every segment, from which HF's text model reads the packing; rows 1-3 our
M-RoPE), no attention mask, ``use_cache=False``, and the flash varlen kwargs ``cu_seq_lens_q/_k`` +
``max_length_q/_k`` from the *padded* cu_seqlens (each segment's physical span; an alignment gap trails its
segment and is loss-masked). :func:`packed_forward` runs the model on them. Neither installs anything on the model
(:func:`~energon_pack.integrations.hf.prepare_model` does), except the deprecated path for a model never prepared.

Where transformers releases differ, the route is chosen by what the installed release has, never by its version
string: precomputed vision tensors (:func:`vision_precomputed_kwargs`) only for the keys the installed tower reads;
video M-RoPE (:func:`mrope_conventions`) probed with the model's own ``get_rope_index``, and the segments with videos
get the release's positions where they differ from the task encoder's (4.57: the text after a video resumes at the
block's largest position + 1; 4.57-5.17 Qwen2.5-VL truncates ``second_per_grid_t`` to an integer).

Batches from another model version or vision geometry (:func:`check_vision_preset`) get a :class:`ConfigError`
before the forward instead of wrong video positions or an error from inside the vision tower.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from energon_pack.errors import ConfigError
from energon_pack.integrations.hf.model import ensure_prepared
from energon_pack.integrations.hf.static_visual import STATIC_KWARG, static_vision_kwargs
from energon_pack.integrations.hf.version import check_transformers_version, vision_precompute_keys
from energon_pack.qwen_vl.media_order import media_row_spans
from energon_pack.qwen_vl.static_visual import STATIC_PIXELS_KEY
from energon_pack.thd import VISION_PRESET_KEY, vision_preset_record

__all__ = [
    "check_vision_preset",
    "hf_forward_kwargs",
    "mm_token_type_ids",
    "mrope_conventions",
    "one_vision_stream",
    "packed_forward",
    "vision_precomputed_kwargs",
]

_VL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
_VISUAL_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
_CACHE_WHY = (
    "with a cache HF's mask builder skips packed-sequence detection (it reads the restarting text "
    "positions only when attention_mask and cache are both None), so under sdpa/eager every token "
    "attends across segment boundaries; a training forward never needs a cache"
)


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
    want = {
        "name": _PRESET_OF_MODEL_TYPE[config.model_type],
        "rope_style": _ROPE_STYLE_OF_MODEL_TYPE[config.model_type],
        "patch_size": int(vision.patch_size),
        "temporal_patch_size": int(vision.temporal_patch_size),
        "merge_size": int(vision.spatial_merge_size),
    }
    if want["rope_style"] == "qwen2.5" and getattr(vision, "tokens_per_second", None) is not None:
        want["tokens_per_second"] = float(vision.tokens_per_second)
    return want


def _describe(record: Mapping[str, Any]) -> str:
    tps = f", tokens_per_second {record['tokens_per_second']:g}" if record.get("rope_style") == "qwen2.5" else ""
    return (
        f"M-RoPE {record.get('rope_style')}{tps}, patch {record.get('patch_size')}, temporal patch "
        f"{record.get('temporal_patch_size')}, merge {record.get('merge_size')}"
    )


def _check_record(record: Mapping[str, Any], config: Any, where: str) -> None:
    want = _model_geometry(config)
    if record.get("rope_style") != want["rope_style"]:
        raise ConfigError(
            "preset",
            f"{where} preset {record.get('name')!r} ({_describe(record)}) is not the "
            f"{config.model_type} model's ({want['name']!r}: {_describe(want)})",
            f"build the task encoder with preset={want['name']!r}, the model's version",
        )
    differ = [
        k
        for k in ("patch_size", "temporal_patch_size", "merge_size", "tokens_per_second")
        if k in want and float(record.get(k, -1)) != want[k]
    ]
    if differ:
        sizes = ", ".join(f"{k}={want[k]!r}" for k in differ)
        raise ConfigError(
            "preset",
            f"{where} preset {record.get('name')!r} ({_describe(record)}) does not match the "
            f"{config.model_type} model's vision_config ({_describe({**record, **want})})",
            f"build the task encoder with get_preset({record.get('name')!r}, {sizes}) to match it",
        )


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
            raise ConfigError(
                pixels_key,
                f"rows of shape {tuple(pixels.shape)[1:]} do not fit the {config.model_type} "
                f"vision tower, which takes rows of in_channels * temporal_patch_size * patch_size^2 = "
                f"{channels} * {temporal} * {patch}^2 = {width}",
                f"build the batch with preset={name!r}, or with patch sizes overridden to match the "
                "model's vision_config",
            )
        grid_rows = grid.detach().cpu().tolist() if grid is not None else []
        covered = sum(t * h * w for t, h, w in grid_rows)
        if covered != pixels.shape[0]:
            raise ConfigError(
                grid_key,
                f"covers {covered} patches but {pixels_key} has {pixels.shape[0]} rows",
                "pass the grids and pixel rows of the same samples, in the same order",
            )
        bad = [g for g in grid_rows if g[1] % merge or g[2] % merge]
        if bad:
            raise ConfigError(
                grid_key,
                f"grid {bad[0]} is not divisible by the model's spatial_merge_size {merge}",
                f"build the batch with preset={name!r}, or with merge_size={merge}",
            )


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
    input_ids = torch.tensor(
        [[config.vision_start_token_id] + [config.video_token_id] * steps + [config.vision_end_token_id] * 2]
    )
    grid = torch.tensor([[steps, merge, merge]])
    params = inspect.signature(owner.get_rope_index).parameters
    probe: dict[str, Any] = {
        "input_ids": input_ids,
        "image_grid_thw": None,
        "video_grid_thw": grid,
        "second_per_grid_ts": torch.tensor([spg]),
        "attention_mask": None,
        "mm_token_type_ids": mm_token_type_ids(input_ids, config),
    }
    with torch.no_grad():
        got = owner.get_rope_index(**{k: v for k, v in probe.items() if k in params})[0][:, 0].cpu()
    preset = _preset_of_config(config)
    found = None
    for resume in ("spatial", "max"):
        for truncate in (False, True):
            want = mrope_position_ids(
                input_ids[0],
                None,
                grid,
                [float(int(spg)) if truncate else spg],
                preset=preset,
                image_pad_id=config.image_token_id,
                video_pad_id=config.video_token_id,
                resume=resume,
            )
            if found is None and torch.equal(got.to(want.dtype), want):
                found = (resume, truncate)
    if found is None:
        warnings.warn(
            f"the installed transformers places {model_type} video M-RoPE positions in a way energon_pack "
            f"does not know (probe {got.tolist()}); packed rows keep the task encoder's positions, which "
            "may differ from this release's per-sample forward for videos",
            stacklevel=3,
        )
        found = _BATCH_MROPE
    _MROPE_CONVENTIONS[model_type] = found
    return found


def _mrope_for_release(
    batch: Mapping[str, Any], mrope: torch.Tensor, config: Any, conventions: tuple[str, bool]
) -> torch.Tensor:
    """The batch's (3, 1, T) M-RoPE with every segment that holds a video recomputed in ``conventions``."""
    from energon_pack.qwen_vl.mrope import mrope_position_ids

    resume, truncate = conventions
    preset = _preset_of_config(config)
    merge2 = preset.merge_size**2
    ids = batch["input_ids"][0].detach().cpu()
    starts = batch["cu_seqlens_q_padded"].detach().cpu().tolist()
    real = batch["cu_seqlens_q"].detach().cpu()
    lengths = (real[1:] - real[:-1]).tolist()
    grids = {
        kind: (
            batch.get(f"{kind}_grid_thw").detach().cpu().tolist() if batch.get(f"{kind}_grid_thw") is not None else []
        )
        for kind in ("image", "video")
    }
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
        seg = ids[start : start + length]
        first_video = cursor["video"]
        images = take("image", int((seg == config.image_token_id).sum()))
        videos = take("video", int((seg == config.video_token_id).sum()))
        if not videos:
            continue
        spg = spg_all[first_video : cursor["video"]]
        spg = [float(int(x)) for x in spg] if truncate else spg
        out[:, 0, start : start + length] = mrope_position_ids(
            seg,
            images or None,
            videos,
            spg,
            preset=preset,
            image_pad_id=config.image_token_id,
            video_pad_id=config.video_token_id,
            resume=resume,
        )
    return out.to(mrope.device)


def hf_forward_kwargs(
    batch: Mapping[str, Any],
    *,
    model: Any = None,
    device: torch.device | str | None = None,
    use_cache: bool = False,
    preset: Any = None,
    one_vision_call: bool = True,
) -> dict[str, Any]:
    """Keyword arguments for a HF Qwen-VL ``forward`` (ForConditionalGeneration or base model).

    uint8 pixels (``pixel_dtype="uint8"``) are normalised on ``device`` with the vision
    ``preset``'s mean/std (:func:`energon_pack.qwen_vl.normalize_pixels`); without ``preset``
    they are refused, since HF would feed raw 0..255 values to the vision tower.

    ``model`` (optional, a model or its config) enables the checks that need it: the batch's preset and
    pixel rows against the model's version and vision_config (:func:`check_vision_preset`); a text-only LLM
    gets ``(1, T)`` positions and must not receive visual tensors; ``second_per_grid_ts`` is
    passed only where ``forward`` takes it (Qwen2.5-VL). Without ``model`` a Qwen-VL model is
    assumed. ``labels`` are not passed: HF's loss shifts them again; use
    :func:`~energon_pack.integrations.hf.packed_loss`.

    ``one_vision_call`` (with ``model``): a pack holding images *and* videos reaches the model as one stream of
    media in token order (:func:`one_vision_stream`), so the vision tower runs once per step instead of once per
    kind; the same numbers (each medium's features depend on its own rows only), one tower call and one
    device sync less (a refit of a compiled 3B Qwen2.5-VL video-mix run on an H200 prices the second call at
    about 105 ms of a 760 ms step). ``False`` keeps HF's call per kind.

    Nothing is installed on ``model``: call :func:`~energon_pack.integrations.hf.prepare_model` once first. A
    module it never prepared is prepared here (the model's own attention kept) with a ``DeprecationWarning``.
    """
    if use_cache:
        raise ConfigError("use_cache", f"must be False for packed rows: {_CACHE_WHY}", "leave use_cache=False")
    check_transformers_version()
    input_ids = batch["input_ids"]
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ConfigError(
            "micro_batch_size",
            f"input_ids must be one packed row [1, T], got {shape}",
            "use micro-batch size 1 (one THD row per step; the packer fills the row instead of MBS)",
        )
    total = input_ids.shape[1]
    position_ids = batch["position_ids"]
    if tuple(position_ids.shape) != (1, total):
        raise ConfigError(
            "position_ids",
            f"expected shape (1, {total}), got {tuple(position_ids.shape)}",
            "pass the batch as built by the task encoder (micro-batch size 1)",
        )
    config = _config_of(model) if model is not None else None
    vision_language = config is None or _is_vision_language(config)
    if config is not None and _is_vision_language(config) and config.model_type not in _VL_MODEL_TYPES:
        raise ConfigError(
            "model",
            f"model_type {config.model_type!r} is not a Qwen-VL model",
            f"use one of {_VL_MODEL_TYPES} (or a text-only LLM)",
        )
    if config is not None:
        check_vision_preset(batch, config, preset=preset)
    static = batch.get(STATIC_PIXELS_KEY) is not None
    runs_static = config is not None and _is_vision_language(config) and hasattr(model, "register_forward_pre_hook")
    if static and not runs_static:
        raise ConfigError(
            "model",
            "a static-visual batch (visual_pixel_values) needs the Qwen-VL model that runs it",
            "pass model= (hf_forward_kwargs / packed_forward)",
        )
    has_visual = static or any(batch.get(k) is not None for k in _VISUAL_FORWARD_KEYS)
    mrope = batch.get("mrope_position_ids")

    if vision_language:
        if mrope is None:
            if has_visual:
                raise ConfigError(
                    "mrope_position_ids",
                    "the batch carries images/videos but no M-RoPE positions",
                    "build it with QwenVLPackingTaskEncoder (it computes mrope_position_ids per segment)",
                )
            # Text only: HF's M-RoPE of a text sample is its text position on all three axes.
            mrope = position_ids.unsqueeze(0).expand(3, 1, total)
        if tuple(mrope.shape) != (3, 1, total):
            raise ConfigError(
                "mrope_position_ids",
                f"expected shape (3, 1, {total}), got {tuple(mrope.shape)}",
                "use micro-batch size 1 and the batch as built by the task encoder",
            )
        if model is not None and batch.get("video_grid_thw") is not None:
            conventions = mrope_conventions(model)
            if conventions != _BATCH_MROPE:  # an older release: its own per-sample positions for videos
                mrope = _mrope_for_release(batch, mrope, config, conventions)
        positions = torch.cat([position_ids.unsqueeze(0), mrope], dim=0)  # (4, 1, T): text row first
    else:
        if has_visual:
            raise ConfigError(
                "model",
                f"{config.model_type!r} is a text-only model but the batch has images/videos",
                "use a Qwen-VL model, or pack text-only data",
            )
        positions = position_ids

    cu_q, cu_k = batch["cu_seqlens_q_padded"], batch["cu_seqlens_kv_padded"]
    # The checks that read values run here, once per batch, on the loader's CPU tensors: the
    # attention function (called once per layer) then needs no device-to-host sync.
    cu_q_host, cu_k_host = cu_q.detach().cpu(), cu_k.detach().cpu()
    for name, cu in (("cu_seqlens_q_padded", cu_q_host), ("cu_seqlens_kv_padded", cu_k_host)):
        if cu.dim() != 1 or int(cu[0]) != 0 or int(cu[-1]) != total:
            raise ConfigError(
                name,
                f"must run from 0 to the row length {total}, got {cu.tolist()}",
                "pass the batch as built by the task encoder (the last span absorbs the tail)",
            )
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
    stream = None
    if one_vision_call and not static and config is not None and vision_language:
        stream = one_vision_stream(batch, config)
    if stream is not None:  # videos travel as images: HF's one masked_scatter over the visual tokens places them
        grid, spans = stream
        kwargs["input_ids"] = input_ids.masked_fill(input_ids == config.video_token_id, config.image_token_id)
        kwargs["image_grid_thw"] = grid
        sources = {"image": kwargs.pop("pixel_values"), "video": kwargs.pop("pixel_values_videos")}
        del kwargs["video_grid_thw"]
    if static:
        kwargs[STATIC_KWARG] = static_vision_kwargs(batch, model)
    elif stream is None and batch.get("second_per_grid_ts") is not None:
        params = _forward_params(model) if model is not None and hasattr(model, "forward") else None
        if params is None or "second_per_grid_ts" in params:
            kwargs["second_per_grid_ts"] = batch["second_per_grid_ts"]
    if config is not None and vision_language and has_visual:
        if not static:
            kwargs.update(vision_precomputed_kwargs(batch if stream is None else {"image_grid_thw": grid}, config))
    if model is not None:
        ensure_prepared(model, static_visual=static, stacklevel=2)  # a no-op on a prepared model or a config
    moved: dict[int, Any] = {}  # a tensor passed under two names stays one object on the device

    def to_device(v: Any) -> Any:
        if device is None or not isinstance(v, torch.Tensor):
            return v
        if id(v) not in moved:
            moved[id(v)] = v.to(device, non_blocking=True)
        return moved[id(v)]

    if device is not None:
        kwargs = {k: to_device(v) for k, v in kwargs.items()}
        if static:
            kwargs[STATIC_KWARG] = {k: to_device(v) for k, v in kwargs[STATIC_KWARG].items()}
    if stream is not None:  # the rows in token order, gathered where they train (a device copy, no host one)
        sources = {kind: to_device(rows) for kind, rows in sources.items()}
        kwargs["pixel_values"] = torch.cat([sources[kind][lo:hi] for kind, _, lo, hi in spans])
    pixels = kwargs[STATIC_KWARG] if static else kwargs
    for key in ("pixel_values", "pixel_values_videos"):
        if isinstance(pixels.get(key), torch.Tensor) and pixels[key].dtype == torch.uint8:
            if preset is None:
                raise ConfigError(
                    "pixel_dtype",
                    f"{key} is uint8 and would reach the vision tower as raw 0..255 values",
                    "pass preset=task_encoder.preset (normalised on the device), or use pixel_dtype "
                    "'float32' / 'bfloat16'",
                )
            from energon_pack.pixels import normalize_pixels

            pixels[key] = normalize_pixels(pixels[key], preset)
    return kwargs


def one_vision_stream(
    batch: Mapping[str, Any], config: Any
) -> tuple[torch.Tensor, list[tuple[str, int, int, int]]] | None:
    """A pack's images and videos as one stream in token order: its ``(t, h, w)`` grid and each medium's pixel
    rows (:func:`~energon_pack.qwen_vl.media_order.media_row_spans`), for one vision-tower call.

    HF's Qwen-VL towers treat an image and a video alike (a ``(t, h, w)`` grid of patch rows, attention within
    each frame or window), and the model places the features by ``masked_scatter`` in token order. None where
    the pack holds one kind only, its ids or grids are not on the CPU (reading them would sync the device), or
    its tokens and grids disagree (HF's own check then names the mismatch)."""
    image_grid, video_grid, ids = batch.get("image_grid_thw"), batch.get("video_grid_thw"), batch["input_ids"]
    tensors = (batch.get("pixel_values"), batch.get("pixel_values_videos"), image_grid, video_grid)
    if any(t is None for t in tensors) or any(t.device.type != "cpu" for t in (ids, image_grid, video_grid)):
        return None
    merge = config.vision_config.spatial_merge_size
    try:
        spans = media_row_spans(ids, image_grid, video_grid, config.image_token_id, config.video_token_id, merge)
    except ValueError:
        return None
    grids = {"image": image_grid, "video": video_grid.to(image_grid.dtype)}
    return torch.stack([grids[kind][i] for kind, i, _, _ in spans]), spans


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
                grid, spatial_merge_size=merge, window_size=vision.window_size, patch_size=vision.patch_size
            )
            values.update(
                window_index=window_index,
                cu_window_seqlens=cu_window,
                max_window_seqlen=int((cu_window[1:] - cu_window[:-1]).max()),
            )
        out.update({f"{prefix}_{name}": v for name, v in values.items() if name in keys})
    return out


def packed_forward(model: Any, batch: Mapping[str, Any], *, preset: Any = None, **extra: Any) -> Any:
    """``model(**hf_forward_kwargs(batch, model=model, preset=preset), **extra)``, refusing overrides
    that break packing.

    ``model`` may be wrapped (DDP, FSDP): the wrapper is called, its ``.module`` configures the kwargs. Like
    :func:`hf_forward_kwargs` it expects a model :func:`~energon_pack.integrations.hf.prepare_model` prepared."""
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
    ensure_prepared(inner, static_visual=batch.get(STATIC_PIXELS_KEY) is not None, stacklevel=2)
    device = next(model.parameters()).device
    return model(**hf_forward_kwargs(batch, model=inner, device=device, preset=preset), **extra)
