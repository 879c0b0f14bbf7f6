"""Detect the container (JSON array, JSONL, Parquet) and record shape (LLaVA, ShareGPT, OpenAI
messages, alpaca) of a source from its content, peeking at its first records; JSON arrays are
streamed element by element (:func:`iter_json_array`), never held whole."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.records import decode_json_record

from .options import FORMATS

_CONVERSATION_KEYS = ("messages", "conversations", "conversation")
_IMAGE_KEYS = ("images", "image")


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
        raise ConfigError(
            "source",
            f"{path} does not exist",
            "pass a LLaVA/ShareGPT JSON or JSONL file, an OpenAI-messages JSONL file, or Parquet file(s)",
        )
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
        if not files:
            json_files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in (".json", ".jsonl"))
            raise ConfigError(
                "source",
                f"folder {path} holds no *.parquet files (a folder is read as Parquet files only)",
                f"pass one JSON/JSONL file: `energon-pack convert {json_files[0]} OUT`, one output folder per file"
                if json_files
                else "pass a JSON/JSONL file, a .parquet file, or a folder of .parquet files",
            )
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
        raise ConfigError(
            "format",
            f"{path} is neither JSON, JSONL nor Parquet (it starts with {head[:16]!r})",
            "pass a JSON array, a JSONL file or Parquet",
        )
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
    if buf[start : start + 1] != b"[":
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
        raise ConfigError(
            "source",
            f"{path} is nested too deeply to read as one JSON document",
            "write the records as a JSON array or one JSON object per line",
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            "source",
            f"{path} is not valid JSON: {exc}",
            "fix the file (a JSON array of records, or one JSON object per line)",
        ) from None
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if not any(k in data for k in (*_CONVERSATION_KEYS, "texts")) and len(lists) == 1:
            data = data[lists[0]]  # {"data": [records]}
        else:
            data = [data]  # a single record
    if not isinstance(data, list):
        raise ConfigError(
            "source",
            f"{path} holds a JSON {type(data).__name__}, not a list of records",
            "pass a JSON array of records or a JSONL file",
        )
    return data


def _detect_shape(records: list, path: Path) -> str:
    dicts = [r for r in records if isinstance(r, dict)]
    if not dicts:
        raise ConfigError(
            "format",
            f"no JSON object among the first records of {path}",
            "records must be objects with messages or conversations",
        )
    keys = Counter(k for r in dicts for k in r)
    if keys["messages"] >= keys["conversations"] + keys["conversation"] and keys["messages"]:
        return "messages"
    if keys["conversations"] or keys["conversation"]:
        return "llava" if keys["image"] or (not keys["images"] and _mentions_image(dicts)) else "sharegpt"
    if keys["instruction"] and keys["output"]:
        return "alpaca"
    if keys["prompt"] and keys["completion"]:  # TRL prompt/completion (KTO's too): written as messages turns
        return "messages"
    raise ConfigError(
        "format",
        f"cannot tell the record shape of {path}: first record keys {sorted(dicts[0])}",
        "records need 'messages' (OpenAI), 'conversations' (LLaVA/ShareGPT), 'instruction' + "
        "'output' (alpaca) or 'prompt' + 'completion' (TRL); pass --format to force",
    )


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
    trl = ("prompt",) if "completion" in names else ()  # TRL prompt/completion (KTO's too)
    conv = next((c for c in (*_CONVERSATION_KEYS, "texts", "instruction", *trl) if c in names), None)
    if conv is None:
        raise ConfigError(
            "format",
            f"Parquet columns {names} hold no messages / conversations / conversation / texts "
            "(nor an alpaca instruction, nor a TRL prompt + completion)",
            "the table needs a conversation column",
        )
    img = next((c for c in _IMAGE_KEYS if c in names), None)
    img_type = f" ({schemas[0].field(img).type})" if img else ""
    many = f"{len(files)} files, " if len(files) > 1 else ""
    detected = (
        f"parquet ({many}{total} rows; conversation column {conv!r}, "
        + (f"image column {img!r}{img_type}" if img else "no image column")
        + ")"
    )
    return _Source(list(files), "parquet", "parquet", detected, total, (conv, img))
