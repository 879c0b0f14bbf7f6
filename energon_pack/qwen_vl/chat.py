"""Qwen-VL samples: vision blocks inside the model-neutral ChatML rendering, exact lengths from metadata.

Two phases:

* **preencode** (:func:`preencode_chat`): conversation + image sizes / video frame counts ->
  token ids with the vision pads expanded, shifted labels, loss mask, grids. Cheap: text is
  tokenised (memoised) and visual counts come from sizes; no pixel is decoded. The packer uses
  ``length`` (or :func:`encoded_length`) to decide.
* **postencode** (:func:`postencode_media`): decode + patchify only for samples actually emitted.

Turns are rendered by :mod:`energon_pack.chat` (with the preset's template system prompt
by default); this module writes the vision blocks. An image is
``<|vision_start|>`` + ``<|image_pad|>`` x N + ``<|vision_end|>``; a Qwen2/2.5-VL video the same
with ``<|video_pad|>``; a Qwen3-VL video is, per temporal grid step, ``<{t:.1f} seconds>`` +
``<|vision_start|>`` + pads(h*w/merge^2) + ``<|vision_end|>`` (the original Qwen3-VL processor
layout; timestamps average the first/last frame time of each step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..chat import ChatConfig, ChatMLBuilder, normalize_conversation, place_media, render_chat, require_assistant_turn
from ..chat.conversation import Conversation
from ..chat.templates import template_supports_tools
from ..chat.tokenizer import as_qwen_tokenizer
from ..errors import SampleSkipped
from ..pixels import PendingPatchRows, image_size_from_bytes, open_image
from ..thd import IGNORE_INDEX, shifted_labels_and_loss_mask
from ..video import FrameSampling, probe_video
from . import vision as V
from .presets import VisionPreset
from .video import VideoFile, VideoPlan, pending_video_file, plan_video


@dataclass(frozen=True)
class ImageMeta:
    width: int
    height: int
    #: this image's own pixel cap (``overlength="fit"`` lowered it); None: the preset's ``max_pixels``
    max_pixels: int | None = None

    def grid(self, preset: VisionPreset) -> tuple[int, int, int]:
        """The (t, h, w) patch grid under ``preset`` and this image's own cap."""
        return V.image_grid_thw(self.height, self.width, V.with_max_pixels(preset, self.max_pixels))


@dataclass(frozen=True)
class VideoMeta:
    num_frames: int
    width: int
    height: int
    fps: float | None = None  # frame rate of the given (sampled) frames; preset.video_fps when None
    #: a video file: Qwen's sampling of it from its header (frames, size, times); None for frame lists
    plan: VideoPlan | None = None
    #: a frame list's own ``video_max_pixels`` (``overlength="fit"`` lowered it); None: the preset's
    max_pixels: int | None = None

    @classmethod
    def from_plan(cls, plan: VideoPlan) -> VideoMeta:
        """The metadata of a planned video file: its sampled frames at their sampled rate."""
        return cls(plan.num_frames, plan.width, plan.height, plan.sampled_fps, plan)


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


def _qwen3_timestamps(indices: Sequence[int], fps: float, temporal_patch_size: int) -> list[float]:
    """Seconds written before each temporal step (transformers' ``Qwen3VLProcessor._calculate_timestamps``):
    frame ``indices`` of a video at ``fps``, padded with the last one, first/last time of a step averaged."""
    indices = list(indices)
    if len(indices) % temporal_patch_size:
        indices.extend([indices[-1]] * (temporal_patch_size - len(indices) % temporal_patch_size))
    times = [i / fps for i in indices]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def video_frames_used(meta: VideoMeta, config: ChatConfig) -> int:
    """Frames a video contributes: a file's planned count; a frame list truncated to ``max_num_frames``."""
    return meta.plan.num_frames if meta.plan is not None else min(meta.num_frames, config.max_num_frames)


def video_grid(meta: VideoMeta, preset: VisionPreset, config: ChatConfig) -> tuple[int, int, int]:
    """(t, h, w) patch grid of a video from metadata alone (a file's plan, or a frame list's size rule)."""
    if meta.plan is not None:
        return meta.plan.grid_thw
    fitted = V.with_max_pixels(preset, meta.max_pixels, video=True)
    return V.video_grid_thw(video_frames_used(meta, config), meta.height, meta.width, fitted)


def _render(messages, image_metas, video_metas, tok, preset, config, materialize) -> tuple[ChatMLBuilder, dict]:
    if len(image_metas) > config.max_num_images:
        raise SampleSkipped("too_many_images", f"{len(image_metas)} images > max_num_images {config.max_num_images}")
    require_assistant_turn(messages)
    messages = place_media(messages, len(image_metas), len(video_metas))

    image_grids = [m.grid(preset) for m in image_metas]
    merge2 = preset.merge_size**2
    image_counts = [t * h * w // merge2 for t, h, w in image_grids]
    frames = [video_frames_used(m, config) for m in video_metas]
    video_grids = [video_grid(m, preset, config) for m in video_metas]
    video_counts = [t * h * w // merge2 for t, h, w in video_grids]
    sec_per_grid = [V.second_per_grid_t(preset, m.fps) for m in video_metas]
    total = sum(image_counts) + sum(video_counts)
    if total > config.max_visual_tokens:
        raise SampleSkipped(
            "too_many_visual_tokens", f"{total} visual tokens > max_visual_tokens {config.max_visual_tokens}"
        )

    sp = tok.special
    cursor = {"image": 0, "video": 0}

    def vision_block(b: ChatMLBuilder, kind: str) -> None:
        i = cursor[kind]
        cursor[kind] += 1
        if kind == "image":
            b.special(sp.vision_start, False)
            b.special(sp.image_pad, False, image_counts[i])
            b.special(sp.vision_end, False)
        elif preset.rope_style == "qwen3":
            _t, h, w = video_grids[i]
            plan = video_metas[i].plan
            if plan is not None:  # a file: original frame indices at the file's rate
                times = _qwen3_timestamps(plan.frame_indices, plan.video_fps, preset.temporal_patch_size)
            else:
                times = _qwen3_timestamps(
                    range(frames[i]), video_metas[i].fps or preset.video_fps, preset.temporal_patch_size
                )
            for ts in times:
                b.text(f"<{ts:.1f} seconds>", False)
                b.special(sp.vision_start, False)
                b.special(sp.video_pad, False, h * w // merge2)
                b.special(sp.vision_end, False)
        else:
            b.special(sp.vision_start, False)
            b.special(sp.video_pad, False, video_counts[i])
            b.special(sp.vision_end, False)

    builder = render_chat(
        messages,
        tok,
        loss_policy=config.loss_policy,
        system_prompt=config.resolve_system_prompt(preset.default_system_prompt),
        media_block=vision_block,
        materialize=materialize,
        tools=template_supports_tools(preset.name, preset.rope_style),
        template=f"the official {preset.name} Instruct chat template",
        train_newline_after_im_end=config.train_newline_after_im_end,
    )
    info = dict(
        image_grids=image_grids,
        video_grids=video_grids,
        image_counts=image_counts,
        video_counts=video_counts,
        sec_per_grid=sec_per_grid,
        frames=frames,
    )
    return builder, info


def as_messages(conversation: Any, config: ChatConfig) -> Conversation:
    """Normalized messages: a :class:`Conversation` as it is (e.g. a split piece), anything else normalized."""
    if isinstance(conversation, Conversation):
        return conversation
    return normalize_conversation(conversation, preference=config.preference)


def _metas(images, videos) -> tuple[list[ImageMeta], list[VideoMeta]]:
    ims = [m if isinstance(m, ImageMeta) else ImageMeta(int(m[0]), int(m[1])) for m in (images or ())]
    vids = [m if isinstance(m, VideoMeta) else VideoMeta(*m) for m in (videos or ())]
    return ims, vids


def encoded_length(
    conversation: Any,
    images: Sequence[ImageMeta | tuple[int, int]] = (),
    videos: Sequence[VideoMeta | tuple] = (),
    *,
    tokenizer: Any,
    preset: VisionPreset,
    config: ChatConfig | None = None,
) -> int:
    """Exact token length of the encoded sample from metadata only (sizes are (width, height))."""
    config = config or ChatConfig()
    ims, vids = _metas(images, videos)
    builder, _ = _render(
        as_messages(conversation, config),
        ims,
        vids,
        as_qwen_tokenizer(tokenizer),
        preset,
        config,
        materialize=False,
    )
    return builder.length


def preencode_chat(
    conversation: Any,
    images: Sequence[ImageMeta | tuple[int, int]] = (),
    videos: Sequence[VideoMeta | tuple] = (),
    *,
    tokenizer: Any,
    preset: VisionPreset,
    config: ChatConfig | None = None,
) -> EncodedChat:
    """Token ids (vision pads expanded), shifted labels, loss mask and grids from metadata only."""
    config = config or ChatConfig()
    ims, vids = _metas(images, videos)
    tok = as_qwen_tokenizer(tokenizer)
    b, info = _render(as_messages(conversation, config), ims, vids, tok, preset, config, materialize=True)
    input_ids, target = b.supervised(config.loss_policy)
    labels, loss_mask = shifted_labels_and_loss_mask(input_ids, target, IGNORE_INDEX)
    return EncodedChat(
        input_ids=input_ids,
        labels=labels,
        loss_mask=loss_mask,
        target_mask=target,
        length=len(b.ids),
        image_token_counts=info["image_counts"],
        video_token_counts=info["video_counts"],
        image_grid_thw=torch.tensor(info["image_grids"], dtype=torch.int64).reshape(-1, 3),
        video_grid_thw=torch.tensor(info["video_grids"], dtype=torch.int64).reshape(-1, 3),
        second_per_grid_ts=info["sec_per_grid"],
        num_frames=info["frames"],
    )


# ----------------------------------------------------------------------------------------------
# Media: metadata from bytes, and the expensive postencode
# ----------------------------------------------------------------------------------------------


@dataclass
class VisualInputs:
    # preset.pixel_dtype [sum patches, C*tp*p*p] or None without images; a PendingPatchRows of
    # that shape and dtype (laid out when written into a pack) from postencode_media(lazy_layout=True)
    pixel_values: torch.Tensor | PendingPatchRows | None
    image_grid_thw: torch.Tensor  # int64 [num_images, 3]
    pixel_values_videos: torch.Tensor | PendingPatchRows | None  # like pixel_values
    video_grid_thw: torch.Tensor  # int64 [num_videos, 3]
    second_per_grid_ts: list[float]


def image_metas_from_bytes(images: Sequence[bytes]) -> list[ImageMeta]:
    """Header-only sizes of encoded images (SampleSkipped("corrupt_image") when unreadable)."""
    return [ImageMeta(*image_size_from_bytes(data)) for data in images]


def postencode_media(
    images: Sequence[Any] = (),
    videos: Sequence[Sequence[Any]] = (),
    *,
    preset: VisionPreset,
    video_fps: Sequence[float | None] | None = None,
    config: ChatConfig | None = None,
    expected: EncodedChat | None = None,
    lazy_layout: bool = False,
    image_metas: Sequence[ImageMeta] | None = None,
    video_metas: Sequence[VideoMeta] | None = None,
) -> VisualInputs:
    """Decode + patchify images (bytes or PIL) and videos (lists of frames, truncated to
    ``config.max_num_frames``, or :class:`~.video.VideoFile`: only its planned frames are decoded). Pixel
    tensors have ``preset.pixel_dtype`` (float32, bfloat16 or
    uint8). With ``expected``, the grids must equal the preencoded ones
    (SampleSkipped("image_size_mismatch") if a header lied about the size). With ``lazy_layout``
    the pixels are :class:`~.vision.PendingPatchRows` (decoded and resized here, so bad media is a
    skip here; laid out when the THD builder writes them into the pack). ``image_metas`` / ``video_metas``: the
    preencoded metadata, whose per-medium pixel caps (a fitted sample's) the resize follows."""
    config = config or ChatConfig()
    pending, grids = [], []
    caps = [m.max_pixels for m in image_metas] if image_metas is not None else [None] * len(images)
    video_caps = [m.max_pixels for m in video_metas] if video_metas is not None else [None] * len(videos)
    for img, cap in zip(images, caps):
        rows, g = V.pending_image(img, preset, cap)
        pending.append(rows)
        grids.append(g)
    vpending, vgrids, spg = [], [], []
    fps_list = list(video_fps) if video_fps is not None else [None] * len(videos)
    for frames, fps, cap in zip(videos, fps_list, video_caps):
        if isinstance(frames, VideoFile):  # decode only the planned frames of the file
            rows, g = pending_video_file(frames.data, frames.plan, preset)
            s = V.second_per_grid_t(preset, frames.plan.sampled_fps)
        else:
            rows, g, s = V.pending_video(list(frames)[: config.max_num_frames], preset, fps, cap)
        vpending.append(rows)
        vgrids.append(g)
        spg.append(s)

    def pixels(parts: list[PendingPatchRows]) -> torch.Tensor | PendingPatchRows | None:
        if not parts:
            return None
        joined = PendingPatchRows.join(parts)
        return joined if lazy_layout else joined.to_tensor()

    out = VisualInputs(
        pixel_values=pixels(pending),
        image_grid_thw=torch.from_numpy(np.concatenate(grids)) if grids else torch.zeros(0, 3, dtype=torch.int64),
        pixel_values_videos=pixels(vpending),
        video_grid_thw=torch.from_numpy(np.concatenate(vgrids)) if vgrids else torch.zeros(0, 3, dtype=torch.int64),
        second_per_grid_ts=spg,
    )
    if expected is not None and (
        not torch.equal(out.image_grid_thw, expected.image_grid_thw)
        or not torch.equal(out.video_grid_thw, expected.video_grid_thw)
    ):
        raise SampleSkipped("image_size_mismatch", "decoded media size differs from the metadata used for the length")
    return out


def encode_chat(
    conversation: Any,
    images: Sequence[bytes] = (),
    videos: Sequence[Any] = (),
    *,
    tokenizer: Any,
    preset: VisionPreset,
    config: ChatConfig | None = None,
    video_fps: Sequence[float | None] | None = None,
    video_sampling: FrameSampling | None = None,
) -> tuple[EncodedChat, VisualInputs]:
    """Both phases at once (convenience): header sizes -> preencode, then decode + patchify. A video
    is a list of frames or an encoded video file (bytes: sampled from its header with
    ``video_sampling``, qwen-vl-utils' defaults when None, then only those frames decoded)."""
    config = config or ChatConfig()
    ims = [
        ImageMeta(*image_size_from_bytes(x)) if isinstance(x, (bytes, bytearray)) else ImageMeta(*open_image(x).size)
        for x in images
    ]
    fps_list = list(video_fps) if video_fps is not None else [None] * len(videos)
    vids, media = [], []
    for frames, fps in zip(videos, fps_list):
        if isinstance(frames, (bytes, bytearray)):  # a video file
            plan = plan_video(probe_video(bytes(frames)), preset, video_sampling)
            vids.append(VideoMeta.from_plan(plan))
            media.append(VideoFile(bytes(frames), plan))
            continue
        if len(frames) == 0:
            raise SampleSkipped("empty_video", "video has no frames")
        first = frames[0]
        w, h = image_size_from_bytes(first) if isinstance(first, (bytes, bytearray)) else open_image(first).size
        vids.append(VideoMeta(len(frames), w, h, fps))
        media.append(frames)
    enc = preencode_chat(conversation, ims, vids, tokenizer=tokenizer, preset=preset, config=config)
    return enc, postencode_media(images, media, preset=preset, video_fps=video_fps, config=config, expected=enc)
