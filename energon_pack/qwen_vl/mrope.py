"""3-D (t, h, w) M-RoPE position ids for one Qwen-VL sample, shape [3, L].

Follows ``get_rope_index`` of the installed transformers (5.x) for each version:

* text tokens: the same value on all three axes, counting on from the current position;
* a vision block (a maximal run of ``<|image_pad|>`` or ``<|video_pad|>``) with LLM grid
  (t, h/merge, w/merge) gets t/h/w offsets added to the current position; the next text starts
  at current + max(h, w)/merge (``resume="spatial"``, transformers 5.x). ``resume="max"`` gives
  the older rule (max position of the block + 1), which differs only for videos whose temporal
  index exceeds their spatial extent;
* Qwen2-VL: temporal index = frame-group index; images t = 0.
* Qwen2.5-VL: video temporal index = floor(t * second_per_grid_t * tokens_per_second); images t = 0.
* Qwen3-VL: video grids are split per temporal step (each step is its own block after its
  timestamp text) and every block has t = 0; time is carried by the timestamp text.

Every sample starts at position 0, so per-segment positions concatenate directly into a packed
THD row ([3, T]).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .presets import VisionPreset


def mrope_position_ids(
    input_ids: torch.Tensor | Sequence[int],
    image_grid_thw: torch.Tensor | Sequence | None,
    video_grid_thw: torch.Tensor | Sequence | None,
    second_per_grid_ts: Sequence[float] | None,
    *,
    preset: VisionPreset,
    image_pad_id: int,
    video_pad_id: int,
    resume: str = "spatial",
) -> torch.Tensor:
    """int64 [3, L] positions for one sample (``input_ids`` 1-D)."""
    if resume not in ("spatial", "max"):
        raise ValueError(f"resume must be 'spatial' or 'max', got {resume!r}")
    ids = torch.as_tensor(input_ids, dtype=torch.int64).reshape(-1)
    length = ids.numel()
    merge = preset.merge_size
    images = [tuple(int(x) for x in g) for g in (image_grid_thw if image_grid_thw is not None else [])]
    videos = [tuple(int(x) for x in g) for g in (video_grid_thw if video_grid_thw is not None else [])]
    spg = list(second_per_grid_ts) if second_per_grid_ts is not None else [1.0] * len(videos)
    video_blocks: list[tuple[tuple[int, int, int], float]] = []
    for g, s in zip(videos, spg + [1.0] * (len(videos) - len(spg))):
        if preset.rope_style == "qwen3":
            video_blocks.extend([((1, g[1], g[2]), 0.0)] * g[0])
        else:
            scale = preset.tokens_per_second * s if preset.rope_style == "qwen2.5" else 1.0
            video_blocks.append((g, scale))

    types = torch.zeros(length, dtype=torch.int64)
    types[ids == image_pad_id] = 1
    types[ids == video_pad_id] = 2
    out = torch.empty(3, length, dtype=torch.int64)
    if length == 0:
        return out
    change = torch.nonzero(types[1:] != types[:-1]).reshape(-1) + 1
    bounds = [0, *change.tolist(), length]
    cur = 0
    img_i = vid_i = 0
    for start, end in zip(bounds[:-1], bounds[1:]):
        kind = int(types[start])
        if kind == 0:
            out[:, start:end] = torch.arange(cur, cur + end - start)
            cur += end - start
            continue
        if kind == 1:
            if img_i >= len(images):
                raise ValueError("more image blocks in input_ids than image grids")
            (t, h, w), interval = images[img_i], 1.0
            img_i += 1
        else:
            if vid_i >= len(video_blocks):
                raise ValueError("more video blocks in input_ids than video grids")
            (t, h, w), interval = video_blocks[vid_i]
            vid_i += 1
        lh, lw = h // merge, w // merge
        if t * lh * lw != end - start:
            raise ValueError(f"vision block of {end - start} tokens does not match grid {(t, h, w)}")
        tt = (torch.arange(t, dtype=torch.float64) * interval).long() if kind == 2 else torch.arange(t) * 0
        pos_t = tt.view(-1, 1, 1).expand(t, lh, lw) + cur
        pos_h = torch.arange(lh).view(1, -1, 1).expand(t, lh, lw) + cur
        pos_w = torch.arange(lw).view(1, 1, -1).expand(t, lh, lw) + cur
        block = torch.stack([pos_t, pos_h, pos_w]).reshape(3, -1)
        out[:, start:end] = block
        cur = int(block.max()) + 1 if resume == "max" else cur + max(lh, lw)
    if img_i != len(images) or vid_i != len(video_blocks):
        raise ValueError("fewer vision blocks in input_ids than grids")
    return out
