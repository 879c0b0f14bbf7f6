"""The training loss of a packed row: cross entropy on our pre-shifted labels, normalised over data-parallel ranks.

HF's own loss shifts the labels again; ours are already shifted (``labels[i]`` is the target at position i), so
:func:`packed_loss` sums the per-token loss over ``loss_mask`` and :func:`normalize_by_global_tokens` divides it by
the supervised tokens of all ranks (every token weighs the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from energon_pack.errors import ConfigError
from energon_pack.thd import IGNORE_INDEX

__all__ = ["global_token_count", "normalize_by_global_tokens", "packed_loss"]


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
    labels = labels.to(logits.device)
    loss_mask = loss_mask.to(logits.device, torch.float32)
    token_loss = F.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1).clamp(min=0), reduction="none")
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
