"""The training loss of a packed row: cross entropy on our pre-shifted labels, normalised over data-parallel ranks.

HF's own loss shifts the labels again; ours are already shifted (``labels[i]`` is the target at position i), so
:func:`packed_loss` sums the per-token loss over ``loss_mask`` and :func:`normalize_by_global_tokens` divides it by
the supervised tokens of all ranks (every token weighs the same).

:func:`packed_loss_from_hidden` is the same loss from the final hidden states and the LM head, chunk by chunk:
the ``T x vocab`` logits (5 GB in fp32 for 8192 tokens and Qwen-VL's 151,936 rows) never exist at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from energon_pack.errors import ConfigError
from energon_pack.thd import IGNORE_INDEX

__all__ = [
    "LOSS_CHUNK_TOKENS",
    "global_token_count",
    "normalize_by_global_tokens",
    "packed_hidden_states",
    "packed_loss",
    "packed_loss_from_hidden",
]

#: Tokens per chunk of :func:`packed_loss_from_hidden`: 512 x 151,936 fp32 logits are 311 MB, and a chunk's
#: backward holds about three such tensors (its recomputed log-softmax, their gradient, the logits' gradient).
LOSS_CHUNK_TOKENS = 512


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
        raise ConfigError(
            "logits",
            f"shape {tuple(logits.shape)} does not match labels {tuple(labels.shape)}",
            "pass the full logits of the packed row (logits_to_keep=0)",
        )
    # non_blocking: a blocking host-to-device copy would wait for the whole forward here (a device sync per step)
    labels = labels.to(logits.device, non_blocking=True)
    loss_mask = loss_mask.to(logits.device, torch.float32, non_blocking=True)
    token_loss = F.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1).clamp(min=0), reduction="none")
    weight = loss_mask.reshape(-1) * (labels.reshape(-1) != IGNORE_INDEX)
    loss = (token_loss * weight).sum()
    count = weight.sum()
    if num_supervised_tokens is not None:
        loss = loss / torch.as_tensor(num_supervised_tokens, dtype=loss.dtype, device=loss.device).clamp(min=1)
    return loss, count


def _output_layer(model: Any) -> torch.nn.Module:
    inner = getattr(model, "module", model)  # DDP / FSDP wrappers
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Module):
        raise ConfigError(
            "model",
            f"{type(inner).__name__} has no output layer (get_output_embeddings() is {type(head).__name__})",
            "pass a HF causal-LM / Qwen-VL model (or call its inner model and pass last_hidden_state yourself)",
        )
    return head


def _identity(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return hidden


@contextmanager
def _skipped(head: torch.nn.Module) -> Iterator[None]:
    """``head`` returns its input while inside (an instance ``forward``; its hooks still run)."""
    before = head.__dict__.get("forward")
    head.forward = _identity
    try:
        yield
    finally:
        if before is None:
            del head.forward
        else:
            head.forward = before


def packed_hidden_states(model: Any, batch: Mapping[str, Any], *, preset: Any = None, **extra: Any) -> torch.Tensor:
    """The final hidden states ``(1, T, hidden)`` of a packed row: :func:`~.batch.packed_forward` with the
    model's output layer skipped, so no ``T x vocab`` logits are computed. The input of
    :func:`packed_loss_from_hidden`.

    The same on every supported release and version (the model's ``lm_head`` input, after the last norm);
    ``output_hidden_states=True`` is not: 4.57's Qwen3-VL returns the last layer before its norm there, and
    4.57's Qwen2-VL ignores ``logits_to_keep`` and computes the full logits. ``model`` may be wrapped (DDP,
    FSDP): the wrapper runs, so gradients synchronise as usual (the head's weight gets its gradient from the
    loss). Under ``torch.compile`` of the whole model the switched head costs a recompile; run it eager.
    """
    from energon_pack.integrations.hf.batch import packed_forward

    with _skipped(_output_layer(model)):
        return packed_forward(model, batch, preset=preset, **extra).logits


def _chunk_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """Weighted cross-entropy sum of one chunk of tokens: logits in the head's dtype, the loss in fp32 (as
    :func:`packed_loss` on the model's logits)."""
    logits = F.linear(hidden.to(weight.dtype), weight, bias).float()
    return (F.cross_entropy(logits, labels, reduction="none") * scale).sum()


def packed_loss_from_hidden(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module | torch.Tensor,
    batch: Mapping[str, Any],
    num_supervised_tokens: int | float | torch.Tensor | None = None,
    *,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`packed_loss` of ``lm_head(hidden)`` without the full logits: the same ``(loss, local_count)``.

    ``hidden`` is the final hidden states of the packed row ``(1, T, hidden)`` (after the last norm: what the
    model's ``lm_head`` takes; :func:`packed_hidden_states`); ``lm_head`` the model (its
    ``get_output_embeddings()``, also through a DDP / FSDP wrapper), its output layer (``model.lm_head``, a
    ``Linear``) or that layer's ``(vocab, hidden)`` weight. Only the supervised tokens (``loss_mask`` non-zero,
    label not ignored) reach the head, ``chunk_tokens`` at a time; each chunk runs under activation
    checkpointing, so the backward recomputes one chunk's logits at a time instead of keeping all of them. Peak
    memory of the loss: about three ``chunk_tokens x vocab`` fp32 tensors, whatever the row width. On CUDA,
    selecting the supervised tokens reads their count once (one host sync per call).
    """
    if chunk_tokens < 1:
        raise ConfigError("chunk_tokens", f"must be at least 1, got {chunk_tokens}", "pass e.g. chunk_tokens=512")
    if isinstance(lm_head, torch.Tensor):
        weight, bias = lm_head, None
    else:
        head = lm_head if isinstance(lm_head, torch.nn.Linear) else _output_layer(lm_head)
        weight, bias = head.weight, head.bias
    labels, loss_mask = batch["labels"], batch["loss_mask"]
    if hidden.shape[:-1] != labels.shape or hidden.shape[-1] != weight.shape[-1]:
        raise ConfigError(
            "hidden",
            f"shape {tuple(hidden.shape)} does not match labels {tuple(labels.shape)} and the head's "
            f"input width {weight.shape[-1]}",
            "pass the final hidden states of the whole packed row (the input of lm_head)",
        )
    labels = labels.to(hidden.device).reshape(-1)
    scale = loss_mask.to(hidden.device, torch.float32).reshape(-1) * (labels != IGNORE_INDEX)
    keep = torch.nonzero(scale).reshape(-1)
    rows, targets, scale = hidden.reshape(-1, hidden.shape[-1])[keep], labels[keep], scale[keep]
    # an empty selection still reaches every input: zero gradients (DDP needs one for each parameter)
    inputs = [hidden, weight] + ([bias] if bias is not None else [])
    loss = sum(t.reshape(-1)[:0].sum().float() for t in inputs)
    for start in range(0, keep.numel(), chunk_tokens):
        end = start + chunk_tokens
        loss = loss + checkpoint(
            _chunk_loss, rows[start:end], weight, bias, targets[start:end], scale[start:end], use_reentrant=False
        )
    count = scale.sum()
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
