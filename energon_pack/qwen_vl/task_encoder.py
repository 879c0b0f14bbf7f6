"""The Qwen-VL Energon task encoder: ChatML WebDataset -> fixed-width THD packs.

* ``preencode_sample`` (before the packing buffer): parse the JSON, read image and video-file
  *headers* (a video's frames are sampled from its header, :mod:`.video`), and compute the exact
  token length from metadata; the buffered :class:`PackCandidate` holds the conversation and the
  encoded image / video bytes, never decoded pixels.
* ``postencode_sample`` (only for members of an emitted pack): tokenize, decode + patchify
  the media, and compute M-RoPE positions -> one :class:`ThdSegment`.
* ``batch``: the THD row of docs/concepts/batch_contract.md (with ``mrope_position_ids``) as a dict,
  plus ``vision_preset``: the record of the preset that built it (checked against HF models).

Costs are (aligned tokens[, ViT patches][, media items]) (see :class:`PackingConfig`). Bad
samples become counted skips with a reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator
from typing import Any

import torch
from megatron.energon import DefaultTaskEncoder, SkipSample, stateless
from megatron.energon.task_encoder.base import get_failure_tolerance
from megatron.energon.wrappers import MapDataset

from energon_pack.chat import ChatConfig
from energon_pack.chat.tokenizer import as_qwen_tokenizer, resolve_tokenizer
from energon_pack.energon.chatml import CHATML_COOKERS, ChatMLSample, parse_chatml
from energon_pack.energon.config import PackingConfig
from energon_pack.energon.samples import EncodedSegment, PackCandidate, SkippedSample
from energon_pack.energon.task_encoder import CarryOverPackingMixin
from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.packing.spec import renamed_knobs
from energon_pack.packing.step_cost import DEFAULT_SHAPE, DEFAULT_SHAPES
from energon_pack.pixels import TORCH_DTYPES, image_size_from_bytes
from energon_pack.thd import VISION_PRESET_KEY, ThdSegment, vision_preset_record
from energon_pack.video import FrameSampling, probe_video

from . import vision as V
from .chat import ImageMeta, VideoMeta, as_messages, encoded_length, postencode_media, preencode_chat, video_grid
from .mrope import mrope_position_ids
from .overlength import Piece, conversation_pieces, fit_media
from .presets import VisionPreset, get_preset
from .static_visual import static_visual_rows
from .video import VideoFile, check_sampling, plan_video

#: the most bytes of static pixel rows one pack may hold: a pack is [max_patches_per_pack, patch_dim] of the pixel
#: dtype, allocated whole (zero-padded) for every pack, and each loader worker holds several packs at once. 1 GiB is
#: over 6x Qwen2.5-VL's 16384-visual-token limit in float32 (65,536 patches x 1,176 x 4 bytes = 308 MB).
MAX_STATIC_PIXEL_BYTES = 1 << 30


def check_static_pixel_memory(max_patches_per_pack: int, preset: VisionPreset) -> int:
    """The bytes of one static pack's pixel rows; a ConfigError with the estimate when over
    :data:`MAX_STATIC_PIXEL_BYTES` (a worker would die allocating it, with no word of why)."""
    itemsize = torch.empty((), dtype=TORCH_DTYPES[preset.pixel_dtype]).element_size()
    need = max_patches_per_pack * preset.patch_dim * itemsize
    if need > MAX_STATIC_PIXEL_BYTES:
        raise ConfigError(
            "max_patches_per_pack",
            f"is {max_patches_per_pack:,}: static packs would allocate {need / 2**30:.1f} GiB of pixel rows per pack "
            f"({max_patches_per_pack:,} x {preset.patch_dim} x {preset.pixel_dtype}), in every loader worker, for "
            f"each pack it holds; the most accepted is {MAX_STATIC_PIXEL_BYTES // 2**30} GiB "
            f"({MAX_STATIC_PIXEL_BYTES // (preset.patch_dim * itemsize):,} patches)",
            "lower max_patches_per_pack to what packs hold (`energon-pack bench --visual-budget` recommends one)",
        )
    return need


#: the step-cost shape of ``balance="compute"`` per preset version, when neither ``PackingConfig.cost_model`` nor the
#: trained model is known (the one table, in :mod:`energon_pack.packing.step_cost`)
DEFAULT_COST_SHAPES = DEFAULT_SHAPES


class QwenVLPackingTaskEncoder(CarryOverPackingMixin, DefaultTaskEncoder):
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL finetuning on ChatML WebDataset with online packing.

    Every argument is keyword-only; a wrong value raises ``ConfigError`` naming the knob and the fix.

    Args:
        tokenizer: what turns text into the model's token ids (and so decides every token count, pack and
            skip): a Hugging Face tokenizer with the Qwen special tokens, a Qwen-VL name (``"qwen2-vl"``,
            ``"qwen2.5-vl"``, ``"qwen3-vl"``: that model's real tokenizer, loaded offline), or ``"demo"`` (the
            small shipped demo tokenizer, silently). Default None: the preset's own real tokenizer, so token
            counts are the model's; a preset whose name is not a Qwen-VL name has no known tokenizer, and
            None then falls back to the demo tokenizer with a ``DemoTokenizerWarning``.
        preset: the model version's vision settings (patch, merge and temporal patch sizes, min/max pixels,
            pixel dtype, M-RoPE style): a name of :data:`~energon_pack.qwen_vl.presets.PRESETS` or a
            :class:`VisionPreset` (e.g. ``get_preset("qwen2.5-vl", max_pixels=...)``). Default
            ``"qwen2.5-vl"``: the model of the docs' examples and of the Bridge recipe it shows.
        chat: how conversations are rendered and limited (system prompt, loss policy, images per sample,
            frames per video, visual tokens per sample). Default None: ``ChatConfig()``, the official chat
            template's system prompt, loss on every assistant turn, and Megatron-Bridge's limits (10 images,
            60 frames, 16384 visual tokens), so samples match what the released model was trained on.
        config: the packing knobs (width, alignment, budgets, packer knobs, skip policy; see
            :class:`PackingConfig`). Default None: ``PackingConfig()`` (width 8192, no alignment, no extra
            budgets, carry mode), with ``config_overrides`` applied on top. ``overlength="truncate"`` is
            refused (it would cut visual tokens); ``"fit"`` lowers an over-long sample's pixels / frames and
            ``"split"`` cuts a long conversation at user turns (:mod:`.overlength`), both counted as
            ``packing_stats`` adjustments.
        static_visual: put every pack's patch rows (images and videos) into ``visual_pixel_values``
            [``max_patches_per_pack``, row width] in token order, zero-padded to the budget, with
            ``visual_grid_thw`` (``pixel_values`` / ``pixel_values_videos`` are then None), so the vision
            input has fixed shapes for ``torch.compile`` and CUDA graphs. Needs ``max_patches_per_pack``, a
            multiple of ``merge_size**2``. Default False: the dynamic visual keys that HF models and
            Megatron-Bridge read (Bridge refuses static packs).
        max_vision_frames: static packs only: the most frames one pack may hold, a count (one per image,
            the temporal grid size per video); a packer budget, and the length of the vision tower's
            full-attention cu_seqlens. Default None: ``max_patches_per_pack // merge_size**2``, the most
            frames the patch budget can ever hold (a frame has at least ``merge_size**2`` patches), so it
            never binds before the patch budget; ``energon-pack bench --visual-budget`` recommends a tighter
            one. Setting it without ``static_visual=True`` is a ConfigError.
        video_sampling: how video files (``KEY.0.mp4``, ...) are sampled into frames: fps, min/max frames,
            frame factor (must equal the preset's temporal patch size) and the total-video token budget
            (:class:`~energon_pack.video.FrameSampling`). Videos stored as frame lists are not resampled.
            Default None: ``FrameSampling()``, qwen-vl-utils' defaults (2.0 fps, 4 to 768 frames, factor 2,
            128000 tokens), so a video gets the frames and sizes the model sees at inference.
        **config_overrides: :class:`PackingConfig` fields given directly (``seq_length=8192, cp=2, tp=4,
            sp=True, ...``), applied over ``config``; an unknown name is a ConfigError naming it.

    ``max_vision_frames`` and ``video_sampling`` are part of the resume fingerprint (they change which
    packs come next), like the :class:`PackingConfig` knobs.
    """

    cookers = CHATML_COOKERS
    decoder = None  # keep images as encoded bytes until postencode_sample

    def __init__(
        self,
        *,
        tokenizer: Any = None,  # a HF tokenizer with the Qwen special tokens, a Qwen-VL name, or "demo"
        preset: str | VisionPreset = "qwen2.5-vl",
        chat: ChatConfig | None = None,
        config: PackingConfig | None = None,
        static_visual: bool = False,
        max_vision_frames: int | None = None,
        video_sampling: FrameSampling | None = None,
        **config_overrides: Any,
    ) -> None:
        super().__init__()
        config = PackingConfig.build(config, **renamed_knobs(type(self).__name__, config_overrides, stacklevel=2))
        if config.overlength == "truncate":
            raise ConfigError(
                "overlength", "truncate would cut visual tokens", "use 'fit' or 'split' to keep such samples, or 'skip'"
            )
        self.preset = get_preset(preset)
        #: how video files (``KEY.0.mp4``, ...) are sampled; qwen-vl-utils' defaults
        self.video_sampling = check_sampling(video_sampling or FrameSampling(), self.preset)
        #: pad every pack's patch rows to max_patches_per_pack (:mod:`energon_pack.qwen_vl.static_visual`)
        self.static_visual = bool(static_visual)
        unit = self.preset.merge_size**2
        if self.static_visual and (config.max_patches_per_pack is None or config.max_patches_per_pack % unit):
            raise ConfigError(
                "static_visual",
                f"needs a patch budget max_patches_per_pack that is a multiple of {unit}, "
                f"got {config.max_patches_per_pack!r}",
                "set max_patches_per_pack (e.g. the budget `energon-pack bench --visual-budget` recommends)",
            )
        if self.static_visual:
            check_static_pixel_memory(config.max_patches_per_pack, self.preset)
        if max_vision_frames is not None and (
            not self.static_visual
            or isinstance(max_vision_frames, bool)  # True is an int: it would be a budget of one frame
            or not isinstance(max_vision_frames, int)
            or max_vision_frames < 1
        ):
            raise ConfigError(
                "max_vision_frames",
                f"is {max_vision_frames!r}; a positive frame budget of static packs",
                "set static_visual=True with it, or leave it None",
            )
        #: static packs: frames per pack (a packer budget; the vision tower's full-attention cu_seqlens length)
        self.max_vision_frames = (
            (max_vision_frames or config.max_patches_per_pack // unit) if self.static_visual else None
        )
        # the frame budget is a packer budget after those of the config (max_segments is one of those)
        self._extra_budgets = () if self.max_vision_frames is None else (self.max_vision_frames,)
        # None: the preset's own model tokenizer (the real Qwen-VL vocabulary, built offline); a preset of
        # another name has no known tokenizer, so None then warns and uses the demo one (DemoTokenizerWarning)
        self.tokenizer = as_qwen_tokenizer(
            resolve_tokenizer(tokenizer, where=type(self).__name__, default=self.preset.name)
        )
        self.configure_packing(config, self.tokenizer.pad_id)
        self.chat = chat or ChatConfig()
        shortest = encoded_length(
            [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}],
            tokenizer=self.tokenizer,
            preset=self.preset,
            config=self.chat,
        )
        self.check_width_fits(shortest, "a one-token answer to an empty question (the chat template's headers)")
        #: the most segments a pack can hold (every sample is at least this chat's shortest): a safe max_segments
        self.max_possible_segments = config.seq_length // self.layout.segment_span(shortest)
        V.warm_pixel_path(self.preset)  # compile/verify the pixel kernels here, before the loader's workers fork

    # ------------------------------------------------------------------ pre-encode (cheap)
    @stateless
    def preencode_sample(self, sample: ChatMLSample) -> PackCandidate | SkippedSample:
        """The sample's candidate (``overlength="fit"``: its media lowered to fit), or a counted-skip marker."""
        try:
            parsed = self._parsed(sample)
            if self.packing.overlength == "fit" and not self._fits(parsed["cost"]):
                parsed = self._fitted(parsed)
        except SampleSkipped as skip:
            return SkippedSample.derive_from(sample, reason=skip.reason, detail=skip.detail)
        return self._candidate(sample, parsed)

    @stateless
    def preencode_pieces(self, sample: ChatMLSample) -> Generator[PackCandidate | SkippedSample, None, None]:
        """``overlength="split"``: the sample, or the pieces of an over-long conversation
        (:func:`~.overlength.conversation_pieces`), each fitted when alone over the budgets; a generator, so each
        piece has its own restore key. The whole sample comes from :meth:`preencode_sample` (a subclass's reading
        of its own sample layout included)."""
        whole = self.preencode_sample(sample)
        if isinstance(whole, SkippedSample) or self._fits(whole.cost):
            yield whole
            return
        parsed = {**whole.payload, "cost": whole.cost}
        try:
            pieces = conversation_pieces(
                as_messages(parsed["conversation"], self.chat),
                len(parsed["images"]),
                len(parsed["videos"]),
                loss_policy=self.chat.loss_policy,
                system_prompt=self.chat.resolve_system_prompt(self.preset.default_system_prompt),
                fits=lambda piece: self._fits(self._piece(parsed, piece)["cost"]),
            )
        except SampleSkipped as skip:
            yield SkippedSample.derive_from(sample, reason=skip.reason, detail=skip.detail)
            return
        kept = [piece for piece in pieces if piece.trained]
        if not kept:
            yield SkippedSample.derive_from(sample, reason="no_trained_tokens", detail="no piece has a supervised turn")
            return
        split = len(pieces) > 1  # one piece: the whole sample, fitted below
        for i, piece in enumerate(kept):
            counts = {
                "split_pieces": int(split),
                "split": int(split and i == 0),
                "split_dropped_pieces": (len(pieces) - len(kept)) * (i == 0),
            }
            try:
                part = self._piece(parsed, piece)
                if not self._fits(part["cost"]):
                    if not part["images"] and not part["videos"]:
                        raise SampleSkipped(
                            "oversize_text", f"a turn of {part['length']} tokens alone is over the budgets"
                        )
                    part = self._fitted(part)
                    counts = {**counts, **part["adjustment"]}
            except SampleSkipped as skip:
                yield SkippedSample.derive_from(sample, reason=skip.reason, detail=skip.detail)
                continue
            part["adjustment"] = {k: v for k, v in counts.items() if v}
            candidate = self._candidate(sample, part)
            if split:
                candidate.__key__ = f"{sample.__key__}#{i}"
            yield candidate

    def build_encode_sample(self, dataset: Any, *, worker_config: Any) -> Any:
        """Energon's pre-encode map; with ``overlength="split"`` over :meth:`preencode_pieces` (one sample in, its
        pieces out)."""
        if self.packing.overlength != "split":
            return super().build_encode_sample(dataset, worker_config=worker_config)
        return MapDataset(
            dataset,
            self.preencode_pieces,
            worker_config=worker_config,
            stateless_map_fn=True,
            failure_tolerance=get_failure_tolerance(self.preencode_pieces, self.__default_failure_tolerance__),
        )

    def _parsed(self, sample: ChatMLSample) -> dict:
        """The sample's conversation, media, metadata, length and cost (SampleSkipped when bad)."""
        conversation, images, videos = parse_chatml(sample)
        image_metas = [ImageMeta(*image_size_from_bytes(img)) for img in images]
        video_metas = [self._video_meta(video) for video in videos]
        # video files stay encoded in the buffer, with their plan (frames are decoded after selection)
        videos = [VideoFile(v, m.plan) if m.plan is not None else v for v, m in zip(videos, video_metas)]
        return self._measured(conversation, images, videos, image_metas, video_metas)

    def _measured(self, conversation: Any, images: list, videos: list, image_metas: list, video_metas: list) -> dict:
        length, cost, _visual = self._measure(conversation, image_metas, video_metas)
        return {
            "conversation": conversation,
            "images": images,
            "videos": videos,
            "image_metas": image_metas,
            "video_metas": video_metas,
            "length": length,
            "cost": cost,
        }

    def _measure(self, conversation: Any, image_metas: list, video_metas: list) -> tuple[int, tuple, int]:
        """(token length, cost in every budget, visual pad tokens) of a conversation with these media sizes."""
        length = encoded_length(
            conversation, image_metas, video_metas, tokenizer=self.tokenizer, preset=self.preset, config=self.chat
        )
        video_grids = [video_grid(m, self.preset, self.chat) for m in video_metas]
        grids = [m.grid(self.preset) for m in image_metas] + video_grids
        patches = sum(math.prod(grid) for grid in grids)
        cost = self.packing.cost(self.layout.segment_span(length), patches, len(image_metas) + len(video_metas))
        frames = len(image_metas) + sum(grid[0] for grid in video_grids)
        cost += (frames,) if self.max_vision_frames is not None else ()
        return length, cost, patches // self.preset.merge_size**2

    def _fits(self, cost: tuple) -> bool:
        return all(c <= cap for c, cap in zip(cost, self.packing_capacity()))

    def _fitted(self, parsed: dict) -> dict:
        """``parsed`` with its media lowered to fit (:func:`~.overlength.fit_media`), its adjustment counted."""
        fitted = fit_media(
            parsed["image_metas"],
            parsed["video_metas"],
            parsed["videos"],
            measure=lambda images, videos: self._measure(parsed["conversation"], images, videos),
            capacity=self.packing_capacity(),
            width=self.packing.seq_length,
            span=self.layout.segment_span,
            preset=self.preset,
            sampling=self.video_sampling,
            config=self.chat,
        )
        videos = fitted.videos(parsed["videos"])
        out = self._measured(parsed["conversation"], parsed["images"], videos, fitted.image_metas, fitted.video_metas)
        return {**out, "adjustment": fitted.counts()}

    def _piece(self, parsed: dict, piece: Piece) -> dict:
        """One piece of a split sample: its messages, its own media and their metadata, measured."""
        images, videos = piece.image_indices, piece.video_indices
        return self._measured(
            piece.messages,
            [parsed["images"][i] for i in images],
            [parsed["videos"][i] for i in videos],
            [parsed["image_metas"][i] for i in images],
            [parsed["video_metas"][i] for i in videos],
        )

    @staticmethod
    def _candidate(sample: ChatMLSample, parsed: dict) -> PackCandidate:
        payload = {key: value for key, value in parsed.items() if key != "cost"}
        return PackCandidate.derive_from(sample, cost=parsed["cost"], payload=payload)

    @property
    def default_cost_shape(self) -> str:  # type: ignore[override]
        """The 7B/8B model of the preset's version: what ``balance="compute"`` prices by default."""
        return DEFAULT_COST_SHAPES.get(self.preset.rope_style, DEFAULT_SHAPE)

    def packing_step_cost(self, sample: Any) -> float:
        """One pre-encoded sample's step cost: its tokens as one segment, its images' and videos' grids."""
        payload = sample.payload
        grids = [m.grid(self.preset) for m in payload["image_metas"]]
        grids += [video_grid(m, self.preset, self.chat) for m in payload["video_metas"]]
        return self.step_cost_model.sample_cost(sample.cost[0], grids)

    def packing_capacity(self) -> tuple[int, ...]:
        """The config's budgets (segments among them), then, for static packs, the frame budget."""
        return super().packing_capacity() + self._extra_budgets

    def resume_knobs(self) -> dict:
        """The config's knobs, the frame budget of static packs and the video frame sampling (each changes
        which packs come next)."""
        return {
            **super().resume_knobs(),
            "max_vision_frames": self.max_vision_frames,
            "video_sampling": dataclasses.asdict(self.video_sampling),
        }

    @stateless
    def batch(self, samples: list[Any]) -> dict:
        """The THD row, with the record of this encoder's preset under ``vision_preset``."""
        batch = super().batch(samples)
        batch[VISION_PRESET_KEY] = vision_preset_record(self.preset)
        if self.static_visual:
            p, special = self.preset, self.tokenizer.special
            batch = static_visual_rows(
                batch,
                self.packing.max_patches_per_pack,
                image_pad=special.image_pad,
                video_pad=special.video_pad,
                merge=p.merge_size,
                max_frame_patches=max(p.max_pixels, p.video_max_pixels) // p.patch_size**2,
                max_frames=self.max_vision_frames,
                row_width=3 * p.temporal_patch_size * p.patch_size**2,
                dtype=TORCH_DTYPES[p.pixel_dtype],
            )
        return batch

    def _video_meta(self, frames: bytes | list) -> VideoMeta:
        if isinstance(frames, (bytes, bytearray)):  # a video file: its header, Qwen's sampling of it
            return VideoMeta.from_plan(plan_video(probe_video(frames), self.preset, self.video_sampling))
        if not frames:
            raise SampleSkipped("empty_video", "video has no frames")
        width, height = image_size_from_bytes(frames[0])
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
        enc = preencode_chat(
            p["conversation"],
            p["image_metas"],
            p["video_metas"],
            tokenizer=self.tokenizer,
            preset=self.preset,
            config=self.chat,
        )
        if enc.length != p["length"]:
            raise SampleSkipped("length_mismatch", f"metadata length {p['length']} != encoded {enc.length}")
        # laid out when the pack is built: written once, into the pack's (shared-memory) buffer
        media = postencode_media(
            p["images"],
            p["videos"],
            preset=self.preset,
            config=self.chat,
            expected=enc,
            lazy_layout=True,
            image_metas=p["image_metas"],
            video_metas=p["video_metas"],
        )
        special = self.tokenizer.special
        positions = mrope_position_ids(
            enc.input_ids,
            enc.image_grid_thw,
            enc.video_grid_thw,
            enc.second_per_grid_ts,
            preset=self.preset,
            image_pad_id=special.image_pad,
            video_pad_id=special.video_pad,
        )
        visual = {}
        if len(enc.image_grid_thw):
            visual.update(pixel_values=media.pixel_values, image_grid_thw=enc.image_grid_thw)
        if len(enc.video_grid_thw):
            visual.update(
                pixel_values_videos=media.pixel_values_videos,
                video_grid_thw=enc.video_grid_thw,
                second_per_grid_ts=torch.tensor(enc.second_per_grid_ts, dtype=torch.float32),
            )
        segment = ThdSegment(
            enc.input_ids,
            enc.labels,
            enc.loss_mask,
            mrope_position_ids=positions,
            visual=visual or None,
            key=sample.__key__,
        )
        return EncodedSegment.derive_from(sample, segment=segment)
