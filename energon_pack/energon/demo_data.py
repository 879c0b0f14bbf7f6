"""A built-in demo dataset: ChatML WebDataset shards with a realistic VLM finetuning mix.

Multi-turn chats, one to three images of many sizes (and aspect ratios), text-only samples,
and a few broken samples on purpose (one of each kind every ``CORRUPT_EVERY`` samples) so
the skip accounting is visible: garbage image bytes, a truncated JPEG, broken JSON, a chat
with no assistant turn, a placeholder/image count mismatch, and an over-long sample.
Everything is seeded: the same arguments write the same bytes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

CORRUPT_EVERY = 97
CORRUPT_KINDS = ("garbage_image", "truncated_image", "bad_json", "no_assistant", "placeholder_mismatch", "overlong")
_WORDS = (
    "the image shows a cat dog person car street table window tree sky building sign chart graph text red blue "
    "green small large left right above below between count how many what where why describe explain answer "
    "question number value total first second third because therefore however model data train loss token "
    "pack buffer width sample batch worker rank epoch resume shard energon qwen vision language"
).split()


def _text(rng: np.random.Generator, median_words: float) -> str:
    n = max(1, int(rng.lognormal(np.log(median_words), 0.7)))
    words = rng.choice(_WORDS, n)
    return " ".join(words) + rng.choice([".", "?", "!"])


def _image(rng: np.random.Generator) -> bytes:
    """A small JPEG with a smooth pattern; side lengths from 32 to ~1400 px, varied aspect."""
    area = float(np.exp(rng.uniform(np.log(32 * 32), np.log(1000 * 900))))
    aspect = float(np.exp(rng.uniform(np.log(0.25), np.log(4.0))))
    w = int(np.clip(np.sqrt(area * aspect), 16, 2000))
    h = int(np.clip(np.sqrt(area / aspect), 16, 2000))
    y, x = np.mgrid[0:h, 0:w]
    c = rng.uniform(0, 1, 3)
    img = np.stack([(x / w * 255 * c[0]), (y / h * 255 * c[1]), ((x + y) % 64 * 4 * c[2])], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=70)
    return buf.getvalue()


def demo_sample(index: int, rng: np.random.Generator) -> dict:
    """One sample as webdataset fields (``json`` + ``0.jpg``, ``1.jpg``...)."""
    kind = (
        CORRUPT_KINDS[(index // CORRUPT_EVERY) % len(CORRUPT_KINDS)]
        if index % CORRUPT_EVERY == CORRUPT_EVERY - 1
        else None
    )
    num_images = 0 if rng.random() < 0.35 else int(rng.choice([1, 1, 1, 2, 3]))
    turns = int(rng.choice([1, 1, 2, 3, 4]))
    conversation = [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.3 else []
    for t in range(turns):
        prompt = _text(rng, 18)
        if t == 0 and num_images:
            prompt = "<image>\n" * num_images + prompt
        conversation.append({"role": "user", "content": prompt})
        conversation.append({"role": "assistant", "content": _text(rng, 40)})
    if rng.random() < 0.3:  # LLaVA shape for a share of the samples
        conversation = [
            {"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]), "value": m["content"]}
            for m in conversation
        ]
    images = [_image(rng) for _ in range(num_images)]
    if kind == "garbage_image":
        images = [bytes(rng.integers(0, 256, 512, dtype=np.uint8))]
        conversation = [{"role": "user", "content": "<image>\nwhat is it?"}, {"role": "assistant", "content": "noise."}]
    elif kind == "truncated_image":
        images = [_image(rng)[:300]]
        conversation = [{"role": "user", "content": "<image>\nwhat is it?"}, {"role": "assistant", "content": "cut."}]
    elif kind == "no_assistant":
        conversation = [{"role": "user", "content": _text(rng, 10)}]
        images = []
    elif kind == "placeholder_mismatch":
        conversation = [{"role": "user", "content": "<image>\n<image>\ntwo?"}, {"role": "assistant", "content": "one."}]
        images = [_image(rng)]
    elif kind == "overlong":
        conversation = [
            {"role": "user", "content": " ".join(["token"] * 12000)},
            {"role": "assistant", "content": "ok."},
        ]
        images = []
    raw = json.dumps({"conversations": conversation}).encode()
    if kind == "bad_json":
        raw = raw[: len(raw) // 2]
    fields = {"__key__": f"{index:07d}", "json": raw}
    for i, data in enumerate(images):
        fields[f"{i}.jpg"] = data
    return fields


def make_demo_shards(root: str | Path, samples: int = 1200, *, per_shard: int = 100, seed: int = 0) -> Path:
    """Write ``samples`` demo samples as ``root/demo-NNNNNN.tar`` and prepare them for Energon.

    Args:
        root: the local folder to write into (created if missing); the shards and their ``.nv-meta``
            index go there, so pass a new or empty folder (``energon-pack make-demo`` refuses any other).
        samples: how many samples to write, broken ones included (one every ``CORRUPT_EVERY`` = 97 samples;
            :func:`expected_skips` counts them by kind). Default 1200: twelve shards, enough for several
            8192-token packs per worker and a few of each broken kind.
        per_shard: samples per tar shard. Default 100: several shards per dataset, so loader workers and
            ranks each get shards of their own.
        seed: the seed of every random choice (texts, images, turns). Default 0: the same arguments write
            the same bytes, so tests and benchmarks see the same data.

    Returns:
        ``root`` as a :class:`~pathlib.Path`, ready for ``get_train_dataset``.
    """
    import webdataset as wds

    from .prepare import prepare_webdataset

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with wds.ShardWriter(str(root / "demo-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(samples):
            sink.write(demo_sample(i, rng))
    prepare_webdataset(root)
    return root


def expected_skips(samples: int) -> dict[str, int]:
    """How many broken samples of each kind ``make_demo_shards`` writes."""
    counts = {kind: 0 for kind in CORRUPT_KINDS}
    for i in range(samples):
        if i % CORRUPT_EVERY == CORRUPT_EVERY - 1:
            counts[CORRUPT_KINDS[(i // CORRUPT_EVERY) % len(CORRUPT_KINDS)]] += 1
    return counts
