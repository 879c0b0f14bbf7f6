"""ChatML WebDataset samples: the crude-sample cooker and the parser of its raw fields.

Supported shard layouts (one tar member per field, webdataset naming ``KEY.FIELD``):

- ours: ``json`` holds the conversation (a list of turns, or a dict with ``messages`` /
  ``conversations`` / ``conversation``); images are ``jpg``/``png``/... members, several per
  sample as ``0.jpg``, ``1.png``, ... (ordered by name, numbers as numbers; extensions in any
  case: ``0.JPG`` is an image); video files are ``mp4``/``webm``/``mkv``/... members, ordered
  the same way (kept encoded: the task encoder reads their headers, then decodes sampled frames);
- Megatron-Bridge's ChatML layout: ``conversation.json`` (or ``json``), ``jpgs`` / ``imgs`` (a
  pickled list of encoded images) and ``videos`` (a pickled list of frame lists).

Pickled members come from the dataset, so they are never handed to ``pickle.loads``: a
restricted unpickler loads built-in containers, bytes, str and numbers only (no global but safe
twins of the two protocols 0-2 spell bytes with, so no ``__reduce__`` payload can run), then the
shape is checked. Anything else is the counted skip
``unsafe_pickle``. ``ENERGON_PACK_ALLOW_UNSAFE_PICKLE=1`` loads exotic pickles (numpy frames,
tensors) with plain ``pickle``, which runs any code the dataset's author put there.

The cooker copies raw bytes only and cannot fail; parsing happens in the task encoder's
pre-encode step, where a broken sample becomes a counted skip with a reason. A dataset whose
records share media (``energon-pack convert``'s default: each media file stored once,
:mod:`energon_pack.energon.media_store`) says so in its ``dataset.yaml`` subflavors, which select
:func:`cook_chatml_stored_once`: it reads the shared members back through Energon's primary
``FileStore``, so the sample is the one an inline dataset holds; :func:`cook_chatml` reads them
through the store of the sample's own dataset when no primary store is given (other encoders'
cookers, a ``dataset.yaml`` without the subflavor).
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Callable
from typing import Any

from megatron.energon import Cooker, Sample, basic_sample_keys, cooker, edataclass, stateless

from energon_pack.errors import SampleSkipped
from energon_pack.records import decode_json_record
from energon_pack.video.probe import VIDEO_EXTENSIONS

from .media_store import (
    MEDIA_STORE_SUBFLAVOR,
    REFS_ERROR_FIELD,
    REFS_FIELD,
    STORED_ONCE,
    dataset_store,
    resolve_media_refs,
)

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
CONVERSATION_FIELDS = ("json", "conversation.json", "conversation", "messages.json")
PICKLED_IMAGE_FIELDS = ("jpgs", "imgs", "images")
#: Set to ``1`` to unpickle media members with plain ``pickle`` (runs code from the dataset).
ALLOW_UNSAFE_PICKLE_ENV = "ENERGON_PACK_ALLOW_UNSAFE_PICKLE"
# Energon hands the cooker tar member suffixes as stored (``x.0.JPG`` -> field ``0.JPG``; no
# lower-casing), so extensions match case-insensitively.
_IMAGE_FIELD = re.compile(rf"^(?:.*\.)?(?:{'|'.join(IMAGE_EXTENSIONS)})$", re.IGNORECASE)
_VIDEO_FIELD = re.compile(rf"^(?:.*\.)?(?:{'|'.join(VIDEO_EXTENSIONS)})$", re.IGNORECASE)


@edataclass
class ChatMLSample(Sample):
    """A ChatML sample as stored: raw conversation bytes and raw media fields."""

    fields: dict


def _cook(crude: dict, store: Callable[[], Any]) -> ChatMLSample:
    """The sample's raw fields; shared media read from ``store()`` (opened only for a record that shares some)."""
    fields = {k: v for k, v in crude.items() if not k.startswith("__")}
    if REFS_FIELD in fields:
        fields = resolve_media_refs(fields, store())
    return ChatMLSample(**basic_sample_keys(crude), fields=fields)


@stateless
def cook_chatml(crude: dict) -> ChatMLSample:
    """Crude WebDataset dict -> :class:`ChatMLSample` (raw bytes only, so it never fails). Media a record shares
    with an earlier one are read back through Energon's store of the sample's own dataset
    (:func:`~energon_pack.energon.media_store.dataset_store`): for encoders whose cookers Energon gives no primary
    store (Megatron-Bridge's), or a dataset whose ``dataset.yaml`` lost its subflavor."""
    return _cook(crude, lambda: dataset_store(crude))


@stateless
@cooker(need_primary=True)
def cook_chatml_stored_once(crude: dict, primary: Any, **_aux: Any) -> ChatMLSample:
    """:func:`cook_chatml` for a dataset whose records share media: the members named by a record's
    ``media_refs.json`` are read from ``primary`` (Energon's random-access store of this dataset) and put back
    under their own field names (:func:`~energon_pack.energon.media_store.resolve_media_refs`; never raises)."""
    return _cook(crude, lambda: primary)


#: selects :func:`cook_chatml_stored_once` for a dataset whose ``dataset.yaml`` says its records share media
STORED_ONCE_COOKER = Cooker(cook_chatml_stored_once, has_subflavors={MEDIA_STORE_SUBFLAVOR: STORED_ONCE})
#: the stored-once cooker for datasets whose ``dataset.yaml`` says so, the plain one for every other
CHATML_COOKERS = [STORED_ONCE_COOKER, Cooker(cook_chatml)]


def _natural_key(name: str) -> list:
    """``2.jpg`` before ``10.JPG``: digit runs compare as numbers, the rest case-insensitively."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def parse_chatml(sample: ChatMLSample) -> tuple[Any, list[bytes], list[bytes | list[bytes]]]:
    """Conversation object, encoded images and videos of a stored sample: video file members
    (encoded bytes, in name order), then Bridge's pickled ``videos`` (frame lists).

    Raises :class:`SampleSkipped` with reason ``missing_conversation``, ``invalid_json`` (or
    ``invalid_utf8``, ``empty_line``), ``unsafe_pickle`` or ``bad_media`` (also: a shared media
    reference that could not be read) for samples that cannot be used.
    """
    fields = sample.fields
    if REFS_ERROR_FIELD in fields:
        raise SampleSkipped("bad_media", fields[REFS_ERROR_FIELD])
    raw = next((fields[k] for k in CONVERSATION_FIELDS if k in fields), None)
    if raw is None:
        raise SampleSkipped("missing_conversation", f"no field among {CONVERSATION_FIELDS} in {sorted(fields)}")
    conversation = decode_json_record(raw) if isinstance(raw, (bytes, bytearray, str)) else raw
    images = [fields[k] for k in sorted(fields, key=_natural_key) if _IMAGE_FIELD.match(k)]
    videos: list[bytes | list[bytes]] = [fields[k] for k in sorted(fields, key=_natural_key) if _VIDEO_FIELD.match(k)]
    for name in PICKLED_IMAGE_FIELDS:
        if name in fields:
            images.extend(unpickle_media(fields[name], name))
    if "videos" in fields:
        videos.extend(unpickle_media(fields["videos"], "videos", frames=True))
    return conversation, images, videos


def _latin1_bytes(text: Any, encoding: Any = "latin1") -> bytes:
    """What protocols 0-2 pickle ``bytes`` as (``_codecs.encode(text, "latin1")``), and nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused(f"_codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    """What protocols 0-2 pickle ``b""`` as (``bytes()``), and nothing else."""
    if args:
        raise _Refused(f"builtins.bytes with {len(args)} argument(s)")
    return b""


#: The only globals a media pickle may name: how protocols 0-2 spell bytes, replaced by safe twins.
_BYTES_GLOBALS = {
    ("_codecs", "encode"): _latin1_bytes,
    ("builtins", "bytes"): _empty_bytes,
    ("__builtin__", "bytes"): _empty_bytes,
}


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global: only built-in containers, bytes, str and numbers load."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _BYTES_GLOBALS:
            return _BYTES_GLOBALS[module, name]
        raise _Refused(f"{module}.{name}")


class _Refused(pickle.UnpicklingError):
    """A pickle that names a global (a class or a callable)."""


def unpickle_media(raw: Any, name: str, *, frames: bool = False, allow_unsafe: bool | None = None) -> list:
    """A pickled media member -> list of encoded images (``frames=True``: list of frame lists).

    SampleSkipped ``unsafe_pickle`` when the pickle names any global (nothing in it runs),
    ``bad_media`` when it is corrupt or of another shape. ``allow_unsafe`` (default: the
    :data:`ALLOW_UNSAFE_PICKLE_ENV` variable) uses plain ``pickle`` and accepts any item type.
    """
    if allow_unsafe is None:
        allow_unsafe = os.environ.get(ALLOW_UNSAFE_PICKLE_ENV, "") == "1"
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        value = raw  # already decoded by the caller
    else:
        try:
            value = pickle.loads(raw) if allow_unsafe else _NoGlobalsUnpickler(io.BytesIO(raw)).load()
        except _Refused as exc:
            raise SampleSkipped(
                "unsafe_pickle",
                f"field {name!r} names {str(exc)[:120]}: not loaded (set "
                f"{ALLOW_UNSAFE_PICKLE_ENV}=1 only for data you trust)",
            ) from None
        except Exception as exc:  # pickle raises many types on corrupt input
            raise SampleSkipped("bad_media", f"field {name!r} is not a pickled list: {exc}"[:240]) from None
    if not isinstance(value, (list, tuple)):
        raise SampleSkipped("bad_media", f"field {name!r} holds {type(value).__name__}, expected a list")
    out = []
    for i, item in enumerate(value):
        if frames and not isinstance(item, (list, tuple)):
            raise SampleSkipped("bad_media", f"{name} {i} is {type(item).__name__}, expected a list of frames")
        items = item if frames else [item]
        bad = next((type(x).__name__ for x in items if not isinstance(x, (bytes, bytearray))), None)
        if bad is not None and not allow_unsafe:
            raise SampleSkipped("bad_media", f"{name} {i} holds {bad}, expected encoded image bytes")
        out.append(list(item) if frames else item)
    return out
