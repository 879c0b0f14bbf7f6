"""Read the records of a source in order, and turn one record into a WebDataset sample: its
conversation (checked by the loader's own rules on the very JSON written) and its media, per layout."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from collections.abc import Iterator
from typing import Any

from energon_pack.chat.conversation import (
    ALPACA_FIELDS,
    PROMPT_COMPLETION_FIELDS,
    alpaca_turns,
    check_conversation,
    chosen_as_sft,
    normalize_conversation,
    not_sft_reason,
    prompt_completion_turns,
)
from energon_pack.errors import SampleSkipped
from energon_pack.records import check_depth, decode_json_record, loads_checked

from .dataset_info import rename_columns
from .detect import _CONVERSATION_KEYS, _IMAGE_KEYS, _Source, iter_json_array
from .media import _read_media, _sniff, _sniff_video, sampled_jpeg_frames
from .options import _Context

_VIDEO_KEYS = ("videos", "video")
_IMAGE_PART_SOURCES = ("image", "image_url", "url", "path", "bytes")
_VIDEO_PART_SOURCES = ("video", "video_url", "url", "path", "bytes")


def _conversation_of(rec: dict, shape: str) -> tuple[str, Any]:
    keys = _CONVERSATION_KEYS if shape == "messages" else ("conversations", "conversation", "messages")
    for key in keys:
        if key in rec and rec[key] is not None:
            conv = rec[key]
            if isinstance(conv, (str, bytes, bytearray)):  # a JSON string in a column
                conv = loads_checked(conv.decode("utf-8") if isinstance(conv, (bytes, bytearray)) else conv)
            return key, conv
    if "instruction" in rec:  # alpaca: written as messages turns (its system among them)
        return "messages", alpaca_turns(rec)
    if all(k in rec for k in PROMPT_COMPLETION_FIELDS):  # TRL prompt/completion (KTO's too): written as messages
        return "messages", prompt_completion_turns(rec)
    if isinstance(rec.get("texts"), list):  # the_cauldron: [{"user", "assistant", "source"}]
        turns = []
        for t in rec["texts"]:
            if not isinstance(t, dict):
                raise SampleSkipped("bad_conversation", f"texts item is {type(t).__name__}, not a dict")
            if t.get("system"):
                turns.append({"role": "system", "content": t["system"]})
            if t.get("user") is not None:
                turns.append({"role": "user", "content": t["user"]})
            if t.get("assistant") is not None:
                turns.append({"role": "assistant", "content": t["assistant"]})
        return "messages", turns
    raise SampleSkipped(
        "no_conversation",
        f"no messages/conversations/conversation/texts/instruction/prompt+completion among keys {sorted(rec)[:12]}",
    )


def _split_media_parts(turns: Any) -> tuple[Any, list, list]:
    """Typed image / video parts with an inline source -> bare ``{"type": "image"}`` / ``{"type":
    "video"}`` parts; returns the new turns and the inline sources of each kind in order (None for a
    part without one)."""
    if not isinstance(turns, list):
        return turns, [], []
    sources: dict = {"image": [], "video": []}
    out = []
    for turn in turns:
        content = turn.get("content") if isinstance(turn, dict) else None
        if not isinstance(content, list):
            out.append(turn)
            continue
        parts = []
        for part in content:
            media = _media_kind(part)
            if media is None:
                parts.append(part)
                continue
            keys = _IMAGE_PART_SOURCES if media == "image" else _VIDEO_PART_SOURCES
            src = next((part[k] for k in keys if part.get(k) not in (None, "")), None)
            if isinstance(src, dict):  # {"image_url": {"url": ...}}
                src = src.get("url", src) if "url" in src else src
            sources[media].append(src)
            parts.append({"type": media, **{k: v for k, v in part.items() if k not in (*keys, "type")}})
        out.append({**turn, "content": parts})
    return out, sources["image"], sources["video"]


def _media_kind(part: Any) -> str | None:
    """ "image" / "video" for a typed (or untyped, keyed) media part, None for anything else."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    for media in ("image", "video"):
        if kind in (media, f"{media}_url") or (kind is None and any(k in part for k in (media, f"{media}_url"))):
            return media
    return None


def _media_refs(rec: dict, keys: tuple) -> list:
    """The record's top-level image (``keys`` = _IMAGE_KEYS) or video values, as a list."""
    for key in keys:
        value = rec.get(key)
        if value is None or (isinstance(value, str) and value == ""):
            continue
        return list(value) if isinstance(value, (list, tuple)) else [value]
    return []


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return f"<{len(obj)} bytes>"
    return str(obj)


def build_sample(
    rec: Any, key: str, ctx: _Context, found: Counter | None = None
) -> tuple[dict, int, int, int, int, bool]:
    """One record -> (webdataset fields, image count, image bytes, video count, video bytes, whether it holds tool
    calls or tools); SampleSkipped when unusable. With ``ctx.preference == "chosen"`` a preference record is written
    as the SFT record of its chosen answer (:func:`~energon_pack.chat.conversation.chosen_as_sft`), so the shards
    need no option when they are loaded. ``found`` counts the relative media paths found per media root; a
    LLaMA-Factory ``dataset_info.json`` entry's columns and tags (``ctx.columns`` / ``ctx.tags``) are read first."""
    if not isinstance(rec, dict):
        raise SampleSkipped("bad_record", f"record is a {type(rec).__name__}, not an object")
    check_depth(rec)
    if ctx.columns or ctx.tags:
        rec = rename_columns(rec, ctx.columns, ctx.tags)
    if ctx.preference == "chosen":
        rec = chosen_as_sft(rec)
    skip = not_sft_reason(rec)  # named before the conversation is looked for (a TRL pair has none of its keys)
    if skip is not None:
        raise skip
    conv_key, turns = _conversation_of(rec, ctx.shape)
    turns, part_sources, video_part_sources = _split_media_parts(turns)
    refs = _media_refs(rec, _IMAGE_KEYS) or [s for s in part_sources if s is not None]
    video_refs = _media_refs(rec, _VIDEO_KEYS) or [s for s in video_part_sources if s is not None]
    read = (*ALPACA_FIELDS, *PROMPT_COMPLETION_FIELDS) if conv_key not in rec else ()  # the fields turned into turns
    dropped = (*_IMAGE_KEYS, *_VIDEO_KEYS, *_CONVERSATION_KEYS, "texts", *read)
    doc = {k: v for k, v in rec.items() if k not in dropped}
    doc[conv_key] = turns
    try:
        raw = json.dumps(doc, ensure_ascii=False, default=_json_default).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SampleSkipped(
            "invalid_text",
            f"not encodable as UTF-8 ({exc.reason} at {exc.start}: "
            f"{exc.object[max(0, exc.start - 20) : exc.end + 20]!r})",
        ) from None
    # the loader's structural rules, on exactly what it will read: what passes here, it takes
    messages = normalize_conversation(decode_json_record(raw))
    check_conversation(messages, len(refs), len(video_refs))
    images = []
    for i, ref in enumerate(refs):
        data, origin = _read_media(ref, i, ctx, "image", found)
        images.append((data, _sniff(data, f"image {i} ({origin})", ctx.verify)))
    videos = []  # copied byte for byte, verified by their header
    for i, ref in enumerate(video_refs):
        data, origin = _read_media(ref, i, ctx, "video", found)
        videos.append((data, _sniff_video(data, f"video {i} ({origin})")))
    fields = {"__key__": key, "json": raw}
    if ctx.layout == "bridge":
        fields["jpgs"] = pickle.dumps([d for d, _ in images], protocol=4)
        fields["videos"] = pickle.dumps(
            [sampled_jpeg_frames(d, f"video {i}", ctx.preset) for i, (d, _) in enumerate(videos)], protocol=4
        )
    else:
        for i, (data, ext) in enumerate(images):
            fields[f"{i}.{ext}"] = data
        for i, (data, ext) in enumerate(videos):
            fields[f"{i}.{ext}"] = data
    n_image_bytes, n_video_bytes = sum(len(d) for d, _ in images), sum(len(d) for d, _ in videos)
    return fields, len(images), n_image_bytes, len(videos), n_video_bytes, messages.uses_tools


_BLANK = object()


def _depth_checked(rec: Any) -> Any:
    """``rec``, or its depth skip: a record too deep to pickle never travels to a worker."""
    try:
        check_depth(rec)
    except SampleSkipped as skip:
        return skip
    return rec


def _iter_records(src: _Source) -> Iterator[tuple[str, Any]]:
    if src.container == "json" and src.data is None:  # an array, streamed: raw records, parsed in the workers
        with open(src.files[0], "rb") as f:
            for i, raw in enumerate(iter_json_array(f)):
                yield f"record {i}", raw
    elif src.container == "json":
        data, src.data = src.data, None  # the records go to the workers chunk by chunk
        for i, rec in enumerate(data):
            yield f"record {i}", _depth_checked(rec)
    elif src.container == "jsonl":
        with open(src.files[0], "rb") as f:
            for lineno, line in enumerate(f, 1):
                yield f"line {lineno}", (_BLANK if not line.strip() else line)
    else:
        import pyarrow.parquet as pq

        for path in src.files:
            row = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
                for rec in batch.to_pylist():
                    yield (f"{path.name} row {row}" if len(src.files) > 1 else f"row {row}"), rec
                    row += 1
