"""One explicit step that readies a HF model for our packs: :func:`prepare_model`.

Everything our packed rows need on the model itself is installed here, once, and recorded on the model: the
vision tower guards (:func:`~.attention.guard_vision_towers`), the varlen attention
(:func:`~.attention.use_varlen_attention`) and the static-visual hooks (:func:`~.static_visual.use_static_visual`).
The forward kwargs (:func:`~.batch.hf_forward_kwargs`, :func:`~.batch.packed_forward`) only read the model;
for callers written before :func:`prepare_model` existed they still prepare an unprepared model once, with a
``DeprecationWarning`` (:func:`ensure_prepared`), so nothing trains differently.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from energon_pack.errors import ConfigError
from energon_pack.integrations.hf.attention import VARLEN_ATTENTION, guard_vision_towers, use_varlen_attention
from energon_pack.integrations.hf.static_visual import use_static_visual
from energon_pack.integrations.hf.version import check_transformers_version

__all__ = ["prepare_model"]

#: The attribute of a prepared model that holds its :class:`_Prepared` record.
PREPARED_ATTR = "_energon_pack_prepared"


@dataclass(frozen=True)
class _Prepared:
    """What has been installed on a model: the static-visual hooks or not, and whether :func:`prepare_model`
    was called (``explicit``) or the deprecated path of the forward kwargs did it."""

    static_visual: bool
    explicit: bool


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)  # DDP / FSDP wrappers


def _install(model: torch.nn.Module, *, attention: str | None, static_visual: bool, explicit: bool) -> None:
    if attention is not None:
        use_varlen_attention(model, attention)
    guard_vision_towers(model)
    vision_language = getattr(getattr(model, "config", None), "vision_config", None) is not None
    if static_visual and vision_language:
        use_static_visual(model)
    before = getattr(model, PREPARED_ATTR, None)
    setattr(
        model,
        PREPARED_ATTR,
        _Prepared(
            static_visual=(static_visual and vision_language) or (before is not None and before.static_visual),
            explicit=explicit or (before is not None and before.explicit),
        ),
    )


def prepare_model(model: Any, *, attention: str | None = VARLEN_ATTENTION, static_visual: bool = True) -> Any:
    """Install on ``model`` every hook and the attention our packed rows need, and mark it prepared.

    Call it once after building (or loading) the model and before ``torch.compile`` / DDP; calling it again
    is harmless (each piece is installed once; the attention is set again, so a caller that switched it in
    between gets it back). Installed hooks stay: ``static_visual=False`` installs none but removes none.

    Args:
        model: a HF Qwen2-VL / Qwen2.5-VL / Qwen3-VL model or a text-only LLM; a DDP / FSDP wrapper prepares
            its ``.module``.
        attention: the name under which our varlen attention is registered and set on the model and every
            sub-model (it must contain "flash", see :data:`~.attention.VARLEN_ATTENTION`); ``None`` keeps the
            model's own attention implementation (HF's sdpa / flash_attention_2 read the packing from the
            positions and ``cu_seq_lens_q/_k``).
        static_visual: install the forward pre-hooks that take static-visual packs (inert on other batches;
            Qwen-VL models only).

    Returns the ``model`` given. Raises :class:`ConfigError` for a transformers release outside the supported
    range, or where ``model`` is not a torch module.
    """
    inner = _unwrap(model)
    if not isinstance(inner, torch.nn.Module):
        raise ConfigError(
            "model",
            f"prepare_model takes a torch module, got {type(inner).__name__}",
            "pass the HF model (or its DDP / FSDP wrapper)",
        )
    check_transformers_version()
    _install(inner, attention=attention, static_visual=static_visual, explicit=True)
    return model


def ensure_prepared(model: Any, *, static_visual: bool, stacklevel: int) -> None:
    """The forward kwargs' check (internal): ``model`` has what a batch (static-visual or not) needs.

    A model :func:`prepare_model` never saw is prepared here with the model's own attention and the hooks this
    batch needs, with a ``DeprecationWarning`` (``stacklevel`` as the calling function would pass it to
    ``warnings.warn``);
    one that :func:`prepare_model` prepared without the static-visual hooks gets a :class:`ConfigError` for a
    static-visual batch. Configs and other non-modules are left alone.
    """
    inner = _unwrap(model)
    if not isinstance(inner, torch.nn.Module):
        return
    state = getattr(inner, PREPARED_ATTR, None)
    if state is not None and (state.static_visual or not static_visual):
        return
    if state is not None and state.explicit:
        raise ConfigError(
            "static_visual",
            "a static-visual batch reached a model prepared with static_visual=False",
            "call prepare_model(model) (static_visual=True installs the hooks static packs need)",
        )
    installed = "the vision tower guards" + (" and the static-visual hooks" if static_visual else "")
    warnings.warn(
        f"installing {installed} on a model from the forward kwargs is deprecated: call "
        "energon_pack.integrations.hf.prepare_model(model) (or energon_pack.prepare_model) once before "
        "training (attention=None keeps the model's attention implementation)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    _install(inner, attention=None, static_visual=static_visual, explicit=False)
