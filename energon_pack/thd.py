"""Megatron-Core THD batch layout: alignment rules and the packed-row builder (see CONTRACT.md)."""

from __future__ import annotations

import math

import torch

IGNORE_INDEX = -100


def alignment_multiple(cp: int = 1, tp: int = 1, sp: bool = False, eval_cp: int | None = None) -> int:
    """Per-segment length multiple for context/sequence parallelism (Megatron-Bridge's lcm rule)."""
    multiple = 1
    for c in {cp} | ({eval_cp} if eval_cp is not None else set()):
        cp_multiple = 2 * c if c > 1 else 1
        sp_multiple = c * tp if sp and tp > 1 else 1
        multiple = math.lcm(multiple, cp_multiple, sp_multiple)
    return multiple


def aligned_length(length: int, multiple: int) -> int:
    """``length`` rounded up to ``multiple`` (the physical span a segment occupies in a pack)."""
    return -(-length // multiple) * multiple


def shifted_labels_and_loss_mask(
    input_ids: torch.Tensor, target_mask: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token labels shifted inside one segment, and the matching float loss mask.

    ``target_mask[i]`` says token ``i`` is supervised (should be predicted). Position ``i`` then
    predicts ``input_ids[i+1]`` when ``target_mask[i+1]``; the last position never predicts
    anything, so no label crosses a segment boundary.
    """
    if input_ids.dim() != 1 or target_mask.shape != input_ids.shape:
        raise ValueError("input_ids and target_mask must be 1-D tensors of the same length")
    ids = input_ids.to(torch.int64)
    supervised_next = torch.zeros_like(ids, dtype=torch.bool)
    supervised_next[:-1] = target_mask[1:].to(torch.bool)
    labels = torch.full_like(ids, ignore_index)
    labels[:-1] = ids[1:]
    labels = torch.where(supervised_next, labels, torch.full_like(labels, ignore_index))
    return labels, supervised_next.to(torch.float32)
