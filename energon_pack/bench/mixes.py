"""Seeded synthetic sample-cost mixes that mimic finetuning data, for packing benchmarks.

Each mix returns an int64 cost array: shape (n, 1) (LLM tokens) for text mixes, (n, 2)
(LLM tokens, media items) for the VLM mix, which packs under a media budget too.
"""

from __future__ import annotations

import numpy as np


def lognormal_text(n: int, width: int, seed: int = 0) -> np.ndarray:
    """Text chat samples: log-normal tokens, median ~350, p99 ~1.5K."""
    rng = np.random.default_rng(seed)
    tokens = rng.lognormal(np.log(350), 0.63, n).round().clip(8, width)
    return tokens[:, None].astype(np.int64)


def vlm_bimodal(n: int, width: int, seed: int = 0) -> np.ndarray:
    """A VLM mix: 40% text-only chats; 60% with one to three images of 256-1280 tokens each."""
    rng = np.random.default_rng(seed)
    text = rng.lognormal(np.log(180), 0.7, n).round().clip(8, None)
    images = np.where(rng.random(n) < 0.4, 0, rng.choice([1, 1, 1, 2, 3], n))
    image_tokens = np.array([rng.integers(256, 1281, k).sum() for k in images])
    tokens = (text + image_tokens).clip(8, width)
    return np.stack([tokens, images], axis=1).astype(np.int64)


def heavy_tail(n: int, width: int, seed: int = 0) -> np.ndarray:
    """Mostly short samples plus 8% long documents of 2K tokens up to the full width."""
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(220), 0.8, n)
    long = rng.uniform(2000, width, n)
    tokens = np.where(rng.random(n) < 0.08, long, short).round().clip(8, width)
    return tokens[:, None].astype(np.int64)


MIXES = {"lognormal": lognormal_text, "vlm": vlm_bimodal, "heavy_tail": heavy_tail}


#: photo sizes of LLaVA-style instruction data (COCO, VG, TextVQA, ... at their own resolution)
PHOTO_SIZES = ((640, 480), (500, 375), (480, 640), (640, 427), (612, 612), (1024, 768), (336, 336), (800, 600))


def llava_photos(n: int, width: int, seed: int = 0) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """A held-out-like VLM mix as (tokens, vision grids) per sample: 85% with one to three photos at their own
    size (scaled 0.6-1.4x, Qwen2.5-VL's 28-pixel merged patches) plus log-normal text (median 160 tokens), 15%
    text-only chats (log-normal, median 500). Grids are (t, h, w) in 14-pixel patches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            out.append((int(np.clip(rng.lognormal(np.log(500), 0.9), 16, width)), []))
            continue
        grids, image_tokens = [], 0
        for _ in range(1 if r < 0.9 else int(rng.integers(2, 4))):
            w, h = PHOTO_SIZES[rng.integers(len(PHOTO_SIZES))]
            scale = rng.uniform(0.6, 1.4)
            gh, gw = max(2, round(h * scale / 28) * 2), max(2, round(w * scale / 28) * 2)
            grids.append((1, gh, gw))
            image_tokens += gh * gw // 4
        text = int(np.clip(rng.lognormal(np.log(160), 0.8), 8, None))
        out.append((min(width, text + image_tokens), grids))
    return out


def hires_mix(n: int, width: int, seed: int = 0) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """A harder held-out-like VLM mix (tokens, vision grids) with the tails of OneVision-style data: 40% text-only
    chats (log-normal, median 300, some multi-turn ones past 4K), 45% one image, 10% two to four, 5% a short clip
    (4-16 frames of 320-640 px). Image sides are log-uniform in 200-1400 px (aspect 0.5-2: photos, charts, document
    pages at native resolution); every image carries log-normal text (median 120). Grids in 14-pixel patches."""
    rng = np.random.default_rng(seed)

    def grid(t: int, side: float, aspect: float) -> tuple[int, int, int]:
        h, w = side * aspect**0.5, side / aspect**0.5
        return (t, max(2, round(h / 28) * 2), max(2, round(w / 28) * 2))

    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            out.append((int(np.clip(rng.lognormal(np.log(300), 1.1), 16, width)), []))
            continue
        if r < 0.95:
            count = 1 if r < 0.85 else int(rng.integers(2, 5))
            grids = [
                grid(1, np.exp(rng.uniform(np.log(200), np.log(1400))), np.exp(rng.uniform(-0.7, 0.7)))
                for _ in range(count)
            ]
        else:
            grids = [grid(int(rng.integers(2, 9)), rng.uniform(320, 640), 16 / 9)]
        text = int(np.clip(rng.lognormal(np.log(120), 0.9), 8, None))
        out.append((text + sum(t * h * w // 4 for t, h, w in grids), grids))
    return out
