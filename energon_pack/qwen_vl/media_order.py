"""The images and videos of a packed row in the order their tokens appear, and where each one's pixel rows lie.

A pack keeps its images' pixel rows in ``pixel_values`` and its videos' in ``pixel_values_videos``, each in token
order within its kind. A consumer that runs both kinds through the vision tower as one stream (static packs,
:mod:`energon_pack.qwen_vl.static_visual`; one tower call per step, :func:`energon_pack.integrations.hf.
hf_forward_kwargs`) needs the two interleaved as the tokens are: the features then fill the image and video tokens
in one ``masked_scatter``.
"""

from __future__ import annotations

import torch

__all__ = ["media_in_token_order", "media_row_spans"]


def media_in_token_order(
    input_ids: torch.Tensor,
    image_grid: torch.Tensor | None,
    video_grid: torch.Tensor | None,
    image_pad: int,
    video_pad: int,
    merge: int,
) -> list[tuple[str, int]]:
    """``[("image" | "video", index)]`` in the order the media's tokens appear in ``input_ids``.

    Walks the image/video pad tokens: the kind of the next one says which list's next item comes, and
    that item's ``t*h*w / merge**2`` tokens are consumed (a Qwen3-VL video's frames are several runs).
    Raises ``ValueError`` where the tokens and the grids disagree."""
    ids = input_ids.reshape(-1)
    kinds = ids[(ids == image_pad) | (ids == video_pad)] == video_pad
    grids = {False: image_grid, True: video_grid}
    nxt = {False: 0, True: 0}
    order, pos, total = [], 0, int(kinds.numel())
    while pos < total:
        kind = bool(kinds[pos])
        grid = grids[kind]
        if grid is None or nxt[kind] >= len(grid):
            raise ValueError(
                f"more {'video' if kind else 'image'} tokens than {'video' if kind else 'image'}_grid_thw entries"
            )
        order.append(("video" if kind else "image", nxt[kind]))
        pos += int(grid[nxt[kind]].prod()) // (merge * merge)
        nxt[kind] += 1
    for kind, grid in grids.items():
        if grid is not None and nxt[kind] != len(grid):
            raise ValueError("visual tokens and *_grid_thw entries disagree")
    return order


def media_row_spans(
    input_ids: torch.Tensor,
    image_grid: torch.Tensor | None,
    video_grid: torch.Tensor | None,
    image_pad: int,
    video_pad: int,
    merge: int,
) -> list[tuple[str, int, int, int]]:
    """``[(kind, index, first row, end row)]`` in token order (:func:`media_in_token_order`): each medium's pixel
    rows in its kind's tensor (``pixel_values`` for ``"image"``, ``pixel_values_videos`` for ``"video"``)."""
    starts = {kind: _row_starts(grid) for kind, grid in (("image", image_grid), ("video", video_grid))}
    order = media_in_token_order(input_ids, image_grid, video_grid, image_pad, video_pad, merge)
    return [(kind, i, int(starts[kind][i]), int(starts[kind][i + 1])) for kind, i in order]


def _row_starts(grid: torch.Tensor | None) -> list[int] | None:
    if grid is None:
        return None
    return [0, *grid.to(torch.int64).prod(-1).cumsum(0).tolist()]
