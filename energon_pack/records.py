"""Raw bytes -> JSON record, with a typed skip for each way a stored record can be broken."""

from __future__ import annotations

import json
from typing import Any

from energon_pack.errors import SampleSkipped


def decode_json_record(raw: bytes | str) -> Any:
    """The JSON value in ``raw``; SampleSkipped ``empty_line``, ``invalid_utf8`` or ``invalid_json``."""
    if isinstance(raw, (bytes, bytearray)):
        if not raw.strip():
            raise SampleSkipped("empty_line", "blank record")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SampleSkipped("invalid_utf8", str(exc)) from None
    if not raw.strip():
        raise SampleSkipped("empty_line", "blank record")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise SampleSkipped("invalid_json", str(exc)[:200]) from None
