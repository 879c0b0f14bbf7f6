"""``energon-pack convert``: your own VLM SFT data -> prepared Energon WebDataset shards, in one command.

Inputs (the layouts most published VLM SFT sets use), detected from the content:

- ``llava``: a JSON array (or JSONL) of ``{"id", "image": "a.jpg" | "images": [...],
  "conversations": [{"from", "value"}, ...]}`` with ``<image>`` placeholders;
- ``sharegpt``: the same turns (``conversations`` from/value), optional ``images`` list;
- ``messages``: OpenAI-style ``{"messages": [{"role", "content"}, ...], "images": [...]}``, content a
  string (``<image>`` placeholders) or typed parts (``{"type": "image"}``, ``{"type": "image",
  "image": "a.jpg"}``, ``{"type": "image_url", "image_url": {"url": "data:..."}}``); tool calls
  (``content: null`` + ``tool_calls``, ``role: "tool"``) are kept as given;
- LLaMA-Factory's ShareGPT files are ``sharegpt`` / ``messages``: ``function_call`` / ``observation``
  turns, ``tools`` as a JSON string and a top-level ``system`` are read by the loader's own rules;
- ``alpaca`` (LLaMA-Factory's default): ``{"instruction", "input", "output", "system", "history",
  "images"}``, written as ``messages`` turns (:func:`~energon_pack.chat.conversation.alpaca_turns`);
- ``parquet``: one ``.parquet`` file or a folder of them, with a ``messages`` / ``conversations`` /
  ``texts`` column and an ``images`` / ``image`` column (``{"bytes", "path"}`` structs or binary).

An image value is a path (relative paths resolve against ``image_root``, default the source
file's folder), a ``{"path"}`` / ``{"bytes"}`` dict, raw bytes or a ``data:`` URI. Images are
stored with their ORIGINAL encoded bytes (never re-encoded), named by the format sniffed from
the bytes. Videos (LLaVA-Video / ShareGPT ``"video"`` / ``"videos"`` with ``<video>``
placeholders, ``{"type": "video", "video": ...}`` parts, Parquet ``video`` columns) take the same
values and are copied byte for byte too, after the header check the loader's costing needs
(:func:`~energon_pack.video.probe_video`: a video stream with a rate, a size and >= 2 frames),
named ``mp4`` (MP4/MOV), ``mkv`` (Matroska/WebM) or ``avi`` by their container. Output layouts:

- ``ours``: ``KEY.json`` (the record without its image / video fields) + ``KEY.0.jpg``,
  ``KEY.1.png``, ... and ``KEY.0.mp4``, ... in placeholder order;
- ``bridge``: Megatron-Bridge's ChatML layout, ``KEY.json`` + ``KEY.jpgs`` (a pickled list of the
  encoded images) + ``KEY.videos`` (a pickled empty list), as Bridge's preparers write it. The
  pickles are there for Bridge's own reader; ours loads them without running code
  (:func:`~energon_pack.energon.chatml.unpickle_media`), and ``ours`` needs no pickle at all.
  A video becomes a frame list there: the frames qwen-vl-utils' default sampling takes (2 per
  second, 4 to 768, :mod:`energon_pack.video.sampling`), decoded and stored as JPEG (quality 95, 4:4:4)
  in ``KEY.videos``; the frame rate of the file is not kept (readers assume 2 frames per second).

Image paths are read only inside the source's folder and ``image_root`` (resolved, symlinks
included), only from regular files up to ``max_media_mb``, and only past an image header.

Then :func:`~energon_pack.energon.prepare.prepare_webdataset` indexes the shards, so
``get_train_dataset(out_dir, ...)`` works at once. Every unusable record is a counted skip
with a reason and examples (:data:`SKIP_REASONS`); ``written + skipped == records``. Each written
record has passed the loader's own structural checks on the very JSON written
(:func:`~energon_pack.chat.conversation.check_conversation`: turns, roles, tool calls, an assistant
turn, placeholders against images), under the loader's reason names; what is left to the loader
depends on its settings (the tokenizer, the preset's tool support, image and width limits).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import fcntl
import io
import json
import os
import pickle
import re
import shutil
import stat
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from energon_pack.chat.conversation import ALPACA_FIELDS, alpaca_turns, check_conversation, normalize_conversation
from energon_pack.energon.prepare import prepare_webdataset
from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.records import check_depth, decode_json_record, loads_checked
from energon_pack.storage import is_remote, list_names, store_errors, upload_tree

__all__ = ["FORMATS", "LAYOUTS", "SKIP_REASONS", "ConvertSummary", "build_parser", "convert", "detect_format", "main"]

FORMATS = ("auto", "llava", "sharegpt", "messages", "alpaca", "parquet")
LAYOUTS = ("ours", "bridge")
VERIFY_MODES = ("header", "decode")

#: What each skip reason means (the README table is generated from the same words).
SKIP_REASONS = {
    "invalid_json": "a JSONL line that is not valid JSON (or nested deeper than 64 levels)",
    "invalid_utf8": "a JSONL line that is not UTF-8",
    "bad_record": "a record that is not a JSON object / table row",
    "no_conversation": "a record without messages / conversations / conversation / texts",
    "bad_conversation": "turns of an unsupported shape (no role/from, a content of an unknown type, a tool call "
                        "without a name, tools that are not a list, ...)",
    "unknown_role": "a turn whose role is not system / user / assistant / tool (or an alias: human, gpt, "
                    "function_call, observation)",
    "empty_conversation": "a conversation with no turns",
    "no_assistant_turn": "a conversation with no assistant turn: nothing to train on",
    "empty_assistant_turn": "an assistant turn with no content and no tool calls",
    "media_count_mismatch": "the number of <image> placeholders / image parts differs from the number of images",
    "bad_video_ref": "a video value that is neither a path, bytes nor a {path}/{bytes} dict",
    "remote_video": "an http(s) video URL (convert never downloads)",
    "missing_video": "a video path that does not exist (check --image-root, which video paths share)",
    "unreadable_video": "a video path that exists but cannot be read (no permission)",
    "not_a_video": "a file whose first bytes are no video container header (mp4/mov, mkv/webm, avi)",
    "corrupt_video": "video bytes FFmpeg cannot read: no video stream, frame rate, frame or size in the header",
    "video_too_few_frames": "a video of fewer than 2 frames (Qwen's sampling, and so the loader, refuses it)",
    "bad_image_ref": "an image value that is neither a path, bytes, a data: URI nor a {path}/{bytes} dict",
    "remote_image": "an http(s) image URL (convert never downloads)",
    "missing_image": "an image path that does not exist (check --image-root)",
    "unreadable_image": "an image path that exists but cannot be read (no permission)",
    "path_outside_root": "an image path that resolves (symlinks included) outside the source folder and --image-root "
                         "(--allow-outside-paths reads it)",
    "not_a_regular_file": "an image path naming a folder, a FIFO, a device (/dev/zero, /dev/stdin) or a socket",
    "media_too_large": "an image larger than --max-media-mb",
    "not_an_image": "a file whose first bytes are no image header (it is not read further)",
    "invalid_text": "text that cannot be written as UTF-8 (a lone surrogate such as \\ud800)",
    "unexpected_error": "a record that broke convert in an unforeseen way (the example names the exception)",
    "corrupt_image": "image bytes PIL cannot open (empty, garbage, truncated with --verify decode)",
    "unsupported_image_format": "an image format the loader does not read (only jpg, png, webp, bmp, gif, tiff)",
}

SUMMARY_FILE = "convert_summary.json"
IN_PROGRESS_FILE = ".convert_in_progress"
TMP_DIR = ".convert_tmp"
SHARD_NAME = "data-%06d.tar"
MANIFEST_FILE = ".convert_manifest.json"  # every top-level name convert wrote: all --overwrite ever deletes
_OWN_DIRS = (TMP_DIR, ".nv-meta")
_FIXED = (MANIFEST_FILE, IN_PROGRESS_FILE, SUMMARY_FILE, *_OWN_DIRS)
_ENERGON_SUFFIXES = (".idx", ".idx.tmp")  # Energon's per-shard index, and its temporary name while indexing
MAX_EXAMPLES = 3
DEFAULT_MAX_MEDIA_MB = 64
HEADER_BYTES = 1 << 16  # read and checked before the rest of an image file
#: Leading bytes of the formats the loader reads (MPO is JPEG); anything else must be named by PIL from the header.
_IMAGE_MAGIC = (b"\xff\xd8", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")

#: PIL format -> member extension (an extension the loader's cooker recognises as an image).
PIL_EXTENSIONS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "GIF": "gif", "TIFF": "tiff"}
_CONVERSATION_KEYS = ("messages", "conversations", "conversation")
_IMAGE_KEYS = ("images", "image")
_VIDEO_KEYS = ("videos", "video")
_IMAGE_PART_SOURCES = ("image", "image_url", "url", "path", "bytes")
_VIDEO_PART_SOURCES = ("video", "video_url", "url", "path", "bytes")
#: container format (FFmpeg's demuxer name) -> member extension the loader reads as a video
VIDEO_FORMAT_EXTENSIONS = {"mov,mp4,m4a,3gp,3g2,mj2": "mp4", "matroska,webm": "mkv", "avi": "avi"}


# ------------------------------------------------------------------------------------ summary
@dataclass
class ConvertSummary:
    """What a conversion did: counts, skips by reason (with examples), shards, bytes, time."""

    source: str
    out_dir: str
    format: str  # llava | sharegpt | messages | parquet
    detected: str  # how the input was read, in words
    layout: str
    records: int = 0
    written: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> count
    examples: dict = field(default_factory=dict)  # reason -> ["record 3: detail", ...] (up to 3)
    blank_lines: int = 0  # whitespace-only JSONL lines (not records)
    shards: int = 0
    images: int = 0
    image_bytes: int = 0
    videos: int = 0
    video_bytes: int = 0
    bytes: int = 0  # size of the written shards
    seconds: float = 0.0
    workers: int = 1
    hints: list = field(default_factory=list)  # one line each: what to change (e.g. pass --image-root)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "skipped_total": self.skipped_total}

    def format_text(self) -> str:
        """The human report ``energon-pack convert`` prints."""
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"converted {self.source} -> {self.out_dir} (layout {self.layout})",
            f"  input    {self.detected}",
            f"  records  {self.records}: written {self.written}, skipped {self.skipped_total}"
            + (f" ({self.blank_lines} blank lines ignored)" if self.blank_lines else ""),
        ]
        for reason, count in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  skipped  {reason}: {count}")
            lines.extend(f"             e.g. {ex}" for ex in self.examples.get(reason, []))
        lines.extend(f"  hint     {h}" for h in self.hints)
        lines += [
            f"  output   {self.shards} shard(s), {_mb(self.bytes)}; {self.images} image(s), {_mb(self.image_bytes)}"
            + (f"; {self.videos} video(s), {_mb(self.video_bytes)}" if self.videos else "") + " (original bytes)",
            f"  time     {self.seconds:.2f} s ({rate:,.0f} records/s, {self.workers} worker(s)); Energon-prepared: "
            f"get_train_dataset({self.out_dir!r}, ...)",
        ]
        return "\n".join(lines)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


# ------------------------------------------------------------------------------------ detection
@dataclass
class _Source:
    files: list  # list[Path]
    container: str  # json | jsonl | parquet
    shape: str  # llava | sharegpt | messages | parquet
    detected: str
    records: int | None  # known up front (JSON array, Parquet), else None
    parquet_columns: tuple = ()  # (conversation column, image column or None)
    data: list | None = None  # a JSON array, parsed once


def detect_format(source: str | Path, format: str = "auto") -> tuple[str, str]:
    """(format, how it was detected) for ``source``; ConfigError when it cannot be read."""
    src = _open_source(Path(source), format)
    return src.shape, src.detected


def _open_source(path: Path, format: str) -> _Source:
    if format not in FORMATS:
        raise ConfigError("format", f"unknown format {format!r}", f"use one of {', '.join(FORMATS)}")
    if not path.exists():
        raise ConfigError("source", f"{path} does not exist",
                          "pass a LLaVA/ShareGPT JSON or JSONL file, an OpenAI-messages JSONL file, or Parquet file(s)")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
        if not files:
            raise ConfigError("source", f"folder {path} holds no *.parquet files",
                              "pass a JSON/JSONL file, a .parquet file, or a folder of .parquet files")
        return _open_parquet(files, format)
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError as exc:
        raise ConfigError("source", f"cannot read {path}: {exc}", "check the path and its permissions") from None
    if head[:4] == b"PAR1" or path.suffix == ".parquet":
        return _open_parquet([path], format)
    if format == "parquet":
        raise ConfigError("format", f"{path} is not a Parquet file (no PAR1 magic)", "use --format auto")
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    # JSONL when lines parse as objects on their own (a hostile first line must not decide the file)
    if _jsonl_by_lines(path):
        container = "jsonl"
    elif text[:1] in (b"[", b"{"):
        container = "json"  # an array (streamed) or a pretty-printed object (read whole below)
    else:
        raise ConfigError("format", f"{path} is neither JSON, JSONL nor Parquet (it starts with {head[:16]!r})",
                          "pass a JSON array, a JSONL file or Parquet")
    streamed = container == "json" and text[:1] == b"["  # an array: streamed record by record, never held whole
    data = _load_json_array(path) if container == "json" and not streamed else None
    peek = data[:200] if data is not None else _peek_json_array(path) if streamed else _peek_jsonl(path)
    shape = format if format != "auto" else _detect_shape(peek, path)
    how = "auto-detected" if format == "auto" else "as given"
    kind = f"JSON array of {len(data)} records" if data is not None else "JSON array" if streamed else "JSONL"
    return _Source([path], container, shape, f"{shape} ({kind}, {how})", None if data is None else len(data), data=data)


def _jsonl_by_lines(path: Path, max_lines: int = 200, max_bytes: int = 1 << 20) -> bool:
    """Whether the file reads as JSONL: among its first ``max_lines`` non-empty lines some parse as
    JSON objects on their own, and the first line parses or at least half of them do (a pretty-printed
    document has at most a few such lines). A hostile first line does not decide it; lines over
    ``max_bytes`` count as lines that do not parse, unread."""
    first, objects, lines = False, 0, 0
    with open(path, "rb") as f:
        while lines < max_lines:
            line = f.readline(max_bytes)
            if not line:
                break
            if not line.strip():
                continue
            lines += 1
            if not line.endswith(b"\n") and len(line) == max_bytes:
                while (rest := f.readline(max_bytes)) and not rest.endswith(b"\n"):
                    pass  # an over-long line: skip it
                continue
            try:
                value = json.loads(line.decode("utf-8").lstrip("\ufeff"))
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            first |= lines == 1
            objects += isinstance(value, dict)
    return objects > 0 and (first or 2 * objects >= lines)


def _peek_json_array(path: Path, n: int = 200) -> list:
    out = []
    with open(path, "rb") as f:
        for raw in iter_json_array(f):
            if len(out) >= n:
                break
            with contextlib.suppress(SampleSkipped):
                out.append(decode_json_record(raw))
    return out


_JSON_OUTSIDE = re.compile(rb'["\[\]{},]')  # what changes the state outside a string
_JSON_INSIDE = re.compile(rb'["\\]')  # ... and inside one


def iter_json_array(f: Any, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """The raw bytes of each element of the JSON array in the binary file ``f``, found by
    tracking strings and bracket depth (iteratively: any nesting depth), never parsing or holding
    the whole array: memory is bounded by the largest element plus ``chunk_size``. Broken text
    comes out as elements whose parse fails (a counted skip), text after the array too; an empty
    final element (``[]``, a trailing comma) is not one."""
    buf = bytearray()
    while not buf.lstrip(b"\xef\xbb\xbf \t\r\n") and (more := f.read(chunk_size)):
        buf += more
    start = len(buf) - len(buf.lstrip(b"\xef\xbb\xbf \t\r\n"))
    if buf[start:start + 1] != b"[":
        raise ValueError("not a JSON array")
    start += 1
    pos, depth, in_string, eof = start, 1, False, False
    while depth:
        m = (_JSON_INSIDE if in_string else _JSON_OUTSIDE).search(buf, pos)
        if m is None or (in_string and buf[m.start()] == 0x5C and m.start() + 1 >= len(buf) and not eof):
            if eof:
                break
            pos = (m.start() if m else len(buf)) - start
            del buf[:start]  # keep only the current element
            start = 0
            more = f.read(chunk_size)
            eof = not more
            buf += more
            continue
        i, c = m.start(), buf[m.start()]
        pos = i + 1
        if in_string:
            if c == 0x5C:  # a backslash: the next byte is escaped
                pos = i + 2
            else:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
        elif depth == 1:  # a comma between elements
            yield bytes(buf[start:i])
            start = i + 1
        if not depth and buf[start:i].strip():
            yield bytes(buf[start:i])
    if depth and bytes(buf[start:]).strip():  # a truncated file: the last element is broken
        yield bytes(buf[start:])
    rest = bytes(buf[pos:]).strip() if not depth else b""
    while not depth and not rest and not eof:
        more = f.read(chunk_size)
        eof, rest = not more, more.strip()
    if rest:  # text after the array: one broken element, so it is counted, not ignored
        yield b"<data after the closing ]> " + (rest + f.read(200))[:200].strip()


def _peek_jsonl(path: Path, n: int = 200) -> list:
    out = []
    with open(path, "rb") as f:
        for line in f:
            if len(out) >= n:
                break
            try:
                out.append(decode_json_record(line))
            except SampleSkipped:
                continue
    return out


def _load_json_array(path: Path) -> list:
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8-sig"))
    except RecursionError:
        raise ConfigError("source", f"{path} is nested too deeply to read as one JSON document",
                          "write the records as a JSON array or one JSON object per line") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError("source", f"{path} is not valid JSON: {exc}",
                          "fix the file (a JSON array of records, or one JSON object per line)") from None
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if not any(k in data for k in (*_CONVERSATION_KEYS, "texts")) and len(lists) == 1:
            data = data[lists[0]]  # {"data": [records]}
        else:
            data = [data]  # a single record
    if not isinstance(data, list):
        raise ConfigError("source", f"{path} holds a JSON {type(data).__name__}, not a list of records",
                          "pass a JSON array of records or a JSONL file")
    return data


def _detect_shape(records: list, path: Path) -> str:
    dicts = [r for r in records if isinstance(r, dict)]
    if not dicts:
        raise ConfigError("format", f"no JSON object among the first records of {path}",
                          "records must be objects with messages or conversations")
    keys = Counter(k for r in dicts for k in r)
    if keys["messages"] >= keys["conversations"] + keys["conversation"] and keys["messages"]:
        return "messages"
    if keys["conversations"] or keys["conversation"]:
        return "llava" if keys["image"] or (not keys["images"] and _mentions_image(dicts)) else "sharegpt"
    if keys["instruction"] and keys["output"]:
        return "alpaca"
    raise ConfigError("format", f"cannot tell the record shape of {path}: first record keys {sorted(dicts[0])}",
                      "records need 'messages' (OpenAI), 'conversations' (LLaVA/ShareGPT) or 'instruction' + "
                      "'output' (alpaca); pass --format to force")


def _mentions_image(records: list) -> bool:
    return any("<image>" in json.dumps(r.get("conversations", r.get("conversation")), default=str) for r in records)


def _open_parquet(files: list, format: str) -> _Source:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("format", "Parquet input needs pyarrow", "pip install 'energon-pack[convert]'") from None
    if format not in FORMATS:
        raise ConfigError("format", f"unknown format {format!r}", f"use one of {', '.join(FORMATS)}")
    schemas, total = [], 0
    for f in files:
        try:
            pf = pq.ParquetFile(f)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise ConfigError("source", f"{f} is not a readable Parquet file: {exc}", "check the file") from None
        schemas.append(pf.schema_arrow)
        total += pf.metadata.num_rows
    names = schemas[0].names
    conv = next((c for c in (*_CONVERSATION_KEYS, "texts", "instruction") if c in names), None)
    if conv is None:
        raise ConfigError("format", f"Parquet columns {names} hold no messages / conversations / conversation / texts "
                          "(nor an alpaca instruction)", "the table needs a conversation column")
    img = next((c for c in _IMAGE_KEYS if c in names), None)
    img_type = f" ({schemas[0].field(img).type})" if img else ""
    many = f"{len(files)} files, " if len(files) > 1 else ""
    detected = (f"parquet ({many}{total} rows; conversation column {conv!r}, "
                + (f"image column {img!r}{img_type}" if img else "no image column") + ")")
    return _Source(list(files), "parquet", "parquet", detected, total, (conv, img))


# ------------------------------------------------------------------------------------ records -> samples
@dataclass(frozen=True)
class _Context:
    image_root: str
    layout: str
    shape: str
    verify: str
    tmp_dir: str
    roots: tuple = ()  # resolved folders image paths may resolve into
    allow_outside: bool = False
    max_media_bytes: int = DEFAULT_MAX_MEDIA_MB << 20


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
    raise SampleSkipped("no_conversation", f"no messages/conversations/conversation/texts/instruction among keys "
                        f"{sorted(rec)[:12]}")


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
    """"image" / "video" for a typed (or untyped, keyed) media part, None for anything else."""
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


def _read_media(ref: Any, i: int, ctx: _Context, kind: str = "image") -> tuple[bytes, str]:
    """(encoded bytes, where they came from) of one image (or ``kind="video"``) value."""
    if isinstance(ref, memoryview):
        ref = ref.tobytes()
    if isinstance(ref, (bytes, bytearray)):
        _check_size(len(ref), f"{kind} {i}: inline bytes", ctx)
        return bytes(ref), "inline bytes"
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            data, _ = _read_media(ref["bytes"], i, ctx, kind)
            return data, f"bytes of {ref['path']}" if ref.get("path") else "inline bytes"
        for key in ("path", "url", kind, f"{kind}_url"):
            if ref.get(key) not in (None, ""):
                return _read_media(ref[key], i, ctx, kind)
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: dict without bytes/path ({sorted(ref)})")
    if not isinstance(ref, str):
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: {type(ref).__name__} value")
    if ref.startswith("data:"):
        _check_size(len(ref) * 3 // 4, f"{kind} {i}: data URI", ctx)
        try:
            return base64.b64decode(ref.split(",", 1)[1], validate=False), "data URI"
        except (IndexError, binascii.Error, ValueError) as exc:
            raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: bad data URI ({exc})") from None
    if ref.startswith(("http://", "https://")):
        raise SampleSkipped(f"remote_{kind}", f"{kind} {i}: {ref[:120]}")
    if "\x00" in ref:
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: the path holds a NUL byte ({ref[:120]!r})")
    path = Path(ref[7:] if ref.startswith("file://") else ref)
    relative = not path.is_absolute()
    if relative:
        path = Path(ctx.image_root) / path
    try:
        return _read_file(path, i, ctx, kind), str(path)
    except SampleSkipped as skip:
        if relative and skip.reason == f"missing_{kind}":
            raise _MissingRelative(skip.reason, skip.detail) from None
        raise
    except UnicodeEncodeError:
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: the path is not valid text ({ref[:120]!r})") from None


class _MissingRelative(SampleSkipped):
    """A ``missing_image`` skip of a relative path (counted for the --image-root hint)."""


def _check_size(size: int, what: str, ctx: _Context) -> None:
    if size > ctx.max_media_bytes:
        raise SampleSkipped("media_too_large", f"{what}: {_mb(size)} > --max-media-mb {ctx.max_media_bytes >> 20}")


def _read_file(path: Path, i: int, ctx: _Context, kind: str = "image") -> bytes:
    """The bytes of one image (or video) file, read only when it resolves inside ``ctx.roots``, is a
    regular file no larger than the cap and starts with an image (video container) header."""
    what = f"{kind} {i}: {path}"
    real = os.path.realpath(path)
    if not ctx.allow_outside and not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in ctx.roots):
        raise SampleSkipped("path_outside_root", f"{what} resolves to {real}, outside {' and '.join(ctx.roots)} "
                            "(pass --allow-outside-paths to read it)")
    try:
        _check_regular(os.stat(real), what, ctx)
        # O_NOFOLLOW: a symlink swapped in after realpath fails instead of leading out of the roots
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SampleSkipped(f"missing_{kind}", f"{what} not found") from None
    except OSError as exc:
        raise SampleSkipped(f"unreadable_{kind}", f"{what}: {exc.strerror or exc}") from None
    try:
        _check_regular(os.fstat(fd), what, ctx)  # what was opened, should the path have changed meanwhile
        head = _read_upto(fd, HEADER_BYTES)
        if not (_looks_like_image if kind == "image" else _looks_like_video)(head):
            reason = "not_an_image" if kind == "image" else "not_a_video"
            raise SampleSkipped(reason, f"{what}: its first bytes are no {kind} header")
        data = head + _read_upto(fd, ctx.max_media_bytes + 1 - len(head))
        _check_size(len(data), what, ctx)
        return data
    except OSError as exc:
        raise SampleSkipped(f"unreadable_{kind}", f"{what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _check_regular(st: os.stat_result, what: str, ctx: _Context) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        raise SampleSkipped("not_a_regular_file", f"{what} is {kind}")
    _check_size(st.st_size, what, ctx)


def _read_upto(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _looks_like_image(head: bytes) -> bool:
    """An image header among the first bytes: a known magic number, else a format PIL names."""
    if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return True
    from PIL import Image

    try:
        with Image.open(io.BytesIO(head)):
            return True
    except Exception:  # UnidentifiedImageError, or a plugin failing on a non-image
        return False


def _looks_like_video(head: bytes) -> bool:
    """A video container header: an MP4/MOV box, Matroska/WebM's EBML magic, or RIFF AVI."""
    return (head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip") or head.startswith(b"\x1aE\xdf\xa3")
            or (head[:4] == b"RIFF" and head[8:12] == b"AVI "))


def _sniff_video(data: bytes, what: str) -> str:
    """Member extension of a video file, verified by its header (what the loader reads before
    costing it): a readable video stream with a frame rate, a size and at least 2 frames."""
    from energon_pack.video.probe import open_container, probe_video
    from energon_pack.video.sampling import FrameSampling, smart_nframes

    try:
        header = probe_video(data)
        smart_nframes(header.num_frames, header.fps, FrameSampling())
        with open_container(data) as container:
            name = container.format.name
    except SampleSkipped as skip:
        raise SampleSkipped(skip.reason, f"{what}: {skip.detail}") from None
    ext = VIDEO_FORMAT_EXTENSIONS.get(name)
    if ext is None:
        raise SampleSkipped("not_a_video", f"{what}: container {name!r} is none the loader reads (mp4/mov, mkv/webm, avi)")
    return ext


#: JPEG quality of the frames ``--layout bridge`` writes for a video
BRIDGE_FRAME_QUALITY = 95


def sampled_jpeg_frames(data: bytes, what: str) -> list[bytes]:
    """The frames qwen-vl-utils' default sampling takes from a video file, as JPEG bytes (Bridge's
    frame-list layout); SampleSkipped ``corrupt_video`` when decoding fails."""
    from energon_pack.video import FrameSampling, decode_frames, probe_video, sample_frame_indices, smart_nframes

    header = probe_video(data)
    indices = sample_frame_indices(header.num_frames, smart_nframes(header.num_frames, header.fps, FrameSampling()))
    frames = []
    try:
        for image in decode_frames(data, indices):
            buf = io.BytesIO()
            image.save(buf, format="JPEG", quality=BRIDGE_FRAME_QUALITY, subsampling=0)  # 4:4:4: no chroma loss
            frames.append(buf.getvalue())
    except SampleSkipped as skip:
        raise SampleSkipped(skip.reason, f"{what}: {skip.detail}") from None
    return frames


def _sniff(data: bytes, what: str, verify: str) -> str:
    """Member extension of encoded image bytes (PIL header read; full decode with verify='decode')."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise SampleSkipped("corrupt_image", f"{what}: empty")
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, (w, h) = img.format, img.size
            if verify == "decode":
                img.load()
    except UnidentifiedImageError:
        raise SampleSkipped("corrupt_image", f"{what}: not an image PIL recognises ({len(data)} bytes)") from None
    except Exception as exc:  # PIL raises many types for garbage
        raise SampleSkipped("corrupt_image", f"{what}: {type(exc).__name__}: {exc}"[:240]) from None
    if w <= 0 or h <= 0:
        raise SampleSkipped("corrupt_image", f"{what}: zero size {w}x{h}")
    ext = PIL_EXTENSIONS.get(fmt or "")
    if ext is None:
        raise SampleSkipped("unsupported_image_format", f"{what}: {fmt}")
    return ext


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return f"<{len(obj)} bytes>"
    return str(obj)


def build_sample(rec: Any, key: str, ctx: _Context) -> tuple[dict, int, int, int, int]:
    """One record -> (webdataset fields, image count, image bytes, video count, video bytes);
    SampleSkipped when unusable."""
    if not isinstance(rec, dict):
        raise SampleSkipped("bad_record", f"record is a {type(rec).__name__}, not an object")
    check_depth(rec)
    conv_key, turns = _conversation_of(rec, ctx.shape)
    turns, part_sources, video_part_sources = _split_media_parts(turns)
    refs = _media_refs(rec, _IMAGE_KEYS) or [s for s in part_sources if s is not None]
    video_refs = _media_refs(rec, _VIDEO_KEYS) or [s for s in video_part_sources if s is not None]
    dropped = (*_IMAGE_KEYS, *_VIDEO_KEYS, *_CONVERSATION_KEYS, "texts", *(ALPACA_FIELDS if conv_key not in rec else ()))
    doc = {k: v for k, v in rec.items() if k not in dropped}
    doc[conv_key] = turns
    try:
        raw = json.dumps(doc, ensure_ascii=False, default=_json_default).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SampleSkipped("invalid_text", f"not encodable as UTF-8 ({exc.reason} at {exc.start}: "
                            f"{exc.object[max(0, exc.start - 20):exc.end + 20]!r})") from None
    # the loader's structural rules, on exactly what it will read: what passes here, it takes
    messages = normalize_conversation(decode_json_record(raw))
    check_conversation(messages, len(refs), len(video_refs))
    images = []
    for i, ref in enumerate(refs):
        data, origin = _read_media(ref, i, ctx)
        images.append((data, _sniff(data, f"image {i} ({origin})", ctx.verify)))
    videos = []  # copied byte for byte, verified by their header
    for i, ref in enumerate(video_refs):
        data, origin = _read_media(ref, i, ctx, "video")
        videos.append((data, _sniff_video(data, f"video {i} ({origin})")))
    fields = {"__key__": key, "json": raw}
    if ctx.layout == "bridge":
        fields["jpgs"] = pickle.dumps([d for d, _ in images], protocol=4)
        fields["videos"] = pickle.dumps([sampled_jpeg_frames(d, f"video {i}") for i, (d, _) in enumerate(videos)],
                                        protocol=4)
    else:
        for i, (data, ext) in enumerate(images):
            fields[f"{i}.{ext}"] = data
        for i, (data, ext) in enumerate(videos):
            fields[f"{i}.{ext}"] = data
    return fields, len(images), sum(len(d) for d, _ in images), len(videos), sum(len(d) for d, _ in videos)


# ------------------------------------------------------------------------------------ chunks
@dataclass
class _ChunkResult:
    index: int
    records: int = 0
    written: int = 0
    blank: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)
    images: int = 0
    image_bytes: int = 0
    videos: int = 0
    video_bytes: int = 0
    missing_relative: int = 0  # missing_image skips of a relative path
    tar: str | None = None
    tar_bytes: int = 0


def _convert_chunk(ctx: _Context, index: int, container: str, items: list) -> _ChunkResult:
    """Convert one chunk of records into one tar under ``ctx.tmp_dir`` (runs in a worker process)."""
    import webdataset as wds

    res = _ChunkResult(index)
    path = Path(ctx.tmp_dir) / f"chunk-{index:06d}.tar"
    with wds.TarWriter(str(path), mtime=0, encoder=False) as sink:
        for rec_index, where, payload in items:
            res.records += 1
            try:
                if isinstance(payload, SampleSkipped):
                    raise payload
                rec = decode_json_record(payload) if isinstance(payload, (bytes, bytearray)) else payload
                fields, nimages, nbytes, nvideos, nvbytes = build_sample(rec, f"{rec_index:09d}", ctx)
            except Exception as exc:  # any single bad record is a counted skip, never the end of the run
                skip = exc if isinstance(exc, SampleSkipped) else \
                    SampleSkipped("unexpected_error", f"{type(exc).__name__}: {str(exc)[:200]}")
                res.skipped[skip.reason] += 1
                res.missing_relative += isinstance(skip, _MissingRelative)
                ex = res.examples.setdefault(skip.reason, [])
                if len(ex) < MAX_EXAMPLES:
                    ex.append(f"{where}: {skip.detail}" if skip.detail else where)
                continue
            sink.write(fields)
            res.written += 1
            res.images += nimages
            res.image_bytes += nbytes
            res.videos += nvideos
            res.video_bytes += nvbytes
    if res.written:
        res.tar, res.tar_bytes = str(path), path.stat().st_size
    else:
        path.unlink()
    return res


def _iter_chunks(src: _Source, size: int) -> Iterator[tuple[int, list, int]]:
    """(chunk index, [(record index, where, payload)], blank lines) in source order."""
    chunk, blank, n, index = [], 0, 0, 0
    for where, payload in _iter_records(src):
        if payload is _BLANK:
            blank += 1
            continue
        chunk.append((n, where, payload))
        n += 1
        if len(chunk) == size:
            yield index, chunk, blank
            chunk, blank, index = [], 0, index + 1
    if chunk or blank:
        yield index, chunk, blank


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


# ------------------------------------------------------------------------------------ output folder
def _lock_out_dir(out: Path) -> int:
    """Create ``out`` if needed and hold an exclusive ``flock`` on it (released when the fd is
    closed or the process dies, so a killed run leaves no stale lock); ConfigError when another
    convert holds it."""
    if out.exists() and not out.is_dir():
        raise ConfigError("out_dir", f"{out} is a file", "pass a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError("out_dir", f"cannot write to {out}: {exc.strerror or exc}", "choose a writable folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError("out_dir", f"another energon-pack convert is writing to {out}",
                          "wait for it to finish, or choose another folder") from None
    return fd


def _write_manifest(out: Path, names: list) -> None:
    """Record (atomically) the top-level names this run writes, before it writes them."""
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps({"written_by": "energon-pack convert", "names": sorted(set(names) | set(_FIXED))}) + "\n")
    os.replace(tmp, out / MANIFEST_FILE)


def _owned_names(out: Path) -> set | None:
    """The names a previous convert listed in its manifest (plus Energon's files for its shards); None without one."""
    try:
        names = set(json.loads((out / MANIFEST_FILE).read_text())["names"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    shards = [n for n in names if n.endswith(".tar")]
    return names | {MANIFEST_FILE, MANIFEST_FILE + ".tmp"} | {s + x for s in shards for x in _ENERGON_SUFFIXES}


def _prepare_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse a folder convert did not write; with ``overwrite``, delete exactly what a previous run listed."""
    entries = list(out.iterdir())
    if entries:
        owned = _owned_names(out)
        foreign = sorted(p.name for p in entries if owned is None or p.name not in owned
                         or (p.is_dir() and not p.is_symlink() and p.name not in _OWN_DIRS))
        if foreign:
            raise ConfigError("out_dir", f"{out} is not empty and not an energon-pack convert output (it holds "
                              f"{', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''})",
                              "choose a new or empty folder (convert deletes only what its manifest "
                              f"{MANIFEST_FILE} lists)")
        if not overwrite:
            if (out / SUMMARY_FILE).exists():
                try:
                    done = json.loads((out / SUMMARY_FILE).read_text())
                    what = f"{done['written']} samples from {done['source']}"
                except (OSError, ValueError, KeyError):
                    what = "a finished conversion"
                raise ConfigError("out_dir", f"{out} already holds a finished conversion ({what})",
                                  "pass --overwrite (overwrite=True) to convert again, or choose another folder")
            raise ConfigError("out_dir", f"{out} holds an interrupted conversion",
                              "pass --overwrite (overwrite=True) to start over, or choose another folder")
        for p in sorted(entries, key=lambda p: p.name == MANIFEST_FILE):  # the manifest last
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    try:
        _write_manifest(out, [])
        (out / IN_PROGRESS_FILE).write_text(f"energon-pack convert started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        (out / TMP_DIR).mkdir()
    except OSError as exc:
        raise ConfigError("out_dir", f"cannot write to {out}: {exc.strerror or exc}", "choose a writable folder") from None


# ------------------------------------------------------------------------------------ convert
def convert(
    source: str | Path,
    out_dir: str | Path,
    *,
    image_root: str | Path | None = None,
    layout: str = "ours",
    format: str = "auto",
    samples_per_shard: int = 1000,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    verify: str = "header",
    prepare_workers: int = 2,
    allow_outside_paths: bool = False,
    max_media_mb: float = DEFAULT_MAX_MEDIA_MB,
) -> ConvertSummary:
    """Convert ``source`` (LLaVA / ShareGPT JSON or JSONL, OpenAI-messages JSONL, Parquet) into
    Energon-prepared WebDataset shards in ``out_dir``; returns a :class:`ConvertSummary`.

    ``workers`` processes (default: all CPUs; 0 or 1 converts in this process) convert chunks of
    ``samples_per_shard`` records, one shard per chunk: the output does not depend on
    ``workers``. A finished output is refused unless ``overwrite``, which deletes only what the
    previous run's manifest lists; a folder holding anything else, or locked by another convert,
    is always refused. ``verify="decode"`` fully decodes every image
    (catches truncated files) instead of reading its header only.

    Image paths are read only when they resolve (symlinks and ``file://`` included) inside the
    source's folder or ``image_root`` (``allow_outside_paths`` lifts that), name a regular file
    of at most ``max_media_mb`` MB and start with an image header; anything else is a counted skip.
    """
    t0 = time.perf_counter()
    if layout not in LAYOUTS:
        raise ConfigError("layout", f"unknown layout {layout!r}", f"use one of {', '.join(LAYOUTS)}")
    if verify not in VERIFY_MODES:
        raise ConfigError("verify", f"unknown mode {verify!r}", f"use one of {', '.join(VERIFY_MODES)}")
    if not isinstance(max_media_mb, (int, float)) or not 0 < max_media_mb < 1 << 20:
        raise ConfigError("max_media_mb", f"must be a positive number of MB, got {max_media_mb!r}", "pass e.g. 64")
    if not isinstance(samples_per_shard, int) or samples_per_shard < 1:
        raise ConfigError("samples_per_shard", f"must be a positive integer, got {samples_per_shard!r}", "pass e.g. 1000")
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    if workers < 0:
        raise ConfigError("workers", f"must be >= 0, got {workers}", "pass 0 (in process) or a process count")
    for knob, value in (("source", source), ("image_root", image_root)):
        if value is not None and is_remote(value):
            raise ConfigError(knob, f"{value} is in object storage; convert reads its source and the images it names "
                              "from local disk only", "copy them here first; OUT may be an msc:// prefix")
    if is_remote(out_dir):
        return _convert_to_object_storage(
            source, str(out_dir), image_root=image_root, layout=layout, format=format,
            samples_per_shard=samples_per_shard, workers=workers, progress=progress, overwrite=overwrite,
            verify=verify, prepare_workers=prepare_workers, allow_outside_paths=allow_outside_paths,
            max_media_mb=max_media_mb)
    source, out = Path(source), Path(out_dir)
    src = _open_source(source, format)
    root_given = image_root is not None
    if image_root is None:
        image_root = source if source.is_dir() else source.parent
    image_root = Path(image_root)
    if not image_root.is_dir():
        raise ConfigError("image_root", f"{image_root} is not a folder", "pass the folder image paths are relative to")
    if out.resolve() == source.resolve():
        raise ConfigError("out_dir", f"{out} is the source", "write to another folder")
    lock = _lock_out_dir(out)
    try:
        _prepare_out_dir(out, overwrite)
        roots = tuple(dict.fromkeys(os.path.realpath(p) for p in (image_root, source if source.is_dir() else source.parent)))
        ctx = _Context(str(image_root.resolve()), layout, src.shape, verify, str(out / TMP_DIR), roots,
                       bool(allow_outside_paths), int(max_media_mb * (1 << 20)))
        summary = ConvertSummary(str(source), str(out), src.shape, src.detected, layout, workers=max(1, workers))
        results = _run(ctx, src, samples_per_shard, workers, progress)

        examples: dict = {}
        skipped: Counter = Counter()
        names = [SHARD_NAME % i for i in range(sum(1 for res in results if res.tar))]
        _write_manifest(out, names)
        shard, missing_relative = 0, 0
        for res in results:  # chunk order: deterministic whatever the worker count
            missing_relative += res.missing_relative
            summary.records += res.records
            summary.written += res.written
            summary.blank_lines += res.blank
            summary.images += res.images
            summary.image_bytes += res.image_bytes
            summary.videos += res.videos
            summary.video_bytes += res.video_bytes
            skipped.update(res.skipped)
            for reason, ex in res.examples.items():
                examples.setdefault(reason, []).extend(ex[: MAX_EXAMPLES - len(examples.get(reason, []))])
            if res.tar:
                os.replace(res.tar, out / (SHARD_NAME % shard))
                summary.bytes += res.tar_bytes
                shard += 1
        shutil.rmtree(out / TMP_DIR, ignore_errors=True)
        summary.shards = shard
        summary.skipped = dict(sorted(skipped.items()))
        summary.examples = {k: examples[k] for k in summary.skipped}
        if missing_relative and not root_given:
            summary.hints.append(f"{missing_relative} record(s) skipped as missing_image: their relative image paths "
                                 f"were looked up in {image_root} (the source's folder); pass --image-root DIR, the "
                                 "folder they are relative to")
        if summary.written == 0:  # nothing to keep: the folder is left empty
            for name in (IN_PROGRESS_FILE, MANIFEST_FILE):
                (out / name).unlink(missing_ok=True)
            detail = "; ".join(f"{r}={n} (e.g. {summary.examples[r][0]})" for r, n in summary.skipped.items()) or "no records"
            raise ConfigError("source", f"none of the {summary.records} records of {source} could be converted: {detail}",
                              "; ".join(summary.hints) or "check --image-root and the skip reasons")
        with contextlib.redirect_stdout(io.StringIO()):  # Energon prints its progress
            prepare_webdataset(out, workers=max(1, min(prepare_workers, shard)))
        if src.detected.startswith(f"{src.shape} (JSON array,"):  # streamed: the count is known now
            summary.detected = src.detected.replace("JSON array", f"JSON array of {summary.records} records", 1)
        summary.seconds = round(time.perf_counter() - t0, 3)
        (out / SUMMARY_FILE).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
        (out / IN_PROGRESS_FILE).unlink(missing_ok=True)
        return summary
    finally:
        os.close(lock)


def _convert_to_object_storage(source: str | Path, out: str, *, overwrite: bool, **kw: Any) -> ConvertSummary:
    """:func:`convert` into an ``msc://`` prefix: converted and prepared in a temporary local folder
    (removed after), then uploaded as it is. A prefix that holds objects is refused before anything is
    converted (``overwrite`` does not apply: a remote output is never deleted)."""
    import tempfile

    with store_errors(out):
        held = list_names(out)
    if held:
        raise ConfigError("out_dir", f"{out} already holds {len(held)} object(s) (e.g. {held[0]})"
                          + ("; --overwrite replaces local outputs only" if overwrite else ""),
                          "write to a new prefix")
    with tempfile.TemporaryDirectory(prefix="energon_pack_convert_") as tmp:
        local = Path(tmp) / "out"
        summary = convert(source, local, **kw)
        summary.out_dir = out
        (local / SUMMARY_FILE).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
        with store_errors(out):
            upload_tree(local, out)
    return summary


def _run(ctx: _Context, src: _Source, size: int, workers: int, progress: bool) -> list[_ChunkResult]:
    from tqdm import tqdm

    results: list[_ChunkResult] = []
    chunks = _iter_chunks(src, size)
    bar_kw = dict(total=src.records, unit="rec", desc="convert", disable=not progress, file=sys.stderr, smoothing=0.1)

    def done(res: _ChunkResult, bar) -> None:
        results.append(res)
        bar.update(res.records)
        bar.set_postfix(written=sum(r.written for r in results),
                        skipped=sum(sum(r.skipped.values()) for r in results), refresh=False)

    if workers <= 1:
        with tqdm(**bar_kw) as bar:
            for index, items, blank in chunks:
                res = _convert_chunk(ctx, index, src.container, items)
                res.blank = blank
                done(res, bar)
    else:
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        blanks: dict[int, int] = {}
        with ProcessPoolExecutor(max_workers=workers) as pool, tqdm(**bar_kw) as bar:
            pending: set = set()
            for index, items, blank in chunks:
                blanks[index] = blank
                pending.add(pool.submit(_convert_chunk, ctx, index, src.container, items))
                if len(pending) >= 2 * workers:  # bound what is held in memory
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        done(fut.result(), bar)
            for fut in wait(pending).done:
                done(fut.result(), bar)
        for res in results:
            res.blank = blanks[res.index]
    return sorted(results, key=lambda r: r.index)


# ------------------------------------------------------------------------------------ command line
class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown for every option that has one (flags and None defaults say it in words)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser(prog: str = "energon-pack convert") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=_HelpFormatter,
        description="Convert LLaVA / ShareGPT JSON(L), OpenAI-messages JSONL, LLaMA-Factory files (alpaca; ShareGPT\n"
                    "with function_call / observation turns and a tools string) or Parquet VLM SFT data into\n"
                    "Energon-prepared WebDataset shards (images keep their original bytes). Each written record has\n"
                    "passed the loader's own structural checks; the loader's remaining skips depend on its settings\n"
                    "(tokenizer, preset, limits) and are counted there.",
        epilog="examples:\n"
               "  energon-pack convert llava.json out --image-root /datasets/llava/images\n"
               "  energon-pack convert alpaca_en_demo.json out            # LLaMA-Factory alpaca (+ history, images)\n"
               "  energon-pack convert glaive_toolcall_en_demo.json out   # LLaMA-Factory tool calls\n\n"
               "skip reasons (counted in the summary, up to 3 examples each):\n"
               + "\n".join(f"  {k:<25} {v}" for k, v in SKIP_REASONS.items()),
    )
    p.add_argument("source", help="a .json / .jsonl file, a .parquet file, or a folder of .parquet files")
    p.add_argument("out", help="output folder (new or empty; a finished output needs --overwrite), or an msc:// prefix "
                   "without objects (converted locally in a temporary folder, then uploaded)")
    p.add_argument("--image-root", default=None,
                   help="folder that relative image paths resolve against (default: the source file's folder; "
                        "images missing there are called out in a hint line)")
    p.add_argument("--layout", choices=LAYOUTS, default="ours",
                   help="ours: json + 0.jpg, 1.png...; bridge: json + pickled jpgs/videos (Megatron-Bridge ChatML)")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="input format (auto: detected from the content; alpaca: instruction + output records)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (0: in this process; defaults to the CPU count)")
    p.add_argument("--samples-per-shard", type=int, default=1000, help="records per chunk; one shard per chunk")
    p.add_argument("--verify", choices=VERIFY_MODES, default="header",
                   help="header: PIL header read per image; decode: full decode (catches truncated images, slower)")
    p.add_argument("--allow-outside-paths", action="store_true",
                   help="read image paths that resolve outside the source folder and --image-root (absolute paths, "
                        "../, symlinks); by default they are path_outside_root skips")
    p.add_argument("--max-media-mb", type=float, default=DEFAULT_MAX_MEDIA_MB,
                   help="largest image file read; larger ones are media_too_large skips")
    p.add_argument("--overwrite", action="store_true", help="replace a previous convert output in OUT (a folder convert did not write is never touched)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    p.add_argument("--debug", action="store_true", help="show the traceback of a configuration error (default: a one-line message, exit status 2)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``energon-pack convert SOURCE OUT [...]``: 0 on success, 2 on a configuration error."""
    args = build_parser().parse_args(argv)
    try:
        summary = convert(args.source, args.out, image_root=args.image_root, layout=args.layout, format=args.format,
                          samples_per_shard=args.samples_per_shard, workers=args.workers,
                          progress=not args.no_progress, overwrite=args.overwrite, verify=args.verify,
                          allow_outside_paths=args.allow_outside_paths, max_media_mb=args.max_media_mb)
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"energon-pack convert: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.format_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
