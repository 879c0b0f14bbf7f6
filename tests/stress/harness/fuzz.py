"""Fuzz the input side: thousands of broken samples mixed with good ones, through the real loader.

:func:`run_fuzz` writes seeded WebDataset shards (Qwen-VL ChatML) and a JSONL file (GPT-SFT
prompt/completion), each a shuffled mix of known-good samples and broken ones of many kinds,
every one labelled with the outcome it must have: a counted skip with a given reason, or
"kept" (hostile-looking but valid, e.g. an escaped NUL, a BOM, a GIF named ``.jpg``). It then
streams both through megatron-energon's loader (carry-over packing, ``workers`` worker
processes) and returns plain figures:

- ``crashes``: loader runs that raised (with the error);
- ``bad_expected_by_reason`` / ``bad_counted_by_reason``: skips per reason, wanted and counted
  in ``batch["packing_stats"]``; ``bad_uncounted`` (broken samples neither emitted nor counted:
  silently dropped), ``bad_overcounted``, ``bad_emitted`` (broken samples that reached a pack);
- ``good_intact``: kept samples whose tokens (and pixels) equal encoding the sample alone;
  ``good_missing``, ``good_mismatched``, ``duplicates`` (keys emitted more than once).

Kinds of breakage: image bytes (truncated, garbage, huge-dimension header, zero size, text
bytes, 16-bit mode, extreme aspect), JSON structure (wrong types, missing fields, deep nesting,
huge numbers, broken syntax), text encodings (invalid UTF-8, lone surrogates, raw NUL), media
placeholders (count mismatches), control tokens typed in text, sizes (over-long, too many images).
"""

from __future__ import annotations

import io
import json
import random
import struct
import time
import traceback
import warnings
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

warnings.filterwarnings("ignore", message=".*pin_memory.*")

SEQ_LENGTH = 2048
BUFFER = 16
#: small images keep the full-scale run on two cores in minutes
PRESET_KW = {"name": "qwen2-vl", "max_pixels": 64 * 28 * 28}

# ----------------------------------------------------------------------------------------------
# Builders
# ----------------------------------------------------------------------------------------------


def _jpeg(rng: random.Random, w: int | None = None, h: int | None = None, fmt: str = "JPEG") -> bytes:
    w = w or rng.randint(24, 120)
    h = h or rng.randint(24, 120)
    yy, xx = np.mgrid[0:h, 0:w]
    c = rng.randint(1, 9)
    img = np.stack([(xx * c) % 256, (yy * 3) % 256, ((xx + yy) * c) % 256], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt)
    return buf.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` followed by 64 bytes of junk data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", b"\x00" * 64)
        + chunk(b"IEND", b"")
    )


def _png16(rng: random.Random) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((32, 32), rng.randint(0, 65535), dtype=np.uint16)).save(buf, format="PNG")
    return buf.getvalue()


_WORDS = "the a cat dog sky red blue count what where why image chart table number 3 12 ok yes".split()


def _text(rng: random.Random, lo: int = 3, hi: int = 20) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _chat(user: Any, assistant: Any = None, rng: random.Random | None = None) -> list:
    return [
        {"role": "user", "content": user},
        {"role": "assistant", "content": assistant if assistant is not None else _text(rng or random.Random(0))},
    ]


def _js(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _good_wds(rng: random.Random) -> dict:
    n = rng.choice([0, 1, 1, 2])
    conv = _chat("<image>\n" * n + _text(rng), _text(rng), rng)
    if rng.random() < 0.3:
        conv = {
            "conversations": [{"from": "human" if t["role"] == "user" else "gpt", "value": t["content"]} for t in conv]
        }
    fields = {"json": _js(conv)}
    for i in range(n):
        fields[f"{i}.{rng.choice(['jpg', 'JPG', 'jpeg', 'png'])}"] = _jpeg(rng)
    return fields


# (name, expected outcome: a skip reason or "kept", builder(rng) -> webdataset fields)
WDS_CASES: list[tuple[str, str, Callable[[random.Random], dict]]] = [
    # image bytes
    (
        "image_truncated",
        "corrupt_image",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.jpg": _jpeg(r, 200, 150)[:300]},
    ),
    (
        "image_garbage",
        "corrupt_image",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.jpg": bytes(r.getrandbits(8) for _ in range(400))},
    ),
    (
        "image_huge_dims_bomb",
        "corrupt_image",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.png": _png_header(100_000, 100_000)},
    ),
    (
        "image_huge_dims_header",
        "corrupt_image",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.png": _png_header(4000, 3000)},
    ),
    (
        "image_zero_size",
        "corrupt_image",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.png": _png_header(0, 10)},
    ),
    ("image_empty_bytes", "corrupt_image", lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.jpg": b""}),
    (
        "image_is_text",
        "corrupt_image",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.jpg": b"<html>not an image</html>"},
    ),
    (
        "image_16bit",
        "unsupported_image_mode",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.png": _png16(r)},
    ),
    (
        "image_extreme_aspect",
        "extreme_aspect_ratio",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.png": _jpeg(r, 1000, 3, "PNG")},
    ),
    (
        "image_gif_named_jpg",
        "kept",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "0.jpg": _jpeg(r, fmt="GIF")},
    ),
    (
        "image_bad_pickle",
        "bad_media",
        lambda r: {"json": _js(_chat("<image> what?", rng=r)), "jpgs": b"\x80\x04garbage"},
    ),
    # JSON structure
    ("json_syntax", "invalid_json", lambda r: {"json": _js(_chat(_text(r), rng=r))[:-7]}),
    ("json_deep", "invalid_json", lambda r: {"json": ("[" * 10_000 + "]" * 10_000).encode()}),
    (
        "json_deep_in_content",
        "invalid_json",
        lambda r: {
            "json": (
                '[{"role": "user", "content": ' + "[" * 5000 + "]" * 5000 + '}, {"role": "assistant", "content": "x"}]'
            ).encode()
        },
    ),
    ("json_huge_int", "invalid_json", lambda r: {"json": ('{"n": ' + "9" * 5000 + ', "messages": []}').encode()}),
    (
        "json_huge_float_content",
        "bad_conversation",
        lambda r: {"json": b'[{"role": "user", "content": 1e999}, {"role": "assistant", "content": "x"}]'},
    ),
    ("json_messages_int", "bad_conversation", lambda r: {"json": _js({"messages": 5})}),
    ("json_turn_string", "bad_conversation", lambda r: {"json": _js(["hello", "world"])}),
    (
        "json_role_list",
        "bad_conversation",
        lambda r: {"json": _js([{"role": ["user"], "content": "x"}, {"role": "assistant", "content": "y"}])},
    ),
    (
        "json_part_unsupported",
        "bad_conversation",
        lambda r: {"json": _js(_chat([{"type": "hologram", "hologram": "x"}], rng=r))},
    ),
    (
        "json_part_audio",
        "unsupported_audio",
        lambda r: {"json": _js(_chat([{"type": "audio", "audio": "x"}], rng=r))},
    ),
    (
        "json_text_part_dict",
        "bad_conversation",
        lambda r: {"json": _js(_chat([{"type": "text", "text": {"a": 1}}], rng=r))},
    ),
    ("json_no_turns_key", "bad_conversation", lambda r: {"json": _js({"foo": []})}),
    ("json_empty_list", "empty_conversation", lambda r: {"json": b"[]"}),
    ("json_missing_member", "missing_conversation", lambda r: {"txt": b"hello"}),
    (
        "json_no_role",
        "bad_conversation",
        lambda r: {"json": _js([{"content": "x"}, {"role": "assistant", "content": "y"}])},
    ),
    ("json_no_assistant", "no_assistant_turn", lambda r: {"json": _js([{"role": "user", "content": _text(r)}])}),
    ("json_blank", "empty_line", lambda r: {"json": b"   \n"}),
    # text encodings
    (
        "text_invalid_utf8",
        "invalid_utf8",
        lambda r: {"json": b'[{"role": "user", "content": "caf\xe9"}, {"role": "assistant", "content": "x"}]'},
    ),
    (
        "text_lone_surrogate",
        "invalid_text",
        lambda r: {"json": b'[{"role": "user", "content": "a \\udc80 b"}, {"role": "assistant", "content": "x"}]'},
    ),
    (
        "text_raw_nul",
        "invalid_json",
        lambda r: {"json": b'[{"role": "user", "content": "a\x00b"}, {"role": "assistant", "content": "x"}]'},
    ),
    ("text_escaped_nul", "kept", lambda r: {"json": _js(_chat("a\u0000b " + _text(r), rng=r))}),
    ("text_bom", "kept", lambda r: {"json": b"\xef\xbb\xbf" + _js(_chat(_text(r), rng=r))}),
    ("text_utf16", "invalid_utf8", lambda r: {"json": json.dumps(_chat("x", "y")).encode("utf-16")}),
    # media placeholders
    (
        "placeholder_more",
        "media_count_mismatch",
        lambda r: {"json": _js(_chat("<image> <image> two?", rng=r)), "0.jpg": _jpeg(r)},
    ),
    ("placeholder_no_image", "media_count_mismatch", lambda r: {"json": _js(_chat("<image> where?", rng=r))}),
    ("placeholder_video", "media_count_mismatch", lambda r: {"json": _js(_chat("<video> what?", rng=r))}),
    # control tokens typed in text
    (
        "ctrl_image_pad",
        "control_token_in_text",
        lambda r: {"json": _js(_chat("<image> <|image_pad|>", rng=r)), "0.jpg": _jpeg(r)},
    ),
    ("ctrl_video_pad", "control_token_in_text", lambda r: {"json": _js(_chat("look <|video_pad|>", rng=r))}),
    (
        "ctrl_im_end",
        "control_token_in_text",
        lambda r: {"json": _js(_chat("q", "a<|im_end|>\n<|im_start|>user\nb", r))},
    ),
    (
        "ctrl_in_role",
        "unknown_role",
        lambda r: {"json": _js([{"role": "user<|im_start|>", "content": "x"}, {"role": "assistant", "content": "y"}])},
    ),
    # sizes
    ("size_overlong", "oversize", lambda r: {"json": _js(_chat(" ".join(["word"] * 4000), rng=r))}),
    (
        "size_too_many_images",
        "too_many_images",
        lambda r: {"json": _js(_chat(_text(r), rng=r)), **{f"{i}.jpg": _jpeg(r, 24, 24) for i in range(11)}},
    ),
]

# (name, expected, builder(rng) -> one JSONL line as bytes); lines start with "{" and end with
# "}" because Energon's JSONL indexer (energon prepare) asserts that of every line.
JSONL_CASES: list[tuple[str, str, Callable[[random.Random], bytes]]] = [
    ("json_syntax", "invalid_json", lambda r: b'{"prompt": "p", "completion": }'),
    (
        "json_deep",
        "invalid_json",
        lambda r: ('{"prompt": ' + "[" * 10_000 + "]" * 10_000 + ', "completion": "x"}').encode(),
    ),
    (
        "json_huge_int",
        "invalid_json",
        lambda r: ('{"prompt": "p", "completion": "c", "n": ' + "1" * 5000 + "}").encode(),
    ),
    ("field_missing", "missing_field", lambda r: _js({"question": _text(r), "completion": "c"})),
    ("field_wrong_type", "missing_field", lambda r: _js({"prompt": 5, "completion": "c"})),
    ("field_empty", "empty_completion", lambda r: _js({"prompt": "p", "completion": "  "})),
    ("text_invalid_utf8", "invalid_utf8", lambda r: b'{"prompt": "caf\xe9", "completion": "x"}'),
    ("text_lone_surrogate", "invalid_text", lambda r: b'{"prompt": "p", "completion": "\\ud800"}'),
    ("text_raw_nul", "invalid_json", lambda r: b'{"prompt": "a\x00b", "completion": "x"}'),
    ("text_escaped_nul", "kept", lambda r: _js({"prompt": "a\u0000b " + _text(r), "completion": _text(r)})),
    ("ctrl_im_end", "control_token_in_text", lambda r: _js({"prompt": "p", "completion": "x<|im_end|>"})),
    ("ctrl_image_pad", "control_token_in_text", lambda r: _js({"prompt": "<|image_pad|>", "completion": "x"})),
    ("size_overlong", "oversize", lambda r: _js({"prompt": " ".join(["word"] * 3000), "completion": "x"})),
]


def _good_jsonl(rng: random.Random) -> bytes:
    return _js({"prompt": _text(rng), "completion": " " + _text(rng)})


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------


def _loader(path: Path, te: Any, workers: int):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    return get_loader(
        get_train_dataset(
            str(path),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
            task_encoder=te,
            packing_buffer_size=BUFFER,
            repeat=False,
        )
    )


def _stream(path: Path, te: Any, workers: int) -> tuple[list[dict], dict, str | None]:
    """(batches as (key, input_ids, labels, visual per segment) records, skips by reason, crash)."""
    from energon_pack.packing import PackingStatsTracker

    segments: list[dict] = []
    tracker = PackingStatsTracker()
    crash = None
    try:
        for b in _loader(path, te, workers):
            tracker.update(b["packing_stats"])
            cu = b["cu_seqlens_q"].tolist()
            for n, key in enumerate(b["__keys__"]):
                seg = {
                    "key": key,
                    "input_ids": b["input_ids"][0, cu[n] : cu[n + 1]].clone(),
                    "labels": b["labels"][0, cu[n] : cu[n + 1]].clone(),
                }
                if b.get("image_grid_thw") is not None:
                    seg["_grid_all"], seg["_pv_all"] = b["image_grid_thw"], b["pixel_values"]
                segments.append(seg)
    except Exception as exc:  # a crash is a figure, not the end of the report
        crash = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
    return segments, dict(tracker.total.skips), crash


def _split_visual(segments: list[dict], image_counts: dict[str, int]) -> None:
    """Give each segment its own image grids and pixel rows (batches concatenate them in order)."""
    by_batch: dict[int, list[dict]] = {}
    for seg in segments:
        if "_grid_all" in seg:
            by_batch.setdefault(id(seg["_grid_all"]), []).append(seg)
    for group in by_batch.values():
        grid_all, pv_all = group[0]["_grid_all"], group[0]["_pv_all"]
        img = patch = 0
        for seg in group:
            n = image_counts.get(seg["key"], 0)
            grids = grid_all[img : img + n]
            rows = int(grids.prod(dim=1).sum()) if n else 0
            seg["image_grid_thw"], seg["pixel_values"] = grids, pv_all[patch : patch + rows]
            img, patch = img + n, patch + rows
    for seg in segments:
        seg.pop("_grid_all", None)
        seg.pop("_pv_all", None)


def _figures(
    kind: str,
    expected: dict[str, str],
    segments: list[dict],
    counted: dict,
    crash: str | None,
    check: Callable[[str, dict], bool],
) -> dict:
    emitted = Counter(seg["key"] for seg in segments)
    kept = {k for k, want in expected.items() if want == "kept"}
    bad = {k: want for k, want in expected.items() if want != "kept"}
    want_by_reason = dict(sorted(Counter(bad.values()).items()))
    intact = mismatched = 0
    seen = set()
    for seg in segments:
        if seg["key"] in kept and seg["key"] not in seen:
            seen.add(seg["key"])
            if check(seg["key"], seg):
                intact += 1
            else:
                mismatched += 1
    bad_emitted = sorted(k for k in emitted if k in bad)
    counted_total = sum(counted.values())
    return {
        "kind": kind,
        "samples": len(expected),
        "good_samples": len(kept),
        "bad_samples": len(bad),
        "crashes": int(crash is not None),
        "crash": crash,
        "bad_expected_by_reason": want_by_reason,
        "bad_counted_by_reason": dict(sorted(counted.items())),
        "reasons_differing": {
            r: [want_by_reason.get(r, 0), counted.get(r, 0)]
            for r in sorted(set(want_by_reason) | set(counted))
            if want_by_reason.get(r, 0) != counted.get(r, 0)
        },
        "bad_counted": min(counted_total, len(bad)),
        "bad_uncounted": max(0, len(bad) - len(bad_emitted) - counted_total),
        "bad_overcounted": max(0, counted_total - (len(bad) - len(bad_emitted))),
        "bad_emitted": len(bad_emitted),
        "good_intact": intact,
        "good_mismatched": mismatched,
        "good_missing": len(kept - set(emitted)),
        "duplicates": sum(n - 1 for n in emitted.values() if n > 1),
        "unknown_keys": sorted(set(emitted) - set(expected))[:10],
    }


def _write_shards(root: Path, items: list[tuple[str, dict]], per_shard: int = 500) -> None:
    import webdataset as wds

    from energon_pack.energon.prepare import prepare_webdataset

    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "fuzz-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for key, fields in items:
            sink.write({"__key__": key, **fields})
    prepare_webdataset(root)


def _run_webdataset(root: Path, n_bad: int, n_good: int, seed: int, workers: int) -> dict:
    import torch

    from energon_pack.chat.tokenizer import load_demo_tokenizer
    from energon_pack.energon.chatml import ChatMLSample, parse_chatml
    from energon_pack.qwen_vl import get_preset
    from energon_pack.qwen_vl.chat import encode_chat
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    rng = random.Random(seed)
    plan = ["good"] * n_good + [WDS_CASES[i % len(WDS_CASES)][0] for i in range(n_bad)]
    rng.shuffle(plan)
    builders = {name: (want, build) for name, want, build in WDS_CASES}
    items, expected, fields_of = [], {}, {}
    for i, name in enumerate(plan):
        key = f"{i:07d}"
        if name == "good":
            fields, want = _good_wds(rng), "kept"
        else:
            want, build = builders[name]
            fields = build(rng)
        items.append((key, fields))
        expected[key] = want
        if want == "kept":
            fields_of[key] = fields
    _write_shards(root, items)
    preset_kw = dict(PRESET_KW)
    preset = get_preset(preset_kw.pop("name"), **preset_kw)
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=SEQ_LENGTH)
    segments, counted, crash = _stream(root, te, workers)
    tok = load_demo_tokenizer()

    parsed = {
        k: parse_chatml(ChatMLSample(__key__=k, __restore_key__=(), __subflavors__={}, fields=f))
        for k, f in fields_of.items()
    }
    _split_visual(segments, {k: len(p[1]) for k, p in parsed.items()})

    def check(key: str, seg: dict) -> bool:
        conv, images, videos = parsed[key]
        enc, vis = encode_chat(conv, images, videos, tokenizer=tok, preset=preset, config=te.chat)
        if not (torch.equal(seg["input_ids"], enc.input_ids) and torch.equal(seg["labels"], enc.labels)):
            return False
        if images:
            return torch.equal(seg["image_grid_thw"], enc.image_grid_thw) and torch.equal(
                seg["pixel_values"], vis.pixel_values
            )
        return True

    return _figures("webdataset", expected, segments, counted, crash, check)


def _run_jsonl(path: Path, n_bad: int, n_good: int, seed: int, workers: int) -> dict:
    import torch

    from energon_pack.chat.tokenizer import load_demo_tokenizer
    from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
    from energon_pack.sft.formats import PromptCompletionFormat

    rng = random.Random(seed + 1)
    plan = ["good"] * n_good + [JSONL_CASES[i % len(JSONL_CASES)][0] for i in range(n_bad)]
    rng.shuffle(plan)
    builders = {name: (want, build) for name, want, build in JSONL_CASES}
    lines, expected = [], {}
    for i, name in enumerate(plan):
        if name == "good":
            line, want = _good_jsonl(rng), "kept"
        else:
            want, build = builders[name]
            line = build(rng)
        lines.append(line)
        expected[str(i)] = want
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    prepare_jsonl(path)
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=SEQ_LENGTH)
    segments, counted, crash = _stream(path, te, workers)
    fmt = PromptCompletionFormat(load_demo_tokenizer())
    from energon_pack.records import decode_json_record

    def check(key: str, seg: dict) -> bool:
        enc = fmt.encode(decode_json_record(lines[int(key)]))
        labels = np.where(enc.target_mask[1:], enc.input_ids[1:], -100).tolist() + [-100]
        return seg["input_ids"].tolist() == enc.input_ids.tolist() and seg["labels"].tolist() == labels

    del torch
    return _figures("jsonl", expected, segments, counted, crash, check)


def run_fuzz(
    out_dir: str | Path,
    n_samples: int = 10_000,
    seed: int = 0,
    workers: int = 2,
    good_ratio: float = 0.5,
    jsonl_share: float = 0.2,
) -> dict:
    """Write ``n_samples`` broken samples (``1 - jsonl_share`` of them in WebDataset shards, the
    rest in a JSONL file) mixed with ``good_ratio * n_samples`` good ones, stream both through the
    real loader (carry mode, ``workers`` workers) and return the figures (plain JSON-able dict)."""
    out = Path(out_dir)
    start = time.perf_counter()
    n_jsonl_bad = int(round(n_samples * jsonl_share))
    n_wds_bad = n_samples - n_jsonl_bad
    n_good = int(round(n_samples * good_ratio))
    n_jsonl_good = int(round(n_good * jsonl_share))
    wds = _run_webdataset(out / "shards", n_wds_bad, n_good - n_jsonl_good, seed, workers)
    jsonl = _run_jsonl(out / "fuzz.jsonl", n_jsonl_bad, n_jsonl_good, seed, workers)
    parts = (wds, jsonl)
    counted: Counter = Counter()
    wanted: Counter = Counter()
    for p in parts:
        counted.update(p["bad_counted_by_reason"])
        wanted.update(p["bad_expected_by_reason"])
    return {
        "n_samples": n_samples,
        "seed": seed,
        "workers": workers,
        "bad_samples": sum(p["bad_samples"] for p in parts),
        "good_samples": sum(p["good_samples"] for p in parts),
        "crashes": sum(p["crashes"] for p in parts),
        "bad_expected_by_reason": dict(sorted(wanted.items())),
        "bad_counted_by_reason": dict(sorted(counted.items())),
        "bad_counted": sum(p["bad_counted"] for p in parts),
        "bad_uncounted": sum(p["bad_uncounted"] for p in parts),
        "bad_overcounted": sum(p["bad_overcounted"] for p in parts),
        "bad_emitted": sum(p["bad_emitted"] for p in parts),
        "good_intact": sum(p["good_intact"] for p in parts),
        "good_mismatched": sum(p["good_mismatched"] for p in parts),
        "good_missing": sum(p["good_missing"] for p in parts),
        "duplicates": sum(p["duplicates"] for p in parts),
        "seconds": round(time.perf_counter() - start, 1),
        "webdataset": wds,
        "jsonl": jsonl,
    }


if __name__ == "__main__":  # pragma: no cover - manual runs
    import argparse
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run_fuzz(args.out or tmp, args.samples, args.seed, args.workers), indent=1))
