"""The Qwen-VL Energon task encoder: ChatML WebDataset -> fixed-width THD packs.

* ``preencode_sample`` (before the packing buffer): parse the JSON, read image *headers*, and
  compute the exact token length from metadata; the buffered :class:`PackCandidate` holds
  the conversation and the encoded image bytes, never decoded pixels.
* ``postencode_sample`` (only for members of an emitted pack): tokenize, decode + patchify
  the media, and compute M-RoPE positions -> one :class:`ThdSegment`.
* ``batch``: the THD row of ``CONTRACT.md`` (with ``mrope_position_ids``) as a dict.

Costs are (aligned tokens[, ViT patches][, media items]): the optional budgets bound vision
work per pack. Bad samples become counted skips with a reason (see ``SKIP_REASONS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from megatron.energon import DefaultTaskEncoder, Sample, SkipSample, edataclass, stateless

from energon_pack.energon.chatml import CHATML_COOKERS, ChatMLSample, parse_chatml
from energon_pack.energon.samples import PackCandidate, SkippedSample
from energon_pack.energon.task_encoder import PACKING_MODES, CarryOverPackingMixin, pack_members
from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.thd import ThdLayout, ThdSegment, alignment_multiple, build_thd_batch

from . import vision as V
from .chat import ChatConfig, ImageMeta, VideoMeta, encoded_length, postencode_media, preencode_chat
from .mrope import mrope_position_ids
from .presets import VisionPreset, get_preset
from .tokenizer import as_qwen_tokenizer, load_demo_tokenizer

OVERLENGTH_POLICIES = ("skip", "error")


@dataclass(frozen=True)
class QwenVLPackingConfig:
    """Every knob of the Qwen-VL packing encoder, validated at construction."""

    seq_length: int = 8192
    cp: int = 1
    tp: int = 1
    sp: bool = False
    eval_cp: Optional[int] = None
    pad_to_max_length: bool = False
    pad_cu_seqlens: bool = False
    max_segments: Optional[int] = None
    max_media_per_pack: Optional[int] = None
    max_patches_per_pack: Optional[int] = None
    packing_mode: str = "carry"
    lookahead_packs: Optional[float] = None
    min_fill: Optional[float] = None
    max_age: Optional[int] = None
    overlength: str = "skip"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.packing_mode not in PACKING_MODES:
            raise ConfigError("packing_mode", f"unknown mode {self.packing_mode!r}", f"use one of {PACKING_MODES}")
        if self.overlength not in OVERLENGTH_POLICIES:
            raise ConfigError(
                "overlength", f"unknown policy {self.overlength!r}",
                "use 'skip' (count and skip) or 'error'; truncation would cut visual tokens",
            )
        for knob in ("max_media_per_pack", "max_patches_per_pack"):
            value = getattr(self, knob)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(knob, f"must be a positive int or None, got {value!r}", "leave it None for no budget")
        self.layout  # validates width, alignment and static cu_seqlens knobs

    @property
    def layout(self) -> ThdLayout:
        return ThdLayout(
            width=self.seq_length,
            pad_multiple=alignment_multiple(self.cp, self.tp, self.sp, self.eval_cp),
            pad_to_max_length=self.pad_to_max_length,
            pad_cu_seqlens=self.pad_cu_seqlens,
            max_segments=self.max_segments,
        )

    def capacity(self) -> tuple[int, ...]:
        extra = tuple(b for b in (self.max_patches_per_pack, self.max_media_per_pack) if b is not None)
        return (self.seq_length, *extra)

    def cost(self, aligned_tokens: int, patches: int, media: int) -> tuple[int, ...]:
        extra = tuple(
            value for value, budget in ((patches, self.max_patches_per_pack), (media, self.max_media_per_pack))
            if budget is not None
        )
        return (aligned_tokens, *extra)


@edataclass
class EncodedSegment(Sample):
    """One post-encoded sample: its THD segment (tokens, labels, masks, M-RoPE, pixels)."""

    segment: Any


class QwenVLPackingTaskEncoder(CarryOverPackingMixin, DefaultTaskEncoder):
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL finetuning on ChatML WebDataset with online packing."""

    cookers = CHATML_COOKERS
    decoder = None  # keep images as encoded bytes until postencode_sample

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        preset: str | VisionPreset = "qwen2.5-vl",
        chat: ChatConfig | None = None,
        config: QwenVLPackingConfig | None = None,
        **config_overrides: Any,
    ) -> None:
        super().__init__()
        base = config or QwenVLPackingConfig()
        if config_overrides:
            unknown = set(config_overrides) - set(QwenVLPackingConfig.__dataclass_fields__)
            if unknown:
                raise ConfigError(sorted(unknown)[0], "is not a knob of QwenVLPackingTaskEncoder",
                                  f"use one of {sorted(QwenVLPackingConfig.__dataclass_fields__)}")
            base = QwenVLPackingConfig(**{**base.__dict__, **config_overrides})
        self.config = base
        self.layout = base.layout
        self.tokenizer = as_qwen_tokenizer(tokenizer) if tokenizer is not None else load_demo_tokenizer()
        self.layout = ThdLayout(**{**self.layout.__dict__, "pad_token_id": self.tokenizer.pad_id})
        self.preset = get_preset(preset)
        self.chat = chat or ChatConfig()
        self.packing_mode = base.packing_mode
        self.packer_options = {
            "lookahead_packs": base.lookahead_packs, "min_fill": base.min_fill, "max_age": base.max_age,
            "on_oversize": base.overlength, "seed": base.seed,
        }

    def packing_capacity(self) -> tuple[int, ...]:
        return self.config.capacity()

    # ------------------------------------------------------------------ pre-encode (cheap)
    @stateless
    def preencode_sample(self, sample: ChatMLSample) -> PackCandidate | SkippedSample:
        try:
            conversation, images, videos = parse_chatml(sample)
            image_metas = [ImageMeta(*V.image_size_from_bytes(img)) for img in images]
            video_metas = [self._video_meta(frames) for frames in videos]
            length = encoded_length(conversation, image_metas, video_metas, tokenizer=self.tokenizer,
                                    preset=self.preset, config=self.chat)
        except SampleSkipped as skip:
            return SkippedSample.derive_from(sample, reason=skip.reason, detail=skip.detail)
        patches = sum(_prod(V.image_grid_thw(m.height, m.width, self.preset)) for m in image_metas)
        patches += sum(_prod(V.video_grid_thw(min(m.num_frames, self.chat.max_num_frames), m.height, m.width, self.preset))
                       for m in video_metas)
        cost = self.config.cost(self.layout.segment_span(length), patches, len(images) + len(videos))
        payload = {"conversation": conversation, "images": images, "videos": videos,
                   "image_metas": image_metas, "video_metas": video_metas, "length": length}
        return PackCandidate.derive_from(sample, cost=cost, payload=payload)

    def _video_meta(self, frames: list) -> VideoMeta:
        if not frames:
            raise SampleSkipped("empty_video", "video has no frames")
        width, height = V.image_size_from_bytes(frames[0])
        return VideoMeta(len(frames), width, height)

    # ------------------------------------------------------------------ post-encode (pixels)
    @stateless
    def postencode_sample(self, sample: PackCandidate) -> EncodedSegment:
        if isinstance(sample, SkippedSample):  # only without packing: Energon skips it
            raise SkipSample()
        try:
            return self._postencode(sample)
        except SampleSkipped as skip:
            self.count_postencode_skip(skip)

    def _postencode(self, sample: PackCandidate) -> EncodedSegment:
        p = sample.payload
        enc = preencode_chat(p["conversation"], p["image_metas"], p["video_metas"], tokenizer=self.tokenizer,
                             preset=self.preset, config=self.chat)
        if enc.length != p["length"]:
            raise SampleSkipped("length_mismatch", f"metadata length {p['length']} != encoded {enc.length}")
        media = postencode_media(p["images"], p["videos"], preset=self.preset, config=self.chat, expected=enc)
        special = self.tokenizer.special
        positions = mrope_position_ids(
            enc.input_ids, enc.image_grid_thw, enc.video_grid_thw, enc.second_per_grid_ts,
            preset=self.preset, image_pad_id=special.image_pad, video_pad_id=special.video_pad,
        )
        visual = {"image_grid_thw": enc.image_grid_thw, "video_grid_thw": enc.video_grid_thw}
        if media.pixel_values is not None:
            visual["pixel_values"] = media.pixel_values
        if media.pixel_values_videos is not None:
            visual["pixel_values_videos"] = media.pixel_values_videos
            visual["second_per_grid_ts"] = _as_tensor(enc.second_per_grid_ts)
        if not len(enc.image_grid_thw):
            del visual["image_grid_thw"]
        if not len(enc.video_grid_thw):
            del visual["video_grid_thw"]
        segment = ThdSegment(enc.input_ids, enc.labels, enc.loss_mask, mrope_position_ids=positions,
                             visual=visual or None, key=sample.__key__)
        return EncodedSegment.derive_from(sample, segment=segment)

    # ------------------------------------------------------------------ batch
    @stateless
    def batch(self, samples: List[Any]) -> dict:
        members = pack_members(samples)
        batch = build_thd_batch([m.segment for m in members], self.layout)
        stats = [s.packing_stats for s in samples if getattr(s, "packing_stats", None) is not None]
        batch["packing_stats"] = stats[-1] if stats else None
        batch["__key__"] = ",".join(m.__key__ for m in members)
        batch["__restore_key__"] = ()
        return batch

    @stateless
    def encode_batch(self, batch: dict) -> dict:
        return batch


def _prod(values: tuple[int, ...]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _as_tensor(values: list[float]):
    import torch

    return torch.tensor(values, dtype=torch.float32)
