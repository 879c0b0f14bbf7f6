"""Over-long Qwen-VL samples kept instead of skipped: ``overlength="fit"`` and ``overlength="split"``.

* **fit** lowers one sample's media until its cost fits the pack's budgets (tokens, patches): one pixel scale
  ``k / SCALE_STEPS`` shared by all its media, as qwen-vl-utils' ``total_pixels`` shares a budget across a video's
  frames. Each image gets its own ``max_pixels`` (its resized pixels times the scale, floored to ``factor**2``, at
  least the preset's ``min_pixels``), so HF's processor given that ``max_pixels`` resizes it to the same size; a
  video file is re-planned with ``max_video_tokens`` scaled the same way (qwen-vl-utils' rule: every frame shares
  the budget), a frame-list video gets its own ``video_max_pixels``. Only when the smallest pixels still do not
  fit are a video file's frames reduced (``max_frames``). The largest scale that fits is found by bisection, so
  the result is a function of the sample and the config alone (exact resume).
* **split** cuts a multi-turn conversation before a user turn that follows an answer into pieces that each fit
  (greedy, in order): each piece carries the images / videos its turns reference, the system turn (or the
  template's default system prompt) is repeated in every piece, and every turn keeps the loss flag it had in the
  whole conversation, so each supervised token is trained exactly once (a repeated system turn is supervised in
  the first piece only). A piece with no supervised turn is dropped (counted); a turn alone over the budgets is
  fitted when it has media, else an ``oversize_text`` skip.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..chat.conversation import Conversation, Message, conversation_tools, place_media, require_assistant_turn
from ..chat.render import _turn_trained
from ..errors import SampleSkipped
from ..video import FrameSampling, probe_video
from .chat import ImageMeta, VideoMeta, video_frames_used, video_grid
from .presets import VisionPreset
from .video import VideoFile, plan_video

#: the pixel (and frame) scale is k / SCALE_STEPS, k found by bisection: at most 9 renders per stage
SCALE_STEPS = 256

#: (image metas, video metas) -> (token length, cost in every budget, visual pad tokens)
Measure = Callable[[Sequence[ImageMeta], Sequence[VideoMeta]], tuple[int, tuple[int, ...], int]]


@dataclass(frozen=True)
class Fitted:
    """A fitted sample's media metadata (video files re-planned), its length, and its adjustment counters."""

    image_metas: list[ImageMeta]
    video_metas: list[VideoMeta]
    length: int
    pixels_before: int
    pixels_after: int

    def counts(self) -> dict[str, int]:
        return {"fitted": 1, "fit_pixels_before": self.pixels_before, "fit_pixels_after": self.pixels_after}

    def videos(self, videos: Sequence[Any]) -> list[Any]:
        """The payload's videos under the new plans (a file's bytes with its re-planned frames)."""
        data = [v.data if isinstance(v, VideoFile) else v for v in videos]
        return [VideoFile(d, m.plan) if m.plan is not None else d for d, m in zip(data, self.video_metas)]


def media_pixels(
    image_metas: Sequence[ImageMeta], video_metas: Sequence[VideoMeta], preset: VisionPreset, config: Any
) -> int:
    """Resized pixels of a sample's media (every frame of a video counted): the fit's before/after measure."""
    area = preset.patch_size**2
    total = sum(h * w * area for _t, h, w in (m.grid(preset) for m in image_metas))
    for m in video_metas:
        _t, h, w = video_grid(m, preset, config)
        total += video_frames_used(m, config) * h * w * area
    return total


class MediaScaler:
    """One sample's media at pixel scale ``k`` and frame scale ``m`` (both out of :data:`SCALE_STEPS`)."""

    def __init__(
        self,
        image_metas: Sequence[ImageMeta],
        video_metas: Sequence[VideoMeta],
        videos: Sequence[Any],
        *,
        preset: VisionPreset,
        sampling: FrameSampling,
        config: Any,
    ) -> None:
        self.preset, self.sampling, self.config = preset, sampling, config
        self.image_metas, self.video_metas = list(image_metas), list(video_metas)
        area = preset.factor**2
        self._image_pixels = [h * w * preset.patch_size**2 for _t, h, w in (m.grid(preset) for m in image_metas)]
        self._headers = [
            probe_video(v.data if isinstance(v, VideoFile) else v) if m.plan is not None else None
            for v, m in zip(videos, video_metas)
        ]
        self._video_pixels = []
        for m in video_metas:
            t, h, w = video_grid(m, preset, config)
            frames = t * preset.temporal_patch_size if preset.rope_style == "qwen3" and m.plan is None else 1
            self._video_pixels.append(frames * h * w * preset.patch_size**2)
        self._area = area
        self.has_files = any(h is not None for h in self._headers)

    def _cap(self, pixels: int, k: int, floor: int) -> int:
        return max(floor, pixels * k // SCALE_STEPS // self._area * self._area)

    def at(self, k: int, m: int = SCALE_STEPS) -> tuple[list[ImageMeta], list[VideoMeta]]:
        """The media metadata at pixel scale ``k`` and frame scale ``m`` (the originals at full scale)."""
        p = self.preset
        if k >= SCALE_STEPS and m >= SCALE_STEPS:
            return self.image_metas, self.video_metas
        images = [
            dataclasses.replace(meta, max_pixels=self._cap(pixels, k, p.min_pixels))
            for meta, pixels in zip(self.image_metas, self._image_pixels)
        ]
        videos = []
        for meta, header, pixels in zip(self.video_metas, self._headers, self._video_pixels):
            if header is None:  # a frame list: its own video_max_pixels
                videos.append(dataclasses.replace(meta, max_pixels=self._cap(pixels, k, p.video_min_pixels)))
                continue
            s = self.sampling
            n = meta.plan.num_frames
            # qwen-vl-utils gives each frame total / n * frame_factor of 0.9 * max_video_tokens * factor^2
            tokens = math.floor(k * pixels * n / (SCALE_STEPS * s.frame_factor * 0.9 * self._area))
            sampling = dataclasses.replace(s, max_video_tokens=max(1, tokens))
            if m < SCALE_STEPS:
                frames = n * m // SCALE_STEPS // s.frame_factor * s.frame_factor
                sampling = dataclasses.replace(sampling, max_frames=max(s.frame_factor, frames))
            videos.append(VideoMeta.from_plan(plan_video(header, p, sampling)))
        return images, videos


def _largest(ok: Callable[[int], bool]) -> int:
    """The largest k in [0, SCALE_STEPS] with ok(k), given ok(0) (bisection: deterministic)."""
    lo, hi = 0, SCALE_STEPS
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_media(
    image_metas: Sequence[ImageMeta],
    video_metas: Sequence[VideoMeta],
    videos: Sequence[Any],
    *,
    measure: Measure,
    capacity: Sequence[int],
    width: int,
    span: Callable[[int], int],
    preset: VisionPreset,
    sampling: FrameSampling,
    config: Any,
) -> Fitted:
    """The largest shared pixel scale (then frame scale) at which the sample fits ``capacity``; SampleSkipped
    ``oversize_text`` when its text alone is over ``width``, ``oversize`` when its smallest media still do not fit."""
    scaler = MediaScaler(image_metas, video_metas, videos, preset=preset, sampling=sampling, config=config)

    def fits(k: int, m: int = SCALE_STEPS) -> bool:
        _length, cost, _visual = measure(*scaler.at(k, m))
        return all(c <= cap for c, cap in zip(cost, capacity))

    if fits(0):
        k, m = _largest(fits), SCALE_STEPS
    elif scaler.has_files and fits(0, 0):
        k, m = 0, _largest(lambda m: fits(0, m))
    else:
        length, cost, visual = measure(*scaler.at(0, 0 if scaler.has_files else SCALE_STEPS))
        if span(length - visual) > width:
            raise SampleSkipped(
                "oversize_text", f"{length - visual} text tokens are over seq_length {width}: no media to lower"
            )
        raise SampleSkipped("oversize", f"at their smallest pixels and frames its media still need {list(cost)}")
    images, vids = scaler.at(k, m)
    length, _cost, _visual = measure(images, vids)
    return Fitted(
        images,
        vids,
        length,
        media_pixels(image_metas, video_metas, preset, config),
        media_pixels(images, vids, preset, config),
    )


# ------------------------------------------------------------------------------------------ split
@dataclass(frozen=True)
class Piece:
    """One piece of a split conversation: its messages (loss flags explicit) and the indices of its media."""

    messages: Conversation
    image_indices: tuple[int, ...]
    video_indices: tuple[int, ...]
    trained: bool  # holds a supervised turn


def _media_count(messages: Sequence[Message], kind: str) -> int:
    return sum(1 for m in messages for part_kind, _ in m.parts if part_kind == kind)


def turn_units(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """(leading system turn or [], turns grouped into units): a unit starts at a user turn that follows a
    non-user turn; a unit with no assistant turn joins the one before it (or after it, when first)."""
    head = list(messages[:1]) if messages and messages[0].role == "system" else []
    units: list[list[Message]] = []
    for msg in messages[len(head) :]:
        if units and msg.role == "user" and units[-1][-1].role != "user":
            units.append([msg])
        elif units:
            units[-1].append(msg)
        else:
            units.append([msg])
    merged: list[list[Message]] = []
    for unit in units:
        if merged and (
            not any(m.role == "assistant" for m in unit) or not any(m.role == "assistant" for m in merged[-1])
        ):
            merged[-1].extend(unit)
        else:
            merged.append(unit)
    return head, merged


def conversation_pieces(
    messages: Conversation,
    num_images: int,
    num_videos: int,
    *,
    loss_policy: str,
    system_prompt: str | None,
    fits: Callable[[Piece], bool],
) -> list[Piece]:
    """The conversation cut into pieces that ``fits`` accepts (greedy over :func:`turn_units`; a unit that does
    not fit alone is its own piece), media placed, loss flags of the whole conversation kept."""
    require_assistant_turn(messages)
    placed = place_media(messages, num_images, num_videos)
    tools = conversation_tools(placed)
    flags = _turn_trained(list(placed), loss_policy)
    flagged = [dataclasses.replace(m, trained=f) for m, f in zip(placed, flags)]
    head, units = turn_units(flagged)
    repeated = [dataclasses.replace(m, trained=False) for m in head]
    if not head and loss_policy == "all" and system_prompt is not None:
        repeated = [Message("system", (("text", system_prompt),), trained=False)]  # the default prompt, not trained
    starts = {"image": 0, "video": 0}

    def piece(first: bool, turns: list[Message], image_start: int, video_start: int) -> Piece:
        body = (head if first else repeated) + turns
        n_img, n_vid = _media_count(turns, "image"), _media_count(turns, "video")
        return Piece(
            Conversation(body, tools),
            tuple(range(image_start, image_start + n_img)),
            tuple(range(video_start, video_start + n_vid)),
            any(m.trained for m in turns),
        )

    pieces: list[Piece] = []
    current: list[Message] = []
    for unit in units:
        if current:
            candidate = piece(not pieces, current + unit, starts["image"], starts["video"])
            if fits(candidate):
                current = current + unit
                continue
            done = piece(not pieces, current, starts["image"], starts["video"])
            pieces.append(done)
            starts["image"] += len(done.image_indices)
            starts["video"] += len(done.video_indices)
        current = list(unit)
    pieces.append(piece(not pieces, current, starts["image"], starts["video"]))
    return pieces
