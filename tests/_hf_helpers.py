"""Tiny HF Qwen-VL models and pack splitting for tests/test_integration_hf.py (no Energon import here).

Kept apart so a GPU check can reuse them on a machine without megatron-energon.
"""

import torch

from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import get_preset

VOCAB = 776  # the demo tokenizer has 773 ids


PRESETS = {"qwen2-vl": "qwen2_vl", "qwen2.5-vl": "qwen2_5_vl", "qwen3-vl": "qwen3_vl"}


def small_preset(name):
    """The model version's preset (patch, merge, temporal patch, rope style) with small pixel budgets."""
    f2 = get_preset(name).factor ** 2
    return get_preset(name, min_pixels=4 * f2, max_pixels=12 * f2, video_min_pixels=4 * f2, video_max_pixels=6 * f2)


def tiny_model(name, tok):
    """A tiny random-init HF model of the version ``name`` (fp32, eval, seeded), default sdpa attention."""
    import transformers as tf

    preset = get_preset(name)
    sp = tok.special
    ids = dict(image_token_id=sp.image_pad, video_token_id=sp.video_pad, vision_start_token_id=sp.vision_start,
               vision_end_token_id=sp.vision_end)
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.1,
                bos_token_id=None, eos_token_id=sp.im_end, pad_token_id=sp.pad,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    vision = dict(depth=2, num_heads=2, patch_size=preset.patch_size, temporal_patch_size=preset.temporal_patch_size,
                  spatial_merge_size=preset.merge_size, initializer_range=0.1)
    torch.manual_seed(0)
    if name == "qwen2-vl":
        cfg = tf.Qwen2VLConfig(text_config=text, vision_config=dict(vision, embed_dim=32, hidden_size=64, mlp_ratio=2),
                               **ids)
        model = tf.Qwen2VLForConditionalGeneration(cfg)
    elif name == "qwen2.5-vl":
        cfg = tf.Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            vision, hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=56,
            fullatt_block_indexes=[1], tokens_per_second=int(preset.tokens_per_second)), **ids)
        model = tf.Qwen2_5_VLForConditionalGeneration(cfg)
    else:
        cfg = tf.Qwen3VLConfig(text_config=dict(text, head_dim=16), vision_config=dict(
            vision, hidden_size=32, intermediate_size=64, out_hidden_size=64, num_position_embeddings=64,
            deepstack_visual_indexes=[0]), **ids)
        model = tf.Qwen3VLForConditionalGeneration(cfg)
    assert model.config.model_type == PRESETS[name]
    return model.float().eval()


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
            pix.append(pixels[prow: prow + int(g.prod())])
            prow += int(g.prod())
            row += 1
        assert n_tokens == 0
        cursors[kind] = [row, prow]
        return (torch.stack(rows), torch.cat(pix)) if rows else (None, None)

    for s in range(batch["num_segments"]):
        start, length = cu_pad[s], cu[s + 1] - cu[s]
        ids = batch["input_ids"][0, start: start + length]
        seg = {"start": start, "length": length, "input_ids": ids[None],
               "labels": batch["labels"][:, start: start + length], "loss_mask": batch["loss_mask"][:, start: start + length]}
        n_img, n_vid = int((ids == image_pad).sum()), int((ids == video_pad).sum())
        if n_img:
            seg["image_grid_thw"], seg["pixel_values"] = take("img", img_grid, batch["pixel_values"], n_img)
        if n_vid:
            seg["video_grid_thw"], seg["pixel_values_videos"] = take("vid", vid_grid, batch["pixel_values_videos"], n_vid)
            first = cursors["vid"][0] - len(seg["video_grid_thw"])
            seg["second_per_grid_ts"] = batch["second_per_grid_ts"][first: cursors["vid"][0]]
        out.append(seg)
    assert img_grid is None or cursors["img"][0] == len(img_grid)
    assert vid_grid is None or cursors["vid"][0] == len(vid_grid)
    return out


def alone_forward(model, seg):
    """HF's own unpacked path: plain input_ids, no positions (HF computes M-RoPE), attention_mask None."""
    kw = {k: seg[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw") if k in seg}
    if "second_per_grid_ts" in seg and model.config.model_type == "qwen2_5_vl":
        kw["second_per_grid_ts"] = seg["second_per_grid_ts"]
    return model(input_ids=seg["input_ids"], attention_mask=None, use_cache=False,
                 mm_token_type_ids=H.mm_token_type_ids(seg["input_ids"], model.config), **kw).logits


def max_seg_diff(packed_logits, alone_logits, segments):
    return max(float((packed_logits[0, s["start"]: s["start"] + s["length"]] - a[0]).abs().max())
               for s, a in zip(segments, alone_logits))
