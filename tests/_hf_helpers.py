"""Tiny HF Qwen-VL models and pack splitting for tests/integrations/test_integration_hf.py (no Energon import here).

Kept apart so a GPU check can reuse them on a machine without megatron-energon.
"""

import inspect

import pytest
import torch

from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import get_preset

VOCAB = 776  # the demo tokenizer has 773 ids

#: the HF tests prepare every model explicitly (H.prepare_model): the deprecated preparation by the forward kwargs
#: is an error in them, outside the tests of that path (whose pytest.warns records it)
NO_IMPLICIT_PREPARE = pytest.mark.filterwarnings("error:installing the vision tower guards:DeprecationWarning")


PRESETS = {"qwen2-vl": "qwen2_vl", "qwen2.5-vl": "qwen2_5_vl", "qwen3-vl": "qwen3_vl"}


def small_preset(name):
    """The model version's preset (patch, merge, temporal patch, rope style) with small pixel budgets.

    Videos at 0.8 fps: 2.5 s per temporal grid step, so a Qwen2.5-VL video's temporal M-RoPE index
    (floor(t * 2.5 * tokens_per_second)) differs from the truncating releases' (t * int(2.5) * tps) and
    outruns its spatial extent (where the text after it resumes differs between releases)."""
    f2 = get_preset(name).factor ** 2
    return get_preset(
        name, min_pixels=4 * f2, max_pixels=12 * f2, video_min_pixels=4 * f2, video_max_pixels=6 * f2, video_fps=0.8
    )


def rope_config(text_config_cls, mrope_section=(2, 3, 3), theta=10000.0):
    """The text config's M-RoPE settings in the form the installed transformers takes: ``rope_parameters``
    (5.x) or ``rope_theta`` + ``rope_scaling`` (4.x), read off the config class's signature."""
    rope = {"rope_type": "default", "mrope_section": list(mrope_section)}
    if "rope_parameters" in inspect.signature(text_config_cls.__init__).parameters:
        return {"rope_parameters": {**rope, "rope_theta": theta}}
    return {"rope_theta": theta, "rope_scaling": rope}


def tiny_text_kwargs(special):
    """The tiny decoder every test model shares (2 layers of width 64), ids from the tokenizer's ``special``."""
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=special.im_end,
        pad_token_id=special.pad,
    )


def tiny_model(name, tok):
    """A tiny random-init HF model of the version ``name`` (fp32, eval, seeded), default sdpa attention."""
    import transformers as tf

    preset = get_preset(name)
    sp = tok.special
    ids = dict(
        image_token_id=sp.image_pad,
        video_token_id=sp.video_pad,
        vision_start_token_id=sp.vision_start,
        vision_end_token_id=sp.vision_end,
    )
    text_cls = {
        "qwen2-vl": tf.Qwen2VLTextConfig,
        "qwen2.5-vl": tf.Qwen2_5_VLTextConfig,
        "qwen3-vl": tf.Qwen3VLTextConfig,
    }[name]
    text = dict(**tiny_text_kwargs(sp), **rope_config(text_cls))
    vision = dict(
        depth=2,
        num_heads=2,
        patch_size=preset.patch_size,
        temporal_patch_size=preset.temporal_patch_size,
        spatial_merge_size=preset.merge_size,
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    if name == "qwen2-vl":
        cfg = tf.Qwen2VLConfig(
            text_config=text, vision_config=dict(vision, embed_dim=32, hidden_size=64, mlp_ratio=2), **ids
        )
        model = tf.Qwen2VLForConditionalGeneration(cfg)
    elif name == "qwen2.5-vl":
        cfg = tf.Qwen2_5_VLConfig(
            text_config=text,
            vision_config=dict(
                vision,
                hidden_size=32,
                intermediate_size=64,
                out_hidden_size=64,
                window_size=56,
                fullatt_block_indexes=[1],
                tokens_per_second=int(preset.tokens_per_second),
            ),
            **ids,
        )
        model = tf.Qwen2_5_VLForConditionalGeneration(cfg)
    else:
        cfg = tf.Qwen3VLConfig(
            text_config=dict(text, head_dim=16),
            vision_config=dict(
                vision,
                hidden_size=32,
                intermediate_size=64,
                out_hidden_size=64,
                num_position_embeddings=64,
                deepstack_visual_indexes=[0],
            ),
            **ids,
        )
        model = tf.Qwen3VLForConditionalGeneration(cfg)
    assert model.config.model_type == PRESETS[name]
    return model.float().eval()


def vision_varlen_in_one_call(model_type):
    """Whether the installed release's ``model_type`` vision attention hands its cu_seqlens to any "flash"
    attention function (5.x: ``is_flash_attention_requested``), so our varlen attention covers all images
    of a block in one call; 4.57 does so for ``"flash_attention_2"`` only and loops over images otherwise."""
    import importlib

    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return hasattr(modeling, "is_flash_attention_requested")


def split_pack(batch, image_pad, video_pad):
    """Each member sample of a pack alone: its real tokens, labels, loss mask and its own visual rows."""
    cu, cu_pad = batch["cu_seqlens_q"].tolist(), batch["cu_seqlens_q_padded"].tolist()
    img_grid, vid_grid = batch["image_grid_thw"], batch["video_grid_thw"]
    cursors = {"img": [0, 0], "vid": [0, 0]}  # (grid row, pixel row)
    out = []

    def take(kind, grids, pixels, n_tokens):
        rows, pix = [], []
        row, prow = cursors[kind]
        while n_tokens > 0:
            g = grids[row]
            n_tokens -= int(g.prod()) // 4
            rows.append(g)
            pix.append(pixels[prow : prow + int(g.prod())])
            prow += int(g.prod())
            row += 1
        assert n_tokens == 0
        cursors[kind] = [row, prow]
        return (torch.stack(rows), torch.cat(pix)) if rows else (None, None)

    for s in range(batch["num_segments"]):
        start, length = cu_pad[s], cu[s + 1] - cu[s]
        ids = batch["input_ids"][0, start : start + length]
        seg = {
            "start": start,
            "length": length,
            "input_ids": ids[None],
            "labels": batch["labels"][:, start : start + length],
            "loss_mask": batch["loss_mask"][:, start : start + length],
        }
        n_img, n_vid = int((ids == image_pad).sum()), int((ids == video_pad).sum())
        if n_img:
            seg["image_grid_thw"], seg["pixel_values"] = take("img", img_grid, batch["pixel_values"], n_img)
        if n_vid:
            seg["video_grid_thw"], seg["pixel_values_videos"] = take(
                "vid", vid_grid, batch["pixel_values_videos"], n_vid
            )
            first = cursors["vid"][0] - len(seg["video_grid_thw"])
            seg["second_per_grid_ts"] = batch["second_per_grid_ts"][first : cursors["vid"][0]]
        out.append(seg)
    assert img_grid is None or cursors["img"][0] == len(img_grid)
    assert vid_grid is None or cursors["vid"][0] == len(vid_grid)
    return out


def alone_forward(model, seg):
    """HF's own unpacked path: plain input_ids, no positions (HF computes M-RoPE), an all-ones attention mask.

    The mask is what a processor returns; without it 4.57's Qwen3-VL reads its temporal M-RoPE row as
    text positions and "detects" packed sequences inside every image. ``mm_token_type_ids`` only where
    ``forward`` takes it (5.x computes M-RoPE from it; 4.x reads the token ids)."""
    kw = {k: seg[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw") if k in seg}
    if "second_per_grid_ts" in seg and model.config.model_type == "qwen2_5_vl":
        kw["second_per_grid_ts"] = seg["second_per_grid_ts"]
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        kw["mm_token_type_ids"] = H.mm_token_type_ids(seg["input_ids"], model.config)
    return model(
        input_ids=seg["input_ids"], attention_mask=torch.ones_like(seg["input_ids"]), use_cache=False, **kw
    ).logits


def max_seg_diff(packed_logits, alone_logits, segments):
    return max(
        float((packed_logits[0, s["start"] : s["start"] + s["length"]] - a[0]).abs().max())
        for s, a in zip(segments, alone_logits)
    )
