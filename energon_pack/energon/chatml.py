"""ChatML WebDataset samples: the crude-sample cooker and the parser of its raw fields.

Supported shard layouts (one tar member per field, webdataset naming ``KEY.FIELD``):

- ours: ``json`` holds the conversation (a list of turns, or a dict with ``messages`` /
  ``conversations`` / ``conversation``); images are ``jpg``/``png``/... members, several per
  sample as ``0.jpg``, ``1.png``, ... (ordered by name, numbers as numbers; extensions in any
  case: ``0.JPG`` is an image);
- Megatron-Bridge's ChatML layout: ``conversation.json`` (or ``json``), ``jpgs`` / ``imgs`` (a
  pickled list of encoded images) and ``videos`` (a pickled list of frame lists).

The cooker copies raw bytes only and cannot fail; parsing happens in the task encoder's
pre-encode step, where a broken sample becomes a counted skip with a reason.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

from megatron.energon import Cooker, Sample, basic_sample_keys, edataclass, stateless

from energon_pack.errors import SampleSkipped
from energon_pack.records import decode_json_record

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
CONVERSATION_FIELDS = ("json", "conversation.json", "conversation", "messages.json")
PICKLED_IMAGE_FIELDS = ("jpgs", "imgs", "images")
# Energon hands the cooker tar member suffixes as stored (``x.0.JPG`` -> field ``0.JPG``; no
# lower-casing), so extensions match case-insensitively.
_IMAGE_FIELD = re.compile(r"^(?:.*\.)?(?:%s)$" % "|".join(IMAGE_EXTENSIONS), re.IGNORECASE)


@edataclass
class ChatMLSample(Sample):
    """A ChatML sample as stored: raw conversation bytes and raw media fields."""

    fields: dict


@stateless
def cook_chatml(crude: dict) -> ChatMLSample:
    """Crude WebDataset dict -> :class:`ChatMLSample` (raw bytes only, so it never fails)."""
    fields = {k: v for k, v in crude.items() if not k.startswith("__")}
    return ChatMLSample(**basic_sample_keys(crude), fields=fields)


CHATML_COOKERS = [Cooker(cook_chatml)]


def _natural_key(name: str) -> list:
    """``2.jpg`` before ``10.JPG``: digit runs compare as numbers, the rest case-insensitively."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def parse_chatml(sample: ChatMLSample) -> tuple[Any, list[bytes], list[list[bytes]]]:
    """Conversation object, encoded images and videos (frame lists) of a stored sample.

    Raises :class:`SampleSkipped` with reason ``missing_conversation``, ``invalid_json`` (or
    ``invalid_utf8``, ``empty_line``) or ``bad_media`` for samples that cannot be used.
    """
    fields = sample.fields
    raw = next((fields[k] for k in CONVERSATION_FIELDS if k in fields), None)
    if raw is None:
        raise SampleSkipped("missing_conversation", f"no field among {CONVERSATION_FIELDS} in {sorted(fields)}")
    conversation = decode_json_record(raw) if isinstance(raw, (bytes, bytearray, str)) else raw
    images = [fields[k] for k in sorted(fields, key=_natural_key) if _IMAGE_FIELD.match(k)]
    videos: list[list[bytes]] = []
    for name in PICKLED_IMAGE_FIELDS:
        if name in fields:
            images.extend(_unpickle_list(fields[name], name))
    if "videos" in fields:
        for i, frames in enumerate(_unpickle_list(fields["videos"], "videos")):
            if not isinstance(frames, (list, tuple)):
                raise SampleSkipped("bad_media", f"video {i} is {type(frames).__name__}, expected a list of frames")
            videos.append(list(frames))
    return conversation, images, videos


def _unpickle_list(raw: Any, name: str) -> list:
    try:
        value = pickle.loads(raw) if isinstance(raw, (bytes, bytearray)) else raw
    except Exception as exc:  # pickle raises many types on corrupt input
        raise SampleSkipped("bad_media", f"field {name!r} is not a pickled list: {exc}") from None
    if not isinstance(value, (list, tuple)):
        raise SampleSkipped("bad_media", f"field {name!r} holds {type(value).__name__}, expected a list")
    return list(value)
