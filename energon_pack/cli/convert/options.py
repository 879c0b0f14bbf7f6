"""The knobs of one conversion: the accepted values, the media cap's default, and :class:`_Context`,
the frozen settings each worker process gets with its chunk."""

from __future__ import annotations

from dataclasses import dataclass

FORMATS = ("auto", "llava", "sharegpt", "messages", "alpaca", "parquet")
LAYOUTS = ("ours", "bridge")
VERIFY_MODES = ("header", "decode")
#: dedup: each distinct media file stored once (:mod:`.dedup`); inline: a copy in every record that uses it
MEDIA_STORES = ("dedup", "inline")
DEFAULT_MAX_MEDIA_MB = 64
#: the share of skipped records above which convert exits with status 2 (its output still whole)
DEFAULT_MAX_SKIPPED_SHARE = 0.1
#: whose video frame size ``--layout bridge`` stores sampled frames at (Bridge's Qwen2.5-VL recipes)
DEFAULT_BRIDGE_PRESET = "qwen2.5-vl"


@dataclass(frozen=True)
class _Context:
    """What a worker needs to turn records into samples (frozen: pickled with each chunk)."""

    image_root: str
    layout: str
    shape: str
    verify: str
    tmp_dir: str
    roots: tuple = ()  # resolved folders image paths may resolve into
    allow_outside: bool = False
    max_media_bytes: int = DEFAULT_MAX_MEDIA_MB << 20
    preset: str = DEFAULT_BRIDGE_PRESET  # the frame size of --layout bridge videos
    preference: str = "refuse"  # "chosen": a preference record is written as the SFT record of its chosen answer
    media_roots: tuple = ()  # folders a relative media path is looked up in, in order (:func:`.media.media_roots`)
    columns: tuple = ()  # LLaMA-Factory dataset_info.json: (its column, our field) renames (:mod:`.dataset_info`)
    tags: tuple = ()  # ... and its sharegpt tags, as (tag name, value) pairs
    media_store: str = "inline"  # "dedup": media go to the run's store by content hash, records reference them
