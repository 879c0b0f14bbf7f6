"""Static-visual packs through a HF Qwen-VL model: every tensor the model sees has one shape per pack width.

The task encoder's static packs (``static_visual=True``, :mod:`energon_pack.qwen_vl.static_visual`) carry padded
vision rows. :func:`static_vision_kwargs` adds fixed-length precomputed vision tensors, the forward kwargs pass
both under one kwarg (:data:`STATIC_KWARG`), and a forward pre-hook (:func:`use_static_visual`) turns them into
``inputs_embeds`` with :func:`place_visual_rows`: ``torch.compile`` then compiles once and CUDA graphs can capture
the step.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from energon_pack.errors import ConfigError
from energon_pack.integrations.hf.version import vision_precompute_keys
from energon_pack.qwen_vl.static_visual import (
    STATIC_FRAMES_KEY,
    STATIC_GRID_KEY,
    STATIC_MAX_FRAME_KEY,
    STATIC_PIXELS_KEY,
    full_segment_count,
    pad_segments,
    static_segment_count,
)

__all__ = ["STATIC_KWARG", "place_visual_rows", "static_vision_kwargs", "use_static_visual"]

#: The forward kwarg that carries a static pack's vision input to :func:`use_static_visual`'s hook.
STATIC_KWARG = "energon_static_visual"
_STATIC_HOOKED = "_energon_pack_static_visual"


def static_vision_kwargs(batch: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """The vision tower's inputs for a static pack (:mod:`energon_pack.qwen_vl.static_visual`), every
    tensor of a fixed shape: the padded pixel rows, a grid of fixed length, and HF's own precomputed
    positions / cu_seqlens / window index (``transformers.vision_utils``) for the real media followed by
    the padding, cut into its own segments. Full-attention cu_seqlens: the pack's frame budget + padding
    chunks (max_seqlen pinned to the preset's largest frame); Qwen2.5-VL windows: ``budget / merge**2 + 1``
    entries, max_seqlen the window size."""
    config = getattr(model, "config", model)
    vision = config.vision_config
    keys = vision_precompute_keys(config.model_type)
    modeling = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    interp = hasattr(modeling, "get_vision_interpolation_indices_and_weights") and config.model_type == "qwen3_vl"
    if not {"position_ids", "cu_seqlens", "max_seqlen"} <= keys:
        raise ConfigError(
            "static_visual",
            f"this transformers release's {config.model_type} vision tower takes no "
            "precomputed positions/cu_seqlens, so its shapes cannot be pinned",
            "use transformers >= 5.12, or build the encoder with static_visual=False",
        )
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
        "pixel_values": pixels,
        "grid_thw": fixed_grid,
        "position_ids": torch.cat([pos, pos.new_zeros((budget - n_real, pos.shape[1]))]),
        "cu_seqlens": pad_segments(
            vu.get_vision_cu_seqlens(grid) if real else torch.zeros(1),
            budget,
            max_frame,
            merge,
            full_segment_count(budget, int(batch[STATIC_FRAMES_KEY]), max_frame),
        ),
        "max_seqlen": max_frame,
    }
    if window:
        index, cu_window = (
            vu.get_vision_window_index(
                grid, spatial_merge_size=merge, window_size=vision.window_size, patch_size=vision.patch_size
            )
            if real
            else (torch.zeros(0, dtype=torch.int64), torch.zeros(1))
        )
        out.update(
            window_index=torch.cat([index, torch.arange(n_real // unit, budget // unit)]),
            cu_window_seqlens=pad_segments(cu_window, budget, window_rows, merge),
            max_window_seqlen=window_rows,
        )
    if interp:
        visual = _visual_tower(model)
        taps = 4 if visual.interpolation_mode == "bilinear" else 16
        if real:
            idx, w = vu.get_vision_interpolation_indices_and_weights(
                grid,
                num_grid_per_side=visual.num_grid_per_side,
                mode=visual.interpolation_mode,
                align_corners=visual.interpolation_align_corners,
                spatial_merge_size=merge,
            )
        else:
            idx, w = torch.zeros((0, taps), dtype=torch.int64), torch.zeros((0, taps))
        out.update(
            interp_indices=torch.cat([idx, idx.new_zeros((budget - n_real, idx.shape[1]))]),
            interp_weights=torch.cat([w, w.new_zeros((budget - n_real, w.shape[1]))]),
        )
    return out


def _visual_tower(model: Any) -> Any:
    base = getattr(model, "model", model)
    return getattr(base, "visual", None) or model.visual


def _deepstack_full_width(
    self: Any, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor, visual_embeds: torch.Tensor
) -> torch.Tensor:
    """Qwen3-VL's deepstack add with row-wide features (zero off the visual tokens): the same sums on
    the visual tokens, ``h + 0`` elsewhere, and no data-dependent shape."""
    if visual_embeds.dim() == hidden_states.dim():
        return hidden_states + visual_embeds.to(hidden_states.dtype)
    return type(self)._deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds)


def _static_visual_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook: run the vision tower on the static rows and place its features by one
    :func:`place_visual_rows` over the image and video tokens (real media first, in token order; the
    padding's features are never read, so they get a zero gradient); the model then gets ``inputs_embeds``."""
    vis = kwargs.pop(STATIC_KWARG, None)
    if vis is None:
        return None
    vis = dict(vis)
    config = getattr(module, "config", module)
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
        text._energon_deepstack = (
            visual_tokens,
            [place_visual_rows(torch.zeros_like(embeds), visual_tokens, f) for f in deepstack],
        )
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
    ``energon_static_visual`` kwarg :func:`~energon_pack.integrations.hf.hf_forward_kwargs` adds (idempotent;
    Qwen3-VL's deepstack features go to the text model as row-wide tensors).
    :func:`~energon_pack.integrations.hf.prepare_model` calls it."""
    import types

    if getattr(model, _STATIC_HOOKED, False):
        return
    model.register_forward_pre_hook(_static_visual_hook, with_kwargs=True)
    text = getattr(getattr(model, "model", model), "language_model", None)
    if text is not None and hasattr(text, "_deepstack_process"):
        text.register_forward_pre_hook(_deepstack_hook, with_kwargs=True)
        text._deepstack_process = types.MethodType(_deepstack_full_width, text)
    setattr(model, _STATIC_HOOKED, True)
