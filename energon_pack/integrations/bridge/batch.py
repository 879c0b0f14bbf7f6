"""The batch forms Megatron-Bridge's training steps read, from our packed THD rows (docs/concepts/batch_contract.md).

VLM step (``megatron.bridge.training.vlm_step.get_batch_from_iterator``): it keeps an allow-list of batch keys
and sets every other key to None: ``visual_inputs`` (one object whose every field gets ``.cuda()``),
``tokens``/``input_ids``, ``position_ids``, ``labels``, ``loss_mask``, ``attention_mask`` (only when the dataset
provides masks), ``cu_seqlens_q``, ``cu_seqlens_kv``, their ``_padded`` variants and the host scalars
``max_seqlen_q``/``max_seqlen_kv``. Our flat ``pixel_values``/``image_grid_thw``/... would be dropped there, so
:func:`to_bridge_batch` moves them into one ``visual_inputs`` object (Bridge's ``GenericVisualInputs`` when
importable, else :class:`VisualInputs` with the same fields and ``normalized_for_model()``).

``position_ids``: Bridge's Qwen2/2.5-VL model recomputes M-RoPE per segment from ``cu_seqlens_q`` /
``cu_seqlens_q_padded`` and overwrites what it is given, so we pass the per-segment 1-D positions [1, T] like
Bridge's own encoder. Bridge's Qwen3-VL model uses a passed [3, B, T] tensor as is, so for Qwen3-VL we pass our
``mrope_position_ids`` [3, 1, T] (equal to Bridge's own per-segment positions on every real token; gaps are
never attended).

GPT step (``megatron.bridge.training.gpt_step.get_batch``): ``tokens``, ``labels``, ``loss_mask``,
``position_ids``, ``attention_mask``, the packed keys and, on Bridge's main branch, ``padding_mask``;
:func:`to_gpt_batch` gives our row those names. Labels keep our shift (each segment keeps its last token, whose
label is -100 and loss 0) where Bridge's packed SFT collate drops that token instead: the supervised (input
token, label) pairs, the loss mask's ones and so the token count Bridge's loss divides by are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ...errors import ConfigError
from ...thd import VISUAL_KEYS, without_equal_padded_boundaries

#: The packed-sequence keys both steps read (Megatron-Core's ``PackedSeqParams`` fields).
PACKED_SEQ_KEYS = (
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "cu_seqlens_q_padded",
    "cu_seqlens_kv_padded",
    "max_seqlen_q",
    "max_seqlen_kv",
)
#: The keys of a converted batch that Bridge's VLM step reads (``tokens`` is not emitted: the step
#: falls back to ``input_ids`` when it is absent, as with Bridge's own Qwen-VL encoder).
BRIDGE_BATCH_KEYS = (
    "input_ids",
    "position_ids",
    "labels",
    "loss_mask",
    "attention_mask",
    "visual_inputs",
    *PACKED_SEQ_KEYS,
    "total_tokens",
)
#: Energon bookkeeping (restore keys) and our per-worker counters; Bridge's step sets them to None.
METADATA_KEYS = ("__key__", "__keys__", "__restore_key__", "packing_stats")


@dataclass
class VisualInputs:
    """Stand-in for Bridge's ``GenericVisualInputs`` (same fields, same two methods).

    Used only when Bridge is not importable; :func:`to_bridge_batch` prefers Bridge's class.
    """

    pixel_values: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    second_per_grid_ts: torch.Tensor | None = None
    image_sizes: torch.Tensor | None = None
    image_position_ids: torch.Tensor | None = None
    mm_token_type_ids: torch.Tensor | None = None

    def as_model_kwargs(self) -> dict[str, torch.Tensor]:
        """The fields that are set, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def normalized_for_model(self) -> dict[str, torch.Tensor]:
        """Set fields; batched Qwen tensors flattened: pixels [B,N,C,H,W] -> [B*N,C,H,W], grids [B,N,3] -> [B*N,3]."""
        out = self.as_model_kwargs()
        for name in ("pixel_values", "pixel_values_videos"):
            value = out.get(name)
            if isinstance(value, torch.Tensor) and value.dim() == 5:
                out[name] = value.reshape(value.shape[0] * value.shape[1], *value.shape[2:])
        for name in ("image_grid_thw", "video_grid_thw"):
            value = out.get(name)
            if isinstance(value, torch.Tensor) and value.dim() == 3:
                out[name] = value.reshape(-1, value.shape[-1])
        return out


def bridge_visual_inputs_class() -> type:
    """Bridge's ``GenericVisualInputs`` when importable, else :class:`VisualInputs`."""
    try:
        from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs
    except Exception:  # Bridge absent, or its package __init__ needs Megatron-Core / TE
        return VisualInputs
    return GenericVisualInputs


def to_bridge_batch(
    batch: dict, *, position_ids: str = "mrope", visual_inputs_cls: type | None = None, static_cu: bool = False
) -> dict:
    """Our THD row (docs/concepts/batch_contract.md) -> the dict Bridge's VLM step reads.

    Keys: :data:`BRIDGE_BATCH_KEYS` plus the Energon/statistics :data:`METADATA_KEYS` present in
    ``batch``. Tensors are not copied. ``position_ids``: ``"mrope"`` passes
    ``mrope_position_ids`` [3, 1, T] when the batch has them (Qwen3-VL uses them as they are),
    ``"flat"`` the per-segment 1-D positions [1, T] (Qwen2/2.5-VL recompute M-RoPE inside the
    model). ``visual_inputs`` is always an object; fields no segment has are None.

    Args:
        batch: one packed THD row of our encoders (docs/concepts/batch_contract.md): ``input_ids`` [1, T],
            ``labels``, ``loss_mask``, ``position_ids``, ``cu_seqlens_q``, ... and the flat visual keys. A
            static-visual row or uint8 pixels are refused (ConfigError): Bridge's vision models cannot read them.
        position_ids: which positions become Bridge's ``position_ids``: ``"mrope"`` (our
            ``mrope_position_ids`` [3, 1, T], falling back to the 1-D positions when the batch has none,
            e.g. text) or ``"flat"`` (the per-segment 1-D positions [1, T]). Default ``"mrope"``: the
            positions Qwen3-VL uses as given; :class:`BridgeQwenVLPackingTaskEncoder` picks ``"flat"`` for
            Qwen2/2.5-VL presets itself.
        visual_inputs_cls: the class of the ``visual_inputs`` object, built with the visual keys as fields.
            Default None: Bridge's ``GenericVisualInputs`` when importable (what its VLM step expects), else
            :class:`VisualInputs` (same fields and methods), so conversion works without Bridge installed.
        static_cu: the row comes from the static path (``pad_cu_seqlens``): ``cu_seqlens_*_padded`` stay even
            when equal to ``cu_seqlens_*``. Default False: they are left out when equal, as Bridge's own packing
            does, so Transformer Engine takes its unpadded path.
    """
    if position_ids not in ("mrope", "flat"):
        raise ConfigError("position_ids", f"unknown mode {position_ids!r}", "use 'mrope' or 'flat'")
    _require_thd_row(batch)
    if batch["input_ids"].dim() != 2 or batch["input_ids"].shape[0] != 1:
        raise ValueError(f"Bridge's packed VLM step needs one THD row [1, T], got {tuple(batch['input_ids'].shape)}")
    if batch.get("visual_pixel_values") is not None:
        raise ConfigError(
            "static_visual",
            "the batch holds static (padded, token-ordered) vision rows; Bridge's vision "
            "models read pixel_values/grid_thw and pad for their own CUDA graphs",
            "build the encoder with static_visual=False",
        )
    for key in ("pixel_values", "pixel_values_videos"):
        pixels = batch.get(key)
        if isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8:
            raise ConfigError(
                "pixel_dtype",
                f"{key} is uint8: Bridge's step feeds it to the vision model as raw 0..255 values",
                "use pixel_dtype 'float32' or 'bfloat16' with Megatron-Bridge",
            )
    cls = visual_inputs_cls or bridge_visual_inputs_class()
    visual = cls(**{k: batch.get(k) for k in VISUAL_KEYS})
    mrope = batch.get("mrope_position_ids")
    out = {
        "input_ids": batch["input_ids"],
        "position_ids": mrope if position_ids == "mrope" and mrope is not None else batch["position_ids"],
        "labels": batch["labels"],
        "loss_mask": batch["loss_mask"],
        "attention_mask": None,
        "visual_inputs": visual,
        "cu_seqlens_q": batch["cu_seqlens_q"],
        "cu_seqlens_kv": batch.get("cu_seqlens_kv", batch["cu_seqlens_q"]),
        "cu_seqlens_q_padded": batch.get("cu_seqlens_q_padded"),
        "cu_seqlens_kv_padded": batch.get("cu_seqlens_kv_padded", batch.get("cu_seqlens_q_padded")),
        "max_seqlen_q": batch["max_seqlen_q"],
        "max_seqlen_kv": batch.get("max_seqlen_kv", batch["max_seqlen_q"]),
        "total_tokens": batch.get("total_tokens", int(batch["input_ids"].shape[1])),
    }
    if out["cu_seqlens_q_padded"] is None:  # Bridge: absent when equal to the logical boundaries
        del out["cu_seqlens_q_padded"], out["cu_seqlens_kv_padded"]
    without_equal_padded_boundaries(out, static_cu=static_cu)
    for key in METADATA_KEYS:
        if key in batch:
            out[key] = batch[key]
    return out


#: What :func:`to_gpt_batch` emits for Bridge's GPT step (statistics keys ride along; the step drops them).
GPT_BATCH_KEYS = (
    "tokens",
    "labels",
    "loss_mask",
    "position_ids",
    "attention_mask",
    *PACKED_SEQ_KEYS,
    "padding_mask",
    "total_tokens",
)
#: Bridge <= 0.5's names of the packed metadata (:func:`to_gpt_batch`).
LEGACY_KEYS = ("cu_seqlens", "cu_seqlens_argmin", "cu_seqlens_unpadded", "cu_seqlens_unpadded_argmin", "max_seqlen")
_STAT_KEYS = ("real_tokens", "supervised_tokens", "num_segments", "padding_segments", "packing_stats", "__keys__")


def _require_thd_row(batch: dict) -> None:
    missing = [k for k in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens_q") if k not in batch]
    if missing:
        raise ValueError(f"not a packed THD batch: missing {missing}")


def to_gpt_batch(batch: dict, *, legacy_keys: bool = True, static_cu: bool = False) -> dict:
    """Our THD row (docs/concepts/batch_contract.md) -> the dict Bridge's GPT step reads (tensors not copied).

    ``legacy_keys`` adds :data:`LEGACY_KEYS`, what Bridge <= 0.5 reads (``cu_seqlens`` physical and
    ``cu_seqlens_unpadded`` logical [1, n+1] with their host ``_argmin`` lengths, ``max_seqlen``);
    Bridge >= 0.6 reads the ``cu_seqlens_q`` family when present and sets these to None. ``cu_seqlens_*_padded``
    are left out when equal to ``cu_seqlens_*`` unless ``static_cu`` (the ``pad_cu_seqlens`` path), as Bridge's
    own packing does; by the same rule ``cu_seqlens_unpadded`` and its ``_argmin``: Bridge <= 0.5's
    ``get_packed_seq_params`` takes Transformer Engine's slower padded THD path whenever ``cu_seqlens_unpadded``
    is present, and its own collate emits it only when segments are padded (``pad_seq_to_mult > 1``).
    """
    _require_thd_row(batch)
    out = {"tokens": batch["input_ids"], "attention_mask": None}
    out.update({k: batch[k] for k in GPT_BATCH_KEYS if k in batch and k not in out})
    if legacy_keys:
        logical = batch["cu_seqlens_q"]
        padded = batch.get("cu_seqlens_q_padded", logical)
        count = torch.tensor(padded.numel(), dtype=torch.int64)
        out.update(cu_seqlens=padded.unsqueeze(0), cu_seqlens_argmin=count, max_seqlen=batch["max_seqlen_q"])
        if static_cu or not torch.equal(padded, logical):
            out.update(cu_seqlens_unpadded=logical.unsqueeze(0), cu_seqlens_unpadded_argmin=count)
    out.update({k: batch[k] for k in _STAT_KEYS if k in batch})
    return without_equal_padded_boundaries(out, static_cu=static_cu)
