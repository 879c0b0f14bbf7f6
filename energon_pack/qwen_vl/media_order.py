"""The images and videos of a packed row in the order their tokens appear, and where each one's pixel rows lie.

A pack keeps its images' pixel rows in ``pixel_values`` and its videos' in ``pixel_values_videos``, each in token
order within its kind. A consumer that runs both kinds through the vision tower as one stream (static packs,
:mod:`energon_pack.qwen_vl.static_visual`; one tower call per step, :func:`energon_pack.integrations.hf.
hf_forward_kwargs`) needs the two interleaved as the tokens are: the features then fill the image and video tokens
in one ``masked_scatter``.
"""

from __future__ import annotations

import torch

__all__ = ["media_row_spans"]


def media_row_spans(
    input_ids: torch.Tensor,
    image_grid: torch.Tensor | None,
    video_grid: torch.Tensor | None,
    image_pad: int,
    video_pad: int,
    merge: int,
) -> list[tuple[str, int, int, int]]:
    """``[(kind, index, first row, end row)]`` in the order the media's tokens appear in ``input_ids``: each
    medium's kind (``"image"`` or ``"video"``), its index in that kind's grid, and its pixel rows in that kind's
    tensor (``pixel_values`` or ``pixel_values_videos``).

    Walks the image/video pad tokens: the kind of the next one says which list's next item comes, and that
    item's ``t*h*w / merge**2`` tokens are consumed (a Qwen3-VL video's frames are several runs). Raises
    ``ValueError`` where the tokens and the grids disagree."""
    ids = input_ids.reshape(-1)
    kinds = ids[(ids == image_pad) | (ids == video_pad)] == video_pad
    grids = {"image": image_grid, "video": video_grid}
    starts = {kind: _row_starts(grid) for kind, grid in grids.items()}
    nxt = {"image": 0, "video": 0}
    spans, pos, total = [], 0, int(kinds.numel())
    while pos < total:
        kind = "video" if bool(kinds[pos]) else "image"
        grid, i = grids[kind], nxt[kind]
        if grid is None or i >= len(grid):
            raise ValueError(f"more {kind} tokens than {kind}_grid_thw entries")
        spans.append((kind, i, starts[kind][i], starts[kind][i + 1]))
        pos += (starts[kind][i + 1] - starts[kind][i]) // (merge * merge)
        nxt[kind] += 1
    for kind, grid in grids.items():
        if grid is not None and nxt[kind] != len(grid):
            raise ValueError("visual tokens and *_grid_thw entries disagree")
    return spans


def _row_starts(grid: torch.Tensor | None) -> list[int] | None:
    if grid is None:
        return None
    return [0, *grid.to(torch.int64).prod(-1).cumsum(0).tolist()]
