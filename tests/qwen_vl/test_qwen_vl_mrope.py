"""M-RoPE positions vs transformers' get_rope_index (called on a minimal object: no weights, no config download)."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from energon_pack.qwen_vl import ChatConfig, get_preset, load_demo_tokenizer, mrope_position_ids, preencode_chat

transformers = pytest.importorskip("transformers")

TOK = load_demo_tokenizer()

SAMPLES = [
    # (conversation, images (w, h), videos (frames, w, h, fps))
    ([{"role": "user", "content": "<image>Describe."}, {"role": "assistant", "content": "A cat."}], [(300, 500)], []),
    (
        [
            {"role": "user", "content": "Compare <image> and <image> please"},
            {"role": "assistant", "content": "Same."},
            {"role": "user", "content": "And <video>?"},
            {"role": "assistant", "content": "Moving."},
        ],
        [(56, 56), (1000, 200)],
        [(8, 320, 240, 2.0)],
    ),
    (
        [{"from": "human", "value": "<video>\n<image>What happens?"}, {"from": "gpt", "value": "It rains 3 times."}],
        [(640, 480)],
        [(5, 200, 640, 1.0)],
    ),
    ([{"role": "user", "content": "Watch"}, {"role": "assistant", "content": "ok"}], [], [(40, 64, 64, 4.0)]),
    ([{"role": "user", "content": "text only"}, {"role": "assistant", "content": "fine"}], [], []),
]


def _model_cls(style):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if style == "qwen2":
            from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel as cls
        elif style == "qwen2.5":
            from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel as cls
        else:
            from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel as cls
    return cls


def _reference(style, preset, enc):
    """Run the real get_rope_index method on a stand-in ``self`` holding only what it reads."""
    cls = _model_cls(style)
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(
            vision_config=types.SimpleNamespace(
                spatial_merge_size=preset.merge_size, tokens_per_second=preset.tokens_per_second
            )
        )
    )
    fake.get_vision_position_ids = types.MethodType(cls.get_vision_position_ids, fake)
    ids = enc.input_ids[None]
    mm = torch.zeros_like(ids, dtype=torch.int32)
    mm[ids == TOK.special.image_pad] = 1
    mm[ids == TOK.special.video_pad] = 2
    kwargs = dict(
        input_ids=ids,
        mm_token_type_ids=mm,
        image_grid_thw=enc.image_grid_thw if len(enc.image_grid_thw) else None,
        video_grid_thw=enc.video_grid_thw.clone() if len(enc.video_grid_thw) else None,
        attention_mask=torch.ones_like(ids),
    )
    if style == "qwen2.5":
        kwargs["second_per_grid_ts"] = torch.tensor(enc.second_per_grid_ts) if enc.second_per_grid_ts else None
    pos, _ = cls.get_rope_index(fake, **kwargs)
    return pos[:, 0]


@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_mrope_matches_transformers_get_rope_index(name):
    preset = get_preset(name, max_pixels=400_000)
    for conv, images, videos in SAMPLES:
        enc = preencode_chat(conv, images, videos, tokenizer=TOK, preset=preset, config=ChatConfig())
        ours = mrope_position_ids(
            enc.input_ids,
            enc.image_grid_thw,
            enc.video_grid_thw,
            enc.second_per_grid_ts,
            preset=preset,
            image_pad_id=TOK.special.image_pad,
            video_pad_id=TOK.special.video_pad,
        )
        ref = _reference(preset.rope_style, preset, enc)
        assert ours.shape == (3, enc.length)
        assert torch.equal(ours, ref), (name, conv)


def test_mrope_hand_computed():
    # Qwen2.5-VL, 2 text tokens, one video grid (t=2, h=4, w=4) -> 2x2x2 = 8 LLM tokens, 1 text token after.
    # tokens_per_second=2, second_per_grid_t=2 (fps 1) -> temporal index step 4.
    p = get_preset("qwen2.5-vl")
    V_ = 9
    ids = torch.tensor([5, 6] + [V_] * 8 + [7])
    pos = mrope_position_ids(ids, None, [[2, 4, 4]], [2.0], preset=p, image_pad_id=8, video_pad_id=V_)
    t = [0, 1] + [2, 2, 2, 2, 6, 6, 6, 6] + [4]
    h = [0, 1] + [2, 2, 3, 3, 2, 2, 3, 3] + [4]
    w = [0, 1] + [2, 3, 2, 3, 2, 3, 2, 3] + [4]
    assert pos.tolist() == [t, h, w]
    # older rule: text resumes after the block's max position (6) + 1
    pos = mrope_position_ids(ids, None, [[2, 4, 4]], [2.0], preset=p, image_pad_id=8, video_pad_id=V_, resume="max")
    assert pos[:, -1].tolist() == [7, 7, 7]
    # Qwen3-VL: the same video is two per-frame blocks of 4 tokens, t = 0, separated by text
    q3 = get_preset("qwen3-vl")
    ids = torch.tensor([5] + [V_] * 4 + [6, 6] + [V_] * 4)
    pos = mrope_position_ids(ids, None, [[2, 4, 4]], None, preset=q3, image_pad_id=8, video_pad_id=V_)
    assert pos.tolist() == [
        [0, 1, 1, 1, 1, 3, 4, 5, 5, 5, 5],
        [0, 1, 1, 2, 2, 3, 4, 5, 5, 6, 6],
        [0, 1, 2, 1, 2, 3, 4, 5, 6, 5, 6],
    ]
    with pytest.raises(ValueError):
        mrope_position_ids(ids, None, [[2, 4, 6]], None, preset=q3, image_pad_id=8, video_pad_id=V_)
