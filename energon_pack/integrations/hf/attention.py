"""The varlen attention: attention inside each cu_seqlens segment of one packed row, for HF's ``AttentionInterface``.

:func:`varlen_attention_forward` runs PyTorch's ``varlen_attn`` (flash) on CUDA in fp16/bf16 and otherwise SDPA
on each segment's own slice (memory O(longest segment^2), not O(T^2): a CPU step at width 8192 stays small); under
``torch.compile`` one SDPA under a block-diagonal mask, whose shapes do not depend on the segments.
Its registered name (:data:`VARLEN_ATTENTION`) contains "flash", so the vision towers hand it their own
(window/full) cu_seqlens instead of looping over images: where they call ``is_flash_attention_requested`` (5.x)
any "flash" name gets them in one call; where they test ``== "flash_attention_2"`` (4.57) they call it once per
image (or window) without cu_seqlens, which it takes as one segment (the same numbers, more calls).
:func:`guard_vision_towers` keeps the text model's varlen kwargs away from the towers on releases whose VL forward
hands its ``**kwargs`` on to them (a TypeError otherwise).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from energon_pack.errors import ConfigError
from energon_pack.integrations.hf.version import check_transformers_version

__all__ = [
    "VARLEN_ATTENTION",
    "guard_vision_towers",
    "register_varlen_attention",
    "use_varlen_attention",
    "varlen_attention_forward",
]

#: Name under which :func:`varlen_attention_forward` is registered. It must contain "flash":
#: HF's Qwen-VL vision attention (transformers 5.x) checks ``"flash" in config._attn_implementation``
#: (``is_flash_attention_requested``) and only then passes ``cu_seq_lens_q/_k`` and
#: ``is_causal=False`` to the attention function (otherwise it loops over images). 4.57's checks
#: ``== "flash_attention_2"``, so there the towers loop over images (windows) for this name too.
VARLEN_ATTENTION = "energon_pack_flash_varlen"
#: What the text model's flash attention reads; never meant for a vision tower.
_TEXT_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


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
    them, the hook finds nothing to drop. :func:`~energon_pack.integrations.hf.prepare_model` and
    :func:`use_varlen_attention` call it.
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


def _segments_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """cu_seqlens (int32) of one row whose positions restart at 0 in every segment."""
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).reshape(-1)
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    return torch.cat([starts, starts.new_tensor([pos.numel()])]).to(torch.int32)


def _per_segment_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: torch.Tensor,
    *,
    causal: bool,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """SDPA on each cu segment's own slice, concatenated: ``(1, T, heads, head_dim)``.

    The same numbers as one SDPA under the block-diagonal mask, but memory O(longest segment^2)
    instead of O(T^2) (a dense T x T mask at width 8192 is 64 M entries per call, plus SDPA's own
    T x T scores) and no work on the masked-out blocks. Segments without tokens are skipped.
    """
    bounds = cu.tolist()  # one host read per call (the fallback path: CPU, or CUDA in fp32)
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    gqa = query.shape[1] != key.shape[1]
    # split, not slices: its backward is one cat of the segments' gradients (a slice's is a zero-filled
    # copy of the whole row per segment: O(segments x T) work, slow for the vision towers' many windows)
    outs = [
        F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal, scale=scaling, enable_gqa=gqa)
        for q, k, v, n in zip(query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2), lengths)
        if n > 0
    ]
    if len(outs) == 1:
        return outs[0].transpose(1, 2).contiguous()
    return torch.cat([o.transpose(1, 2) for o in outs or [query[:, :, :0]]], dim=1)  # one copy, contiguous


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
        raise ConfigError(
            "attn_implementation",
            f"{VARLEN_ATTENTION} supports neither sliding windows nor softcap",
            "use flash_attention_2 or sdpa for such models",
        )
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
        raise ConfigError(
            "micro_batch_size",
            f"{VARLEN_ATTENTION} expects one packed row, got batch {batch}",
            "use micro-batch size 1 (THD)",
        )
    end_ok = cu_q.is_cuda or int(cu_q[-1]) == total  # device cu_seqlens: checked by hf_forward_kwargs
    if key.shape[2] != total or not end_ok or not _same_segments(cu_q, cu_k):
        raise ConfigError(
            "cu_seq_lens_q",
            f"self-attention segments must cover the row of {total} tokens "
            f"(cu_q ends at {int(cu_q[-1])}, keys {key.shape[2]})",
            "pass the padded cu_seqlens of the batch (hf_forward_kwargs does) and use_cache=False",
        )
    if attention_mask is not None:
        raise ConfigError(
            "attention_mask",
            f"{VARLEN_ATTENTION} takes its segments from cu_seqlens",
            "pass attention_mask=None (hf_forward_kwargs does)",
        )
    q, k, v = (t.transpose(1, 2)[0] for t in (query, key, value))  # (T, H, D)
    varlen_attn = _torch_varlen()
    flash_ok = (
        varlen_attn is not None
        and query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and (dropout == 0.0 or not module.training)
        and head_dim <= 256
    )
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
        on_device = cu_q.device == query.device and cu_q.dtype == torch.int32
        cu_dev = cu_q if on_device else cu_q.to(query.device, torch.int32)
        out = varlen_attn(q, k, v, cu_dev, cu_dev, max_q, max_q, scale=scaling, **extra)
        return out.unsqueeze(0), None
    dropout = dropout if module.training else 0.0
    if torch.compiler.is_compiling():
        # under torch.compile: one SDPA under the block-diagonal mask, whose shapes do not depend on the segments
        # (per-segment slices would make a graph per segment layout; static packs must compile once)
        mask = _block_mask(cu_q, total, causal, query.device)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=heads_q != heads_k
        )
        return out.transpose(1, 2).contiguous(), None
    return _per_segment_attention(query, key, value, cu_q, causal=causal, dropout=dropout, scaling=scaling), None


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
        configs.extend(
            getattr(config, key) for key in getattr(config, "sub_configs", {}) if getattr(config, key, None) is not None
        )
    return name
