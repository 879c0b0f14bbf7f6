"""Qwen-VL sample encoding: presets, size-only token counts, vision blocks in ChatML, M-RoPE.

Pure functions (no megatron.energon import); the Energon task encoder builds on them. The
model-neutral chat names (``ChatConfig``, the tokenizer adapter, ...) live in
:mod:`energon_pack.chat`, the pixel engine's (``PendingPatchRows``, ``normalize_pixels``, ...) in
:mod:`energon_pack.pixels`; both are re-exported here for convenience.
"""

from ..chat import (
    LOSS_POLICIES,
    QWEN_SPECIAL_TOKENS,
    TEMPLATE_DEFAULT,
    ChatConfig,
    Message,
    QwenTokenizer,
    SpecialIds,
    TokenizerLike,
    as_qwen_tokenizer,
    load_demo_tokenizer,
    load_demo_tokenizer_raw,
    normalize_conversation,
    place_media,
)
from ..pixels import PendingPatchRows, image_size_from_bytes, normalization_lut, normalize_pixels, pixels_to_torch
from .chat import (
    EncodedChat,
    ImageMeta,
    VideoMeta,
    VisualInputs,
    encode_chat,
    encoded_length,
    image_metas_from_bytes,
    postencode_media,
    preencode_chat,
)
from .mrope import mrope_position_ids
from .presets import PIXEL_DTYPES, PRESETS, VisionPreset, get_preset
from .video import VideoFile, VideoPlan, plan_video
from .vision import (
    image_grid_thw,
    patchify_image,
    patchify_video,
    second_per_grid_t,
    smart_resize,
    video_grid_thw,
    video_smart_resize,
    video_token_count,
    visual_token_count,
)

__all__ = [
    "LOSS_POLICIES",
    "PIXEL_DTYPES",
    "PRESETS",
    "QWEN_SPECIAL_TOKENS",
    "TEMPLATE_DEFAULT",
    "ChatConfig",
    "EncodedChat",
    "ImageMeta",
    "Message",
    "PendingPatchRows",
    "QwenTokenizer",
    "SpecialIds",
    "TokenizerLike",
    "VideoFile",
    "VideoMeta",
    "VideoPlan",
    "VisionPreset",
    "VisualInputs",
    "as_qwen_tokenizer",
    "encode_chat",
    "encoded_length",
    "get_preset",
    "image_grid_thw",
    "image_metas_from_bytes",
    "image_size_from_bytes",
    "load_demo_tokenizer",
    "load_demo_tokenizer_raw",
    "mrope_position_ids",
    "normalization_lut",
    "normalize_conversation",
    "normalize_pixels",
    "patchify_image",
    "patchify_video",
    "pixels_to_torch",
    "place_media",
    "plan_video",
    "postencode_media",
    "preencode_chat",
    "second_per_grid_t",
    "smart_resize",
    "video_grid_thw",
    "video_smart_resize",
    "video_token_count",
    "visual_token_count",
]
