"""ChatML rendering with Qwen vision blocks, loss masks and exact lengths from metadata.

Two phases:

* **preencode** (:func:`preencode_chat`): conversation + image sizes / video frame counts ->
  token ids with the vision pads expanded, shifted labels, loss mask, grids. Cheap: text is
  tokenised (memoised) and visual counts come from sizes; no pixel is decoded. The packer uses
  ``length`` (or :func:`encoded_length`) to decide.
* **postencode** (:func:`postencode_media`): decode + patchify only for samples actually emitted.

Token layout per turn: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. An image is
``<|vision_start|>`` + ``<|image_pad|>`` x N + ``<|vision_end|>``; a Qwen2/2.5-VL video the same
with ``<|video_pad|>``; a Qwen3-VL video is, per temporal grid step, ``<{t:.1f} seconds>`` +
``<|vision_start|>`` + pads(h*w/merge^2) + ``<|vision_end|>`` (the original Qwen3-VL processor
layout; timestamps average the first/last frame time of each step).

Text between two special tokens is tokenised as one string, so the ids equal those of
tokenising the whole rendered string at once (tested).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, SampleSkipped
from ..thd import IGNORE_INDEX, shifted_labels_and_loss_mask
from . import vision as V
from .presets import VisionPreset
from .tokenizer import QwenTokenizer, as_qwen_tokenizer

LOSS_POLICIES = ("assistant", "last_turn", "all")
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant", "system": "system"}
_PLACEHOLDER = re.compile(r"<image>|<video>")


@dataclass(frozen=True)
class ImageMeta:
    width: int
    height: int


@dataclass(frozen=True)
class VideoMeta:
    num_frames: int
    width: int
    height: int
    fps: float | None = None  # frame rate of the given (sampled) frames; preset.video_fps when None


@dataclass(frozen=True)
class ChatConfig:
    """Rendering and sample limits (Bridge defaults for the limits)."""

    system_prompt: str | None = None  # used when the conversation has no system turn
    loss_policy: str = "assistant"  # "assistant" | "last_turn" | "all"
    max_num_images: int = 10  # more -> SampleSkipped("too_many_images")
    max_num_frames: int = 60  # longer videos are truncated to their first frames (Bridge)
    max_visual_tokens: int = 16384  # more -> SampleSkipped("too_many_visual_tokens")

    def __post_init__(self) -> None:
        if self.loss_policy not in LOSS_POLICIES:
            raise ConfigError("loss_policy", f"unknown policy {self.loss_policy!r}", f"use one of {LOSS_POLICIES}")
        for knob in ("max_num_images", "max_num_frames", "max_visual_tokens"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if knob == "max_num_images" else 1):
                raise ConfigError(knob, f"must be a positive int, got {value!r}", f"set {knob} to e.g. {getattr(ChatConfig, knob)}")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError("system_prompt", "must be a string or None", "pass a str")


@dataclass(frozen=True)
class Message:
    role: str
    parts: tuple[tuple[str, str], ...]  # ("text", s) | ("image", "") | ("video", "")


@dataclass
class EncodedChat:
    """One encoded sample (all tensors 1-D of ``length`` except the grids)."""

    input_ids: torch.Tensor  # int64 [L]
    labels: torch.Tensor  # int64 [L], shifted inside the sample, IGNORE_INDEX where not trained
    loss_mask: torch.Tensor  # float32 [L], 1 exactly where labels != IGNORE_INDEX
    target_mask: torch.Tensor  # bool [L], unshifted: token i is supervised
    length: int
    image_token_counts: list[int]
    video_token_counts: list[int]  # pad tokens per video (Qwen3-VL timestamp text not included)
    image_grid_thw: torch.Tensor  # int64 [num_images, 3]
    video_grid_thw: torch.Tensor  # int64 [num_videos, 3]
    second_per_grid_ts: list[float]
    num_frames: list[int] = field(default_factory=list)  # frames used per video (after truncation)

    @property
    def num_visual_tokens(self) -> int:
        return sum(self.image_token_counts) + sum(self.video_token_counts)


# ----------------------------------------------------------------------------------------------
# Conversation normalisation
# ----------------------------------------------------------------------------------------------


def normalize_conversation(conversation: Any) -> list[Message]:
    """[{"role","content"}] / LLaVA [{"from","value"}] / a dict wrapping messages|conversations|conversation
    (JSON strings accepted) -> messages whose content is split into text / image / video parts."""
    conv = conversation
    if isinstance(conv, (bytes, str)):
        try:
            conv = json.loads(conv)
        except ValueError as exc:
            raise SampleSkipped("bad_conversation", f"conversation is not JSON: {exc}") from None
    if isinstance(conv, Mapping):
        for key in ("messages", "conversations", "conversation"):
            if key in conv:
                conv = conv[key]
                break
        else:
            raise SampleSkipped("bad_conversation", "dict without messages/conversations/conversation")
        if isinstance(conv, (bytes, str)):
            return normalize_conversation(conv)
    if not isinstance(conv, Sequence) or isinstance(conv, (str, bytes)):
        raise SampleSkipped("bad_conversation", f"expected a list of turns, got {type(conv).__name__}")
    if len(conv) == 0:
        raise SampleSkipped("empty_conversation", "conversation has no turns")
    messages = []
    for i, turn in enumerate(conv):
        if not isinstance(turn, Mapping):
            raise SampleSkipped("bad_conversation", f"turn {i} is {type(turn).__name__}, not a dict")
        if "role" in turn:
            role, content = turn["role"], turn.get("content")
        elif "from" in turn:
            role, content = turn["from"], turn.get("value")
        else:
            raise SampleSkipped("bad_conversation", f"turn {i} has neither role nor from")
        if not isinstance(role, str) or not role:
            raise SampleSkipped("bad_conversation", f"turn {i} has an invalid role {role!r}")
        role = ROLE_ALIASES.get(role.lower(), role)
        messages.append(Message(role, _parts(content, i)))
    return messages


def _split_text(text: str) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        if m.start() > pos:
            parts.append(("text", text[pos:m.start()]))
        parts.append(("image" if m.group() == "<image>" else "video", ""))
        pos = m.end()
    if pos < len(text):
        parts.append(("text", text[pos:]))
    return parts


def _parts(content: Any, i: int) -> tuple[tuple[str, str], ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return tuple(_split_text(content))
    if isinstance(content, Sequence):
        parts: list[tuple[str, str]] = []
        for part in content:
            if isinstance(part, str):
                parts.extend(_split_text(part))
            elif isinstance(part, Mapping) and part.get("type") in ("image", "image_url"):
                parts.append(("image", ""))
            elif isinstance(part, Mapping) and part.get("type") in ("video", "video_url"):
                parts.append(("video", ""))
            elif isinstance(part, Mapping) and part.get("type") == "text":
                parts.extend(_split_text(str(part.get("text", ""))))
            else:
                raise SampleSkipped("bad_conversation", f"turn {i} has an unsupported content part {part!r}")
        return tuple(parts)
    raise SampleSkipped("bad_conversation", f"turn {i} content is {type(content).__name__}")


def place_media(messages: list[Message], num_images: int, num_videos: int) -> list[Message]:
    """Check placeholder counts against the media; with no placeholders of a kind, put that kind's
    media first in the first user turn (images, then videos)."""
    counts = {"image": 0, "video": 0}
    for msg in messages:
        for kind, _ in msg.parts:
            if kind in counts:
                counts[kind] += 1
    prepend: list[tuple[str, str]] = []
    for kind, have in (("image", num_images), ("video", num_videos)):
        if counts[kind] == 0 and have > 0:
            prepend.extend([(kind, "")] * have)
        elif counts[kind] != have:
            raise SampleSkipped("media_count_mismatch", f"{counts[kind]} <{kind}> placeholder(s) but {have} {kind}(s)")
    if not prepend:
        return messages
    target = next((i for i, m in enumerate(messages) if m.role == "user"), 0)
    out = list(messages)
    out[target] = Message(out[target].role, tuple(prepend) + out[target].parts)
    return out


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------


def _turn_trained(messages: list[Message], policy: str) -> list[bool]:
    assistant_idx = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if policy == "all":
        return [True] * len(messages)
    if policy == "last_turn":
        return [i == assistant_idx[-1] for i in range(len(messages))]
    return [m.role == "assistant" for m in messages]


def _qwen3_timestamps(num_frames: int, fps: float, temporal_patch_size: int) -> list[float]:
    indices = list(range(num_frames))
    if len(indices) % temporal_patch_size:
        indices.extend([indices[-1]] * (temporal_patch_size - len(indices) % temporal_patch_size))
    times = [i / fps for i in indices]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


class _Builder:
    """Collects the token stream: text runs are flushed (tokenised once) at each special token."""

    def __init__(self, tok: QwenTokenizer, materialize: bool) -> None:
        self.tok = tok
        self.materialize = materialize
        self.ids: list[int] = []
        self.mask: list[bool] = []
        self.length = 0
        self._run: list[tuple[str, bool]] = []

    def text(self, s: str, trained: bool) -> None:
        if s:
            self._run.append((s, trained))

    def flush(self) -> None:
        if not self._run:
            return
        full = "".join(s for s, _ in self._run)
        ids = self.tok.encode(full)
        flags = [False] * len(ids)
        # tokens before the common-prefix boundary of each span belong to the spans before it
        start_tok, char = 0, 0
        for j, (s, trained) in enumerate(self._run):
            char += len(s)
            if j == len(self._run) - 1:
                end_tok = len(ids)
            else:
                prefix = self.tok.encode(full[:char])
                end_tok = 0
                while end_tok < min(len(prefix), len(ids)) and prefix[end_tok] == ids[end_tok]:
                    end_tok += 1
                end_tok = max(end_tok, start_tok)
            if trained:
                for k in range(start_tok, end_tok):
                    flags[k] = True
            start_tok = end_tok
        self.length += len(ids)
        if self.materialize:
            self.ids.extend(ids)
            self.mask.extend(flags)
        self._run = []

    def special(self, tid: int, trained: bool, count: int = 1) -> None:
        self.flush()
        self.length += count
        if self.materialize:
            self.ids.extend([tid] * count)
            self.mask.extend([trained] * count)


def _render(messages, image_metas, video_metas, tok, preset, config, materialize):
    if len(image_metas) > config.max_num_images:
        raise SampleSkipped("too_many_images", f"{len(image_metas)} images > max_num_images {config.max_num_images}")
    if not any(m.role == "assistant" for m in messages):
        raise SampleSkipped("no_assistant_turn", "conversation has no assistant turn")
    messages = place_media(messages, len(image_metas), len(video_metas))
    if config.system_prompt is not None and messages[0].role != "system":
        messages = [Message("system", (("text", config.system_prompt),))] + messages

    image_grids = [V.image_grid_thw(m.height, m.width, preset) for m in image_metas]
    merge2 = preset.merge_size**2
    image_counts = [t * h * w // merge2 for t, h, w in image_grids]
    frames = [min(m.num_frames, config.max_num_frames) for m in video_metas]
    video_grids = [V.video_grid_thw(n, m.height, m.width, preset) for n, m in zip(frames, video_metas)]
    video_counts = [t * h * w // merge2 for t, h, w in video_grids]
    sec_per_grid = [V.second_per_grid_t(preset, m.fps) for m in video_metas]
    total = sum(image_counts) + sum(video_counts)
    if total > config.max_visual_tokens:
        raise SampleSkipped("too_many_visual_tokens", f"{total} visual tokens > max_visual_tokens {config.max_visual_tokens}")

    sp = tok.special
    b = _Builder(tok, materialize)
    trained_turns = _turn_trained(messages, config.loss_policy)
    next_image = next_video = 0
    for msg, trained in zip(messages, trained_turns):
        b.special(sp.im_start, False)
        b.text(f"{msg.role}\n", False)
        for kind, payload in msg.parts:
            if kind == "text":
                b.text(payload, trained)
            elif kind == "image":
                b.special(sp.vision_start, False)
                b.special(sp.image_pad, False, image_counts[next_image])
                b.special(sp.vision_end, False)
                next_image += 1
            else:
                t, h, w = video_grids[next_video]
                if preset.rope_style == "qwen3":
                    fps = video_metas[next_video].fps or preset.video_fps
                    for ts in _qwen3_timestamps(frames[next_video], fps, preset.temporal_patch_size):
                        b.text(f"<{ts:.1f} seconds>", False)
                        b.special(sp.vision_start, False)
                        b.special(sp.video_pad, False, h * w // merge2)
                        b.special(sp.vision_end, False)
                else:
                    b.special(sp.vision_start, False)
                    b.special(sp.video_pad, False, video_counts[next_video])
                    b.special(sp.vision_end, False)
                next_video += 1
        b.special(sp.im_end, trained)
        b.text("\n", False)
    b.flush()
    info = dict(image_grids=image_grids, video_grids=video_grids, image_counts=image_counts,
                video_counts=video_counts, sec_per_grid=sec_per_grid, frames=frames)
    return b, info


def _metas(images, videos) -> tuple[list[ImageMeta], list[VideoMeta]]:
    ims = [m if isinstance(m, ImageMeta) else ImageMeta(int(m[0]), int(m[1])) for m in (images or ())]
    vids = [m if isinstance(m, VideoMeta) else VideoMeta(*m) for m in (videos or ())]
    return ims, vids


def encoded_length(conversation: Any, images: Sequence[ImageMeta | tuple[int, int]] = (),
                   videos: Sequence[VideoMeta | tuple] = (), *, tokenizer: Any, preset: VisionPreset,
                   config: ChatConfig | None = None) -> int:
    """Exact token length of the encoded sample from metadata only (sizes are (width, height))."""
    ims, vids = _metas(images, videos)
    builder, _ = _render(normalize_conversation(conversation), ims, vids, as_qwen_tokenizer(tokenizer), preset,
                         config or ChatConfig(), materialize=False)
    return builder.length


def preencode_chat(conversation: Any, images: Sequence[ImageMeta | tuple[int, int]] = (),
                   videos: Sequence[VideoMeta | tuple] = (), *, tokenizer: Any, preset: VisionPreset,
                   config: ChatConfig | None = None) -> EncodedChat:
    """Token ids (vision pads expanded), shifted labels, loss mask and grids from metadata only."""
    config = config or ChatConfig()
    ims, vids = _metas(images, videos)
    tok = as_qwen_tokenizer(tokenizer)
    b, info = _render(normalize_conversation(conversation), ims, vids, tok, preset, config, materialize=True)
    input_ids = torch.tensor(b.ids, dtype=torch.int64)
    skipped = torch.tensor(sorted(tok.special.skipped), dtype=torch.int64)
    target = torch.tensor(b.mask, dtype=torch.bool) & ~torch.isin(input_ids, skipped)
    if not bool(target[1:].any()):
        raise SampleSkipped("no_trained_tokens", f"loss policy {config.loss_policy!r} leaves no supervised token")
    labels, loss_mask = shifted_labels_and_loss_mask(input_ids, target, IGNORE_INDEX)
    return EncodedChat(
        input_ids=input_ids, labels=labels, loss_mask=loss_mask, target_mask=target, length=len(b.ids),
        image_token_counts=info["image_counts"], video_token_counts=info["video_counts"],
        image_grid_thw=torch.tensor(info["image_grids"], dtype=torch.int64).reshape(-1, 3),
        video_grid_thw=torch.tensor(info["video_grids"], dtype=torch.int64).reshape(-1, 3),
        second_per_grid_ts=info["sec_per_grid"], num_frames=info["frames"],
    )


# ----------------------------------------------------------------------------------------------
# Media: metadata from bytes, and the expensive postencode
# ----------------------------------------------------------------------------------------------


@dataclass
class VisualInputs:
    pixel_values: torch.Tensor | None  # float32 [sum patches, C*tp*p*p] or None without images
    image_grid_thw: torch.Tensor  # int64 [num_images, 3]
    pixel_values_videos: torch.Tensor | None
    video_grid_thw: torch.Tensor  # int64 [num_videos, 3]
    second_per_grid_ts: list[float]


def image_metas_from_bytes(images: Sequence[bytes]) -> list[ImageMeta]:
    """Header-only sizes of encoded images (SampleSkipped("corrupt_image") when unreadable)."""
    return [ImageMeta(*V.image_size_from_bytes(data)) for data in images]


def postencode_media(images: Sequence[Any] = (), videos: Sequence[Sequence[Any]] = (), *, preset: VisionPreset,
                     video_fps: Sequence[float | None] | None = None, config: ChatConfig | None = None,
                     expected: EncodedChat | None = None) -> VisualInputs:
    """Decode + patchify images (bytes or PIL) and videos (lists of frames); videos are truncated to
    ``config.max_num_frames``. With ``expected``, the grids must equal the preencoded ones
    (SampleSkipped("image_size_mismatch") if a header lied about the size)."""
    config = config or ChatConfig()
    pv, grids = [], []
    for img in images:
        p, g = V.patchify_image(img, preset)
        pv.append(p)
        grids.append(g)
    vpv, vgrids, spg = [], [], []
    fps_list = list(video_fps) if video_fps is not None else [None] * len(videos)
    for frames, fps in zip(videos, fps_list):
        p, g, s = V.patchify_video(list(frames)[: config.max_num_frames], preset, fps)
        vpv.append(p)
        vgrids.append(g)
        spg.append(s)
    out = VisualInputs(
        pixel_values=torch.from_numpy(np.concatenate(pv)) if pv else None,
        image_grid_thw=torch.from_numpy(np.concatenate(grids)) if grids else torch.zeros(0, 3, dtype=torch.int64),
        pixel_values_videos=torch.from_numpy(np.concatenate(vpv)) if vpv else None,
        video_grid_thw=torch.from_numpy(np.concatenate(vgrids)) if vgrids else torch.zeros(0, 3, dtype=torch.int64),
        second_per_grid_ts=spg,
    )
    if expected is not None and (not torch.equal(out.image_grid_thw, expected.image_grid_thw)
                                 or not torch.equal(out.video_grid_thw, expected.video_grid_thw)):
        raise SampleSkipped("image_size_mismatch", "decoded media size differs from the metadata used for the length")
    return out


def encode_chat(conversation: Any, images: Sequence[bytes] = (), videos: Sequence[Sequence[Any]] = (), *,
                tokenizer: Any, preset: VisionPreset, config: ChatConfig | None = None,
                video_fps: Sequence[float | None] | None = None) -> tuple[EncodedChat, VisualInputs]:
    """Both phases at once (convenience): header sizes -> preencode, then decode + patchify."""
    config = config or ChatConfig()
    ims = [ImageMeta(*V.image_size_from_bytes(x)) if isinstance(x, (bytes, bytearray)) else ImageMeta(*V.open_image(x).size)
           for x in images]
    fps_list = list(video_fps) if video_fps is not None else [None] * len(videos)
    vids = []
    for frames, fps in zip(videos, fps_list):
        if len(frames) == 0:
            raise SampleSkipped("empty_video", "video has no frames")
        first = frames[0]
        w, h = V.image_size_from_bytes(first) if isinstance(first, (bytes, bytearray)) else V.open_image(first).size
        vids.append(VideoMeta(len(frames), w, h, fps))
    enc = preencode_chat(conversation, ims, vids, tokenizer=tokenizer, preset=preset, config=config)
    return enc, postencode_media(images, videos, preset=preset, video_fps=video_fps, config=config, expected=enc)
