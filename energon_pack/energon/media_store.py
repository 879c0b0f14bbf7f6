"""Media stored once: a record that reuses an image or video another record already holds carries a reference
to that member instead of a second copy, and the loader reads the bytes back in the worker.

How it is stored (``energon-pack convert``'s default ``--media-store dedup``): each distinct media file (by the
SHA-256 of its bytes, so two paths to one file or one file under two names count once) is a member of the first
record that uses it, in source order (``000000003.0.jpg``, as an inline record holds it). A later record that uses
the same bytes holds, instead of its ``1.jpg`` member, one ``media_refs.json`` member::

    {"1.jpg": {"member": "000000003.0.jpg", "sha256": "9f2c..."}}

and the dataset's ``.nv-meta/dataset.yaml`` carries the subflavor ``energon_pack_media_store: stored_once``.

How it is read: that subflavor selects :func:`~energon_pack.energon.chatml.cook_chatml_stored_once`, a
``@cooker(need_primary=True)``: Energon hands it the dataset's own random-access ``FileStore`` (the tar members by
name, through the prepared ``index.sqlite``), and :func:`resolve_media_refs` puts the referenced bytes back under
their own field names, checked against their SHA-256. Everything after the cooker sees the sample an inline
convert would have written (bytes only; nothing decoded before a pack is selected), so packs, the restore keys
and exact resume are those of the inline dataset. Why this mechanism: it needs no Metadataset (``aux:``) and no
second dataset, so ``get_train_dataset(out_dir, ...)`` keeps working on the folder; every sample of the stream is
a record (no media samples to count or skip), and the split, the index and object storage are Energon's own.

A cooker without Energon's primary store (Megatron-Bridge's encoder reads our layout through
:func:`~energon_pack.energon.chatml.cook_chatml`; a ``dataset.yaml`` that a plain ``energon prepare`` rewrote
without the subflavor) reads the same members through :func:`dataset_store`, the store of the sample's own dataset.

No Energon import at module level: ``convert`` reads these names without starting the loader's dependencies.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

#: the dataset.yaml subflavor that selects the resolving cooker, and its value
MEDIA_STORE_SUBFLAVOR = "energon_pack_media_store"
STORED_ONCE = "stored_once"
#: the member of a record that names the media it shares with an earlier record
REFS_FIELD = "media_refs.json"
#: where :func:`resolve_media_refs` leaves why a reference could not be read (a counted ``bad_media`` skip later)
REFS_ERROR_FIELD = "__media_refs_error__"
#: ``.nv-meta/dataset.yaml`` of a converted dataset that holds references
STORED_ONCE_DATASET_YAML = (
    f"__module__: megatron.energon\n__class__: CrudeWebdataset\nsubflavors:\n  {MEDIA_STORE_SUBFLAVOR}: {STORED_ONCE}\n"
)


def sha256_hex(data: bytes) -> str:
    """The content key of a media file: the SHA-256 of its bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def encode_refs(refs: dict[str, tuple[str, str]]) -> bytes:
    """``{field: (member, sha256)}`` -> the bytes of a :data:`REFS_FIELD` member (sorted keys: the same records give
    the same shards)."""
    doc = {field: {"member": member, "sha256": sha} for field, (member, sha) in refs.items()}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


_STORES: dict[str, Any] = {}  # dataset path -> its WebdatasetFileStore, one per process (opened in the worker)


def dataset_store(crude: dict) -> Any:
    """Energon's random-access store (``WebdatasetFileStore``) of the dataset a crude sample came from (its
    ``__sources__``), one per dataset and process: for cookers to which Energon hands no primary store. None when
    the sample names no dataset or the store cannot be opened (its references then skip as ``bad_media``)."""
    sources = crude.get("__sources__") or ()
    path = getattr(sources[0], "dataset_path", None) if sources else None
    if path is None:
        return None
    store = _STORES.get(str(path))
    if store is None:
        from megatron.energon.cache.file_store import WebdatasetFileStore

        try:
            store = _STORES[str(path)] = WebdatasetFileStore(path)
        except Exception:  # not a prepared webdataset: the references are reported, not raised
            return None
    return store


def resolve_media_refs(fields: dict, store: Any) -> dict:
    """``fields`` with its :data:`REFS_FIELD` member replaced by the members it names, read from ``store`` (Energon's
    ``FileStore`` of the dataset: ``store[name] -> (bytes, source info)``) and checked against their SHA-256. It
    never raises: a broken reference leaves its reason under :data:`REFS_ERROR_FIELD`, which
    :func:`~energon_pack.energon.chatml.parse_chatml` turns into a counted ``bad_media`` skip."""
    raw = fields.get(REFS_FIELD)
    if raw is None:
        return fields
    out = {k: v for k, v in fields.items() if k != REFS_FIELD}
    if store is None:
        out[REFS_ERROR_FIELD] = (
            f"{REFS_FIELD} names media of other records, but the sample's dataset has no readable index to read them "
            "from: prepare it (energon-pack prepare DIR) or convert again with --media-store inline"
        )
        return out
    try:
        refs = json.loads(raw) if isinstance(raw, (bytes, bytearray, str)) else raw
        if not isinstance(refs, dict):
            raise ValueError(f"holds {type(refs).__name__}, expected an object")
        for field, ref in refs.items():
            member, sha = ref["member"], ref["sha256"]
            data, _ = store[member]
            if isinstance(data, (bytes, bytearray)) and sha256_hex(data) != sha:
                raise ValueError(f"{field}: {member} does not hold the bytes of SHA-256 {sha[:12]}...")
            out[field] = data
    except Exception as exc:  # a missing member, a corrupt reference, an unreadable shard
        out[REFS_ERROR_FIELD] = f"{REFS_FIELD}: {type(exc).__name__}: {exc}"[:240]
    return out
