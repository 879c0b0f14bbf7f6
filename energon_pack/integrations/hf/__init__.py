"""Hugging Face transformers: run our packed THD rows through Qwen2-VL / Qwen2.5-VL / Qwen3-VL.

For transformers :data:`SUPPORTED_TRANSFORMERS` (``models/qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``; CI runs the
packed-vs-per-sample parity tests on 4.57.6, 5.12.1, 5.17.0 and 5.24.0). A training loop::

    prepare_model(model)                      # once: varlen attention, vision tower guards, static-visual hooks
    out = packed_forward(model, batch)        # model(**hf_forward_kwargs(batch, model=model, device=...))
    loss_sum, n_tokens = packed_loss(out.logits, batch)
    loss = normalize_by_global_tokens(loss_sum, n_tokens)

Without the ``T x vocab`` logits (5 GB in fp32 at 8192 tokens; chunked over the supervised tokens, each chunk
recomputed in the backward)::

    hidden = packed_hidden_states(model, batch)   # packed_forward with the LM head skipped
    loss_sum, n_tokens = packed_loss_from_hidden(hidden, model, batch)

One module per concern:

* :mod:`.model`: :func:`prepare_model`, the one call that installs on a model what our packs need.
* :mod:`.batch`: :func:`hf_forward_kwargs` / :func:`packed_forward` (a packed batch -> the ``forward`` kwargs),
  the release's video M-RoPE conventions, precomputed vision tensors and :func:`check_vision_preset`.
* :mod:`.attention`: :func:`varlen_attention_forward` for HF's ``AttentionInterface``
  (:func:`register_varlen_attention`, :func:`use_varlen_attention`) and :func:`guard_vision_towers`.
* :mod:`.static_visual`: static-visual packs (one shape per pack width: :func:`static_vision_kwargs`,
  :func:`place_visual_rows`, :func:`use_static_visual`).
* :mod:`.loss`: :func:`packed_loss` on our pre-shifted labels, :func:`packed_loss_from_hidden` (the same from the
  final hidden states of :func:`packed_hidden_states`, chunked) and :func:`normalize_by_global_tokens`.
* :mod:`.version`: :func:`check_transformers_version` and what the installed release's towers read.
* :mod:`.trainer`: ``transformers.Trainer`` / ``trl.SFTTrainer`` on our packs (:class:`~.trainer.PackedIterableDataset`,
  :class:`~.trainer.PackedCollator`, :class:`~.trainer.EnergonStateCallback`); loaded on first use of one of its names.

Older releases than :data:`SUPPORTED_TRANSFORMERS` get a :class:`~energon_pack.errors.ConfigError` from our entry
points; transformers is imported inside functions only, so importing this package costs nothing.
"""

from __future__ import annotations

from energon_pack.integrations.hf.attention import (
    VARLEN_ATTENTION,
    guard_vision_towers,
    register_varlen_attention,
    use_varlen_attention,
    varlen_attention_forward,
)
from energon_pack.integrations.hf.batch import (
    check_vision_preset,
    hf_forward_kwargs,
    mm_token_type_ids,
    mrope_conventions,
    packed_forward,
    vision_precomputed_kwargs,
)
from energon_pack.integrations.hf.loss import (
    LOSS_CHUNK_TOKENS,
    global_token_count,
    normalize_by_global_tokens,
    packed_hidden_states,
    packed_loss,
    packed_loss_from_hidden,
)
from energon_pack.integrations.hf.model import prepare_model
from energon_pack.integrations.hf.static_visual import place_visual_rows, static_vision_kwargs, use_static_visual
from energon_pack.integrations.hf.version import (
    SUPPORTED_TRANSFORMERS,
    check_transformers_version,
    vision_precompute_keys,
)
from energon_pack.lazy_exports import lazy_exports

#: the Trainer adapters import transformers at the top: loaded on first use (PEP 562)
_TRAINER_EXPORTS = {
    name: "energon_pack.integrations.hf.trainer"
    for name in (
        "SFT_SETTINGS",
        "TRAINER_SETTINGS",
        "EnergonStateCallback",
        "PackedCollator",
        "PackedDataCallback",
        "PackedIterableDataset",
        "check_trainer_args",
        "for_sft_trainer",
        "packed_trainer_loss",
        "steps_per_epoch",
        "supervised_positions",
        "trainer_labels",
        "trl_dataset",
    )
}
__getattr__, __dir__ = lazy_exports(__name__, _TRAINER_EXPORTS, globals())

__all__ = [
    "EnergonStateCallback",
    "LOSS_CHUNK_TOKENS",
    "PackedCollator",
    "PackedDataCallback",
    "PackedIterableDataset",
    "SFT_SETTINGS",
    "SUPPORTED_TRANSFORMERS",
    "TRAINER_SETTINGS",
    "VARLEN_ATTENTION",
    "check_trainer_args",
    "check_transformers_version",
    "check_vision_preset",
    "for_sft_trainer",
    "global_token_count",
    "guard_vision_towers",
    "hf_forward_kwargs",
    "mm_token_type_ids",
    "mrope_conventions",
    "normalize_by_global_tokens",
    "packed_forward",
    "packed_hidden_states",
    "packed_loss",
    "packed_loss_from_hidden",
    "packed_trainer_loss",
    "place_visual_rows",
    "prepare_model",
    "register_varlen_attention",
    "static_vision_kwargs",
    "steps_per_epoch",
    "supervised_positions",
    "trainer_labels",
    "trl_dataset",
    "use_static_visual",
    "use_varlen_attention",
    "varlen_attention_forward",
    "vision_precompute_keys",
    "vision_precomputed_kwargs",
]
