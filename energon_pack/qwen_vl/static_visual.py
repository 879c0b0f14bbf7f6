"""Static-shape visual rows: every pack's patch rows (images and videos) in one tensor of a fixed budget.

With ``static_visual=True`` the task encoder replaces a pack's ``pixel_values`` / ``pixel_values_videos``
by ``visual_pixel_values`` [budget, C*tp*p*p]: the rows of every image and video *in the order their
tokens appear in the row* (so one ``masked_scatter`` over the image and video tokens places them), then
zero rows up to the budget (``max_patches_per_pack``). ``visual_grid_thw`` lists the real media in the
same order. The padding is a separate stretch of the vision tower's input: it is cut into its own
attention segments (:func:`pad_segments`), its features are never scattered into the LLM row, so it
changes no real token's output and gets no gradient but zero. The consumer (HF:
:mod:`energon_pack.integrations.hf`) builds fixed-length vision cu_seqlens from these keys.
"""

from __future__ import annotations

import torch

from .media_order import media_row_spans

#: Batch keys of a static pack's vision input (the contract's pixel keys are None then).
STATIC_PIXELS_KEY = "visual_pixel_values"
STATIC_GRID_KEY = "visual_grid_thw"
#: The longest attention segment a frame of this preset can be (patches), pinned as the tower's max_seqlen.
STATIC_MAX_FRAME_KEY = "visual_max_frame_patches"
#: The most frames (full-attention segments: one per image, t per video) a pack may hold (a packer budget).
STATIC_FRAMES_KEY = "visual_max_frames"

__all__ = [
    "STATIC_FRAMES_KEY",
    "STATIC_GRID_KEY",
    "STATIC_MAX_FRAME_KEY",
    "STATIC_PIXELS_KEY",
    "full_segment_count",
    "pad_segments",
    "static_segment_count",
    "static_visual_rows",
]


def static_visual_rows(
    batch: dict,
    budget: int,
    *,
    image_pad: int,
    video_pad: int,
    merge: int,
    max_frame_patches: int,
    max_frames: int,
    row_width: int,
    dtype: torch.dtype,
) -> dict:
    """``batch`` with its pixel rows moved into ``visual_pixel_values`` [budget, row] (token order, zero
    padded) and ``visual_grid_thw`` (real media, same order); ``pixel_values`` / ``pixel_values_videos``
    become None. Raises when the rows exceed ``budget`` (the packer's patch budget prevents it)."""
    image_grid, video_grid = batch.get("image_grid_thw"), batch.get("video_grid_thw")
    sources = {"image": batch.get("pixel_values"), "video": batch.get("pixel_values_videos")}
    spans = media_row_spans(batch["input_ids"], image_grid, video_grid, image_pad, video_pad, merge)
    used = sum(hi - lo for *_, lo, hi in spans)
    if used > budget:
        raise ValueError(f"{used} patch rows exceed the static budget {budget} (max_patches_per_pack)")
    out = torch.zeros((budget, row_width), dtype=dtype)
    grids, at = [], 0
    for kind, i, lo, hi in spans:
        out[at : at + hi - lo] = sources[kind][lo:hi]
        at += hi - lo
        grids.append((image_grid if kind == "image" else video_grid)[i])
    batch = dict(batch)
    batch.update(
        {
            "pixel_values": None,
            "pixel_values_videos": None,
            STATIC_PIXELS_KEY: out,
            STATIC_GRID_KEY: torch.stack(grids).to(torch.int64) if grids else torch.zeros((0, 3), dtype=torch.int64),
            STATIC_MAX_FRAME_KEY: int(min(budget, max_frame_patches)),
            STATIC_FRAMES_KEY: int(max_frames),
        }
    )
    return batch


def static_segment_count(budget: int, merge: int) -> int:
    """Entries of a static window cu_seqlens: every window and padding chunk holds at least one merged token
    (``merge**2`` rows), so a budget of B rows has at most ``B / merge**2`` segments."""
    return budget // (merge * merge) + 1


def full_segment_count(budget: int, frames: int, max_frame: int) -> int:
    """Entries of a static full-attention cu_seqlens: at most ``frames`` real frames (the packer's frame
    budget) and the padding in chunks of ``max_frame`` rows."""
    return frames + -(-budget // max_frame) + 1


def pad_segments(cu: torch.Tensor, budget: int, chunk: int, merge: int, size: int | None = None) -> torch.Tensor:
    """``cu`` (real boundaries) + the padding rows cut into chunks of at most ``chunk`` rows (multiples
    of ``merge**2``), then repeated last values up to ``size`` entries (:func:`static_segment_count`)."""
    cu = [int(v) for v in cu.tolist()] or [0]
    step = max(merge * merge, chunk // (merge * merge) * merge * merge)
    while cu[-1] < budget:
        cu.append(min(budget, cu[-1] + step))
    size = size or static_segment_count(budget, merge)
    if len(cu) > size:
        raise ValueError(f"{len(cu) - 1} vision segments exceed the static count {size - 1}")
    return torch.tensor(cu + [cu[-1]] * (size - len(cu)), dtype=torch.int32)
