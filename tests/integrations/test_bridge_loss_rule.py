"""The loss rule knob against Megatron-Bridge's own loss mask (issue 21, item 10).

Bridge's Qwen-VL collate (``models/qwen_vl/data/collate_fn.py``: ``qwen2_5_collate_fn`` and, on
Bridge's main branch, ``prepare_qwen_vl_sequence``) builds its mask with
``data/conversation_processing.py:build_assistant_loss_mask`` and a boundary config from the markers
``<|im_start|>assistant\\n`` / ``<|im_end|>\\n``, end tokens included: the ``\\n`` after each
assistant ``<|im_end|>`` is trained. Here Bridge's real function (PyPI wheel, CPU light import,
``tests/_bridge_light.py``) runs on our token ids with the official template, and its supervised
positions must equal ours under ``train_newline_after_im_end=True``, exactly, in the Qwen-VL Energon
encoder, the text Energon encoder and the GPT-SFT chat dataset; the default differs by exactly the
newline after each assistant turn.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from energon_pack.chat import ChatConfig, load_qwen_hf_tokenizer
from energon_pack.energon import TextPackingTaskEncoder
from energon_pack.energon.chatml import ChatMLSample
from energon_pack.energon.text import TextRecordSample
from energon_pack.errors import ConfigError
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.sft import JsonlSFTDataset

sys.path.insert(0, str(Path(__file__).parents[1]))
from _bridge_light import bridge_module, bridge_version  # noqa: E402

pytest.importorskip("jinja2")
needs_bridge = pytest.mark.skipif(
    bridge_version() is None, reason="megatron-bridge wheel not installed (setup.sh installs it)"
)
TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
NEWLINE, IM_END = 198, 151645


def _user(text):
    return {"role": "user", "content": text}


def _asst(text):
    return {"role": "assistant", "content": text}


TEXT_CONVERSATIONS = [
    [_user("What is 2+2?"), _asst("4")],
    [_user("hi"), _asst("hello there"), _user("and more?"), _asst("Sure:\n- one\n- two\n")],
    [
        {"role": "system", "content": "Be terse."},
        _user("Name a colour."),
        _asst("Blue."),
        _user("Another"),
        _asst("  Red  "),
    ],
    [_user("code?"), _asst("```python\nprint(1)\n```"), _user("thanks"), _asst("You're welcome!\n\n")],
]

#: OpenAI tool calls (Qwen3-VL's template and the text chat path render them; Qwen2/2.5-VL skip them)
TOOL_CONVERSATION = [
    _user("Weather in Paris?"),
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "18C"},
    _asst("It is 18C."),
]


def _parts(conv, image_first=False):
    """Content-list form (what Bridge's examples hold); optionally an image before the first user text."""
    out = []
    for i, turn in enumerate(conv):
        parts = [{"type": "text", "text": turn["content"]}]
        if image_first and i == next(j for j, t in enumerate(conv) if t["role"] == "user"):
            parts.insert(0, {"type": "image"})
        out.append({"role": turn["role"], "content": parts})
    return out


@pytest.fixture(scope="module")
def bridge():
    cp = bridge_module("data.conversation_processing")
    tu = bridge_module("data.token_utils")
    cf = bridge_module("models.qwen_vl.data.collate_fn")
    return cp, tu, cf


def _hf(template: str):
    hf = load_qwen_hf_tokenizer("qwen2.5-vl" if "2_5" in template else "qwen3-vl")
    hf.chat_template = (TEMPLATES / template).read_text()
    return hf


def bridge_mask(bridge, hf, conversation, input_ids) -> torch.Tensor:
    """Bridge's unshifted loss mask for ``input_ids``, built as its Qwen-VL collate builds it."""
    cp, tu, cf = bridge
    config = cp.assistant_mask_boundary_config_from_markers(
        hf,
        assistant_start=cf.CHATML_ASSISTANT_START,
        assistant_end=cf.CHATML_ASSISTANT_END,
        assistant_end_fallbacks=("<|im_end|>",),
        role_start_markers=cf.CHATML_OTHER_ROLE_STARTS,
    )
    mask = cp.build_assistant_loss_mask(
        {"conversation": conversation},
        [int(i) for i in input_ids],
        hf,
        tu.extract_skipped_token_ids(hf),
        boundary_config=config,
    )
    return mask.bool()


def _template_ids(hf, conversation) -> list[int]:
    out = hf.apply_chat_template(conversation, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _newlines_after_assistant_end(ids, bridge_target) -> torch.Tensor:
    ids = torch.as_tensor(ids)
    after_end = torch.zeros_like(bridge_target)
    after_end[1:] = (ids[:-1] == IM_END) & bridge_target[:-1]
    return after_end & (ids == NEWLINE)


def _jpeg(w, h):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _qwen_vl_segment(encoder, conversation, images=()):
    fields = {"json": json.dumps(conversation).encode(), **{f"{i}.jpg": img for i, img in enumerate(images)}}
    candidate = encoder.preencode_sample(
        ChatMLSample(__key__="k", __restore_key__=(), __subflavors__={}, fields=fields)
    )
    return encoder._postencode(candidate).segment


@needs_bridge
@pytest.mark.parametrize("with_image", [False, True])
def test_qwen_vl_encoder_equals_bridge_under_the_knob(bridge, with_image):
    hf = _hf("qwen2_5_vl_instruct.jinja")
    ours = QwenVLPackingTaskEncoder(
        tokenizer=hf, preset="qwen2.5-vl", seq_length=4096, chat=ChatConfig(train_newline_after_im_end=True)
    )
    default = QwenVLPackingTaskEncoder(tokenizer=hf, preset="qwen2.5-vl", seq_length=4096)
    images = [_jpeg(64, 48)] if with_image else []
    for conv in TEXT_CONVERSATIONS:
        stored = _parts(conv, image_first=with_image)
        seg, seg_default = _qwen_vl_segment(ours, stored, images), _qwen_vl_segment(default, stored, images)
        ids = seg.input_ids
        if not with_image:
            assert ids.tolist() == _template_ids(hf, stored)  # the official template's ids
        target = bridge_mask(bridge, hf, stored, ids)
        # Bridge shifts its mask and labels the same way: mask[1:] + 0, labels = next id where supervised
        shifted = torch.cat([target[1:], torch.zeros(1, dtype=torch.bool)])
        assert torch.equal(seg.loss_mask.bool(), shifted)
        assert torch.equal(seg.labels, torch.where(shifted, torch.cat([ids[1:], ids.new_full((1,), -100)]), -100))
        newline = _newlines_after_assistant_end(ids, target)
        assert int(newline.sum()) == sum(t["role"] == "assistant" for t in conv)
        assert torch.equal(
            seg_default.loss_mask.bool(), torch.cat([(target & ~newline)[1:], torch.zeros(1, dtype=torch.bool)])
        )


@needs_bridge
def test_text_encoder_and_gpt_sft_chat_equal_bridge_under_the_knob(bridge, tmp_path):
    hf = _hf("qwen3_vl_instruct.jinja")  # the text chat path adds no system prompt, like Qwen3-VL's template
    path = tmp_path / "chat.jsonl"
    conversations = TEXT_CONVERSATIONS + [TOOL_CONVERSATION]
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    ds = JsonlSFTDataset(path, hf, format="chat", train_newline_after_im_end=True, cache_dir=tmp_path)
    ds_default = JsonlSFTDataset(path, hf, format="chat", cache_dir=tmp_path)
    te = TextPackingTaskEncoder(tokenizer=hf, format="chat", seq_length=4096, train_newline_after_im_end=True)
    for i, conv in enumerate(conversations):
        enc = ds[i]
        assert enc.input_ids.tolist() == _template_ids(hf, conv)
        target = bridge_mask(bridge, hf, conv, enc.input_ids)
        assert enc.target_mask.tolist() == target.tolist()
        newline = _newlines_after_assistant_end(enc.input_ids, target)
        assert int(newline.sum()) == sum(t["role"] == "assistant" for t in conv)
        assert ds_default[i].target_mask.tolist() == (target & ~newline).tolist()
        raw = json.dumps({"messages": conv}).encode()
        ids, mask = te.preencode_sample(
            TextRecordSample(__key__=str(i), __restore_key__=(), __subflavors__={}, raw=raw)
        ).payload
        assert ids.tolist() == enc.input_ids.tolist() and mask.tolist() == target.tolist()


def test_knob_is_a_bool_and_part_of_the_gpt_sft_cache_key(tmp_path):
    with pytest.raises(ConfigError, match="train_newline_after_im_end"):
        ChatConfig(train_newline_after_im_end="bridge")
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": TEXT_CONVERSATIONS[1]}) + "\n")
    on = JsonlSFTDataset(
        path, "demo", format="chat", train_newline_after_im_end=True, cache_dir=tmp_path, cache_tokens=True
    )
    off = JsonlSFTDataset(path, "demo", format="chat", cache_dir=tmp_path, cache_tokens=True)
    assert on.format.fingerprint() != off.format.fingerprint()
    # the token cache stores the supervised bit: each knob value reads its own, 2 assistant newlines apart
    assert int(on[0].target_mask.sum()) - int(off[0].target_mask.sum()) == 2
