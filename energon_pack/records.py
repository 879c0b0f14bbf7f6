"""Raw bytes -> JSON record, with a typed skip for each way a stored record can be broken."""

from __future__ import annotations

import json
from typing import Any

from energon_pack.errors import SampleSkipped

#: Deepest nesting of JSON arrays/objects accepted in a record. Real conversations nest 4-6
#: levels; Python's ``json`` raises ``RecursionError`` near 1,000 levels, and anything deep
#: enough to decode can still break ``repr``, ``pickle`` (worker -> main process) or a
#: recursive walk later, so the limit is far below both.
MAX_JSON_DEPTH = 64

BOM = "\ufeff"


def decode_json_record(raw: bytes | str) -> Any:
    """The JSON value in ``raw``; SampleSkipped ``empty_line``, ``invalid_utf8``, ``invalid_json``
    (``"nested too deeply"`` past :data:`MAX_JSON_DEPTH` levels) or ``cr_line_endings``.

    A leading UTF-8 byte-order mark is ignored (editors on Windows write one on line 1).
    """
    if isinstance(raw, (bytes, bytearray)):
        if not raw.strip():
            raise SampleSkipped("empty_line", "blank record")
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SampleSkipped("invalid_utf8", str(exc)) from None
    if raw.startswith(BOM):
        raw = raw[1:]
    if not raw.strip():
        raise SampleSkipped("empty_line", "blank record")
    return loads_checked(raw)


def loads_checked(text: str) -> Any:
    """``json.loads`` that turns every failure into a counted skip, deep nesting included."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise SampleSkipped("invalid_json", f"nested too deeply (> {MAX_JSON_DEPTH} levels)") from None
    except ValueError as exc:
        if "\r" in text and "\n" not in text and str(exc).startswith("Extra data"):
            raise SampleSkipped(
                "cr_line_endings",
                f"one record holds {text.count(chr(13)) + 1} CR-separated lines: the file has old Mac (CR-only) "
                "line endings; convert it with tr '\\r' '\\n'",
            ) from None
        raise SampleSkipped("invalid_json", str(exc)[:200]) from None
    check_depth(value)
    return value


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of lists/dicts in ``value`` (iterative; stops counting past ``limit + 1``)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return deepest


def check_depth(value: Any) -> None:
    """SampleSkipped("invalid_json", "nested too deeply ...") for a value nested past the limit."""
    if json_depth(value) > MAX_JSON_DEPTH:
        raise SampleSkipped("invalid_json", f"nested too deeply (> {MAX_JSON_DEPTH} levels)")
