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
