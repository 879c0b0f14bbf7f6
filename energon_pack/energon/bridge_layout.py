"""Bridge's ChatML WebDataset layout read as Energon data: the sample reader beside :mod:`.chatml`.

Megatron-Bridge's ``ChatMLWebdataset`` stores a conversation (``json``), images (``jpgs``: a pickled list
or one image) and videos (``videos``: pickled lists of frames), and its ``dataset.yaml`` names the class
and a ``field_map``. :func:`cook_bridge_chatml` reads those shards through Energon's crude path into our
:class:`~energon_pack.energon.chatml.ChatMLSample`; :func:`bridge_chatml_to_sample` converts Bridge's own
typed sample when Energon loads Bridge's class. Nothing here imports Bridge.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from megatron.energon import basic_sample_keys

from energon_pack.errors import ConfigError

from .chatml import IMAGE_EXTENSIONS, ChatMLSample, cook_chatml, unpickle_media

__all__ = [
    "BRIDGE_CHATML_DATASET_CLASSES",
    "BridgeChatMLDataset",
    "FIELD_MAP_SUBFLAVOR",
    "bridge_chatml_to_sample",
    "cook_bridge_chatml",
    "read_bridge_dataset",
]

#: dataset.yaml classes that describe Bridge's ChatML WebDataset (module, class).
BRIDGE_CHATML_DATASET_CLASSES = (
    ("megatron.bridge.data.energon.task_encoder_utils", "ChatMLWebdataset"),
    ("megatron.bridge.models.qwen_vl.data.energon", "ChatMLWebdataset"),  # Bridge's re-export
)


def _member_suffix(name: str) -> str:
    return name.rsplit(".", 1)[-1].lower()


def _is_pickled(raw: bytes) -> bool:
    return len(raw) > 1 and raw[:1] == b"\x80"  # pickle protocol >= 2 header


def _encoded_image(image: Any) -> bytes:
    """One image as encoded bytes: bytes pass through; Bridge's decoded float [C,H,W] in [0,1]
    tensors (webdataset ``torchrgb``) and PIL images become lossless PNG (uint8 by rounding)."""
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    from PIL import Image

    if isinstance(image, torch.Tensor):
        if image.dim() != 3:
            raise ValueError(f"expected an image tensor [C, H, W], got shape {tuple(image.shape)}")
        array = image.detach().to(torch.float32).mul(255).round().clamp(0, 255).to(torch.uint8)
        image = Image.fromarray(
            array.permute(1, 2, 0).numpy().squeeze(-1) if array.shape[0] == 1 else array.permute(1, 2, 0).numpy()
        )
    if not isinstance(image, Image.Image):
        raise TypeError(f"unsupported image type {type(image).__name__}")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _images(value: Any) -> list[bytes]:
    if value is None:
        return []
    if isinstance(value, (bytes, bytearray)):  # undecoded member: a pickled list (loaded safely) or one image
        return [_encoded_image(x) for x in unpickle_media(value, "imgs")] if _is_pickled(value) else [bytes(value)]
    if isinstance(value, torch.Tensor):
        return [_encoded_image(x) for x in (value if value.dim() == 4 else [value])]
    return [_encoded_image(x) for x in value]


def _videos(value: Any) -> list[list[bytes]]:
    if value is None:
        return []
    if isinstance(value, (bytes, bytearray)):
        value = unpickle_media(value, "videos", frames=True)
    return [_images(video) for video in value]


def bridge_chatml_to_sample(sample: Any):
    """Bridge's typed ``ChatMLSample`` (``conversation``, ``imgs``, ``videos``) -> our ChatML sample.

    Accepts what Bridge's ``ChatMLWebdataset`` yields with its decoders (float image tensors,
    lists of frame tensors) and without (raw member bytes). Images end up as encoded bytes, as
    our pre-encode step reads sizes from headers and decodes only the members of emitted packs.
    """
    conversation = sample.conversation
    if not isinstance(conversation, (bytes, bytearray, str)):
        conversation = json.dumps(conversation)
    if getattr(sample, "tools", None):
        raise ValueError("Bridge ChatML samples with a separate 'tools' field are not supported by this encoder")
    fields_ = {"json": conversation, "jpgs": _images(getattr(sample, "imgs", None))}
    videos = _videos(getattr(sample, "videos", None))
    if videos:
        fields_["videos"] = videos
    return ChatMLSample.derive_from(sample, fields=fields_)


#: Subflavor under which :func:`bridge_dataset_kwargs` hands Bridge's field map to the cooker.
FIELD_MAP_SUBFLAVOR = "energon_pack_bridge_field_map"


def cook_bridge_chatml(crude: dict):
    """Crude WebDataset dict -> our ChatML sample, honouring Bridge's dataset.yaml ``field_map``.

    The map (Bridge sample field -> tar member name, e.g. ``conversation: json``, ``imgs: jpgs``,
    ``videos: videos``) arrives in the sample's subflavors (see :func:`bridge_dataset_kwargs`);
    without it this is our plain ChatML cooker. Copies raw bytes only, so it never fails.
    """
    field_map = (crude.get("__subflavors__") or {}).get(FIELD_MAP_SUBFLAVOR)
    if not field_map:
        return cook_chatml(crude)
    out = {}
    for field, member in field_map.items():
        if member not in crude:
            continue
        if field == "conversation":
            out["json"] = crude[member]
        elif field == "imgs":
            out[member if _member_suffix(member) in IMAGE_EXTENSIONS else "jpgs"] = crude[member]
        elif field == "videos":
            out["videos"] = crude[member]
        else:
            out[field] = crude[member]
    return ChatMLSample(**basic_sample_keys(crude), fields=out)


cook_bridge_chatml.__stateless__ = True  # what Energon's @stateless sets (no seeding needed)


@dataclass(frozen=True)
class BridgeChatMLDataset:
    """What a prepared dataset's ``.nv-meta/dataset.yaml`` declares."""

    module: str
    cls: str
    field_map: dict
    subflavors: dict

    @property
    def is_bridge_chatml(self) -> bool:
        return (self.module, self.cls) in BRIDGE_CHATML_DATASET_CLASSES

    @property
    def is_crude(self) -> bool:
        return self.module == "megatron.energon" and self.cls == "CrudeWebdataset"


def read_bridge_dataset(path: str | Path) -> BridgeChatMLDataset:
    """Parse ``path/.nv-meta/dataset.yaml`` (Bridge writes ``__module__``, ``__class__``, ``field_map``,
    ``subflavors``); ``path`` may be an ``msc://`` prefix in object storage."""
    from energon_pack.storage import epath

    meta = epath(path) / ".nv-meta" / "dataset.yaml"
    if not meta.is_file():
        raise ConfigError(
            "dataset path",
            f"{str(path).rstrip('/')}/.nv-meta/dataset.yaml does not exist",
            "prepare the dataset (Energon / Bridge prepare_webdataset) first",
        )
    data = yaml.safe_load(meta.read_text()) or {}
    return BridgeChatMLDataset(
        module=str(data.get("__module__", "")),
        cls=str(data.get("__class__", "")),
        field_map=dict(data.get("field_map") or {}),
        subflavors=dict(data.get("subflavors") or {}),
    )
