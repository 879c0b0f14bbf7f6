"""ChatML rendering, loss masks, metadata length == real encoding, tokenizer asset, bad input."""

from __future__ import annotations

import io
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.qwen_vl import (
    ChatConfig,
    QwenTokenizer,
    encode_chat,
    encoded_length,
    get_preset,
    load_demo_tokenizer,
    load_demo_tokenizer_raw,
    normalize_conversation,
    preencode_chat,
)
from energon_pack.qwen_vl import vision as V
from energon_pack.thd import IGNORE_INDEX

ROOT = Path(__file__).resolve().parents[2]
TOK = load_demo_tokenizer()
RAW = load_demo_tokenizer_raw()
SP = TOK.special
Q2 = get_preset("qwen2-vl")


def _ids(text: str) -> list[int]:
    return RAW.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------------------------------------
# independent reference: render the whole string (pads expanded) and tokenise it in one go
# ---------------------------------------------------------------------------------------------


def _reference_string(conv, images, videos, preset, config):
    msgs = normalize_conversation(conv)
    n_img_ph = sum(k == "image" for m in msgs for k, _ in m.parts)
    n_vid_ph = sum(k == "video" for m in msgs for k, _ in m.parts)
    merge2 = preset.merge_size**2

    def image_block(i):
        w, h = images[i]
        return "<|vision_start|>" + "<|image_pad|>" * V.visual_token_count(h, w, preset) + "<|vision_end|>"

    def video_block(i):
        n, w, h, fps = videos[i]
        n = min(n, config.max_num_frames)
        t, gh, gw = V.video_grid_thw(n, h, w, preset)
        if preset.rope_style != "qwen3":
            return "<|vision_start|>" + "<|video_pad|>" * (t * gh * gw // merge2) + "<|vision_end|>"
        idx = list(range(n)) + [n - 1] * (-n % 2)
        out = ""
        for k in range(t):
            ts = (idx[2 * k] / fps + idx[2 * k + 1] / fps) / 2
            out += f"<{ts:.1f} seconds><|vision_start|>" + "<|video_pad|>" * (gh * gw // merge2) + "<|vision_end|>"
        return out

    text = ""
    system_prompt = config.resolve_system_prompt(preset.default_system_prompt)
    if system_prompt is not None and msgs[0].role != "system":
        text += f"<|im_start|>system\n{system_prompt}<|im_end|>\n"
    ii = vi = 0
    first_user = next((i for i, m in enumerate(msgs) if m.role == "user"), 0)
    for j, m in enumerate(msgs):
        text += f"<|im_start|>{m.role}\n"
        if j == first_user:
            if n_img_ph == 0:
                for _ in images:
                    text += image_block(ii)
                    ii += 1
            if n_vid_ph == 0:
                for _ in videos:
                    text += video_block(vi)
                    vi += 1
        for kind, payload in m.parts:
            if kind == "text":
                text += payload
            elif kind == "image":
                text += image_block(ii)
                ii += 1
            else:
                text += video_block(vi)
                vi += 1
        text += "<|im_end|>\n"
    return text


WORDS = "the cat dog 12 ? ! describe  image\n\n picture red 3.5 , 的 图片 <|im_end".split(" ")


def _random_sample(rng: random.Random):
    n_turns = rng.randint(1, 4)
    shape = rng.choice(["openai", "llava", "wrapped"])
    images, videos = [], []
    use_placeholders = rng.random() < 0.6
    turns = []
    if rng.random() < 0.2:
        turns.append(("system", "You are helpful."))
    for _ in range(n_turns):
        for role in ("user", "assistant"):
            # an assistant turn without content is a counted empty_assistant_turn skip: give it a word
            words = [rng.choice(WORDS) for _ in range(rng.randint(1 if role == "assistant" else 0, 8))]
            if role == "user" and use_placeholders:
                for _ in range(rng.randint(0, 2)):
                    kind = rng.choice(["<image>", "<image>", "<video>"])
                    words.insert(rng.randint(0, len(words)), kind)
            text = rng.choice([" ", "", "\n"]).join(words)
            turns.append((role, text))
    n_img = sum(t.count("<image>") for _, t in turns)
    n_vid = sum(t.count("<video>") for _, t in turns)
    if not use_placeholders:
        n_img, n_vid = rng.randint(0, 2), rng.randint(0, 1)
    for _ in range(n_img):
        images.append((rng.choice([10, 56, 300, 640, 1200, 33]), rng.choice([10, 56, 480, 700, 29])))
    for _ in range(n_vid):
        videos.append((rng.randint(2, 12), rng.choice([64, 320]), rng.choice([48, 240]), rng.choice([1.0, 2.0, 3.0])))
    if shape == "openai":
        conv = [{"role": r, "content": t} for r, t in turns]
    else:
        conv = [{"from": {"user": "human", "assistant": "gpt"}.get(r, r), "value": t} for r, t in turns]
        if shape == "wrapped":
            conv = {rng.choice(["messages", "conversations", "conversation"]): conv}
    return conv, images, videos


@pytest.mark.parametrize("preset_name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_metadata_length_equals_real_encoding(preset_name):
    preset = get_preset(preset_name, max_pixels=600_000)
    rng = random.Random(hash(preset_name) % 1000)
    checked = 0
    for _ in range(150):
        conv, images, videos = _random_sample(rng)
        config = ChatConfig(
            system_prompt=rng.choice([None, "Sys prompt."]),
            loss_policy=rng.choice(["assistant", "last_turn", "all"]),
            max_num_frames=8,
            max_visual_tokens=10**6,
        )
        try:
            enc = preencode_chat(conv, images, videos, tokenizer=TOK, preset=preset, config=config)
        except SampleSkipped as exc:
            assert exc.reason in ("no_trained_tokens", "empty_assistant_turn"), exc
            continue
        n = encoded_length(conv, images, videos, tokenizer=TOK, preset=preset, config=config)
        ref_ids = _ids(_reference_string(conv, images, videos, preset, config))
        assert n == enc.length == len(ref_ids) == enc.input_ids.numel()
        assert enc.input_ids.tolist() == ref_ids
        assert (enc.input_ids == SP.image_pad).sum().item() == sum(enc.image_token_counts)
        assert (enc.input_ids == SP.video_pad).sum().item() == sum(enc.video_token_counts)
        # loss mask exactly where labels are set; nothing trained on vision/im_start tokens
        assert torch.equal(enc.loss_mask.bool(), enc.labels != IGNORE_INDEX)
        assert enc.labels[-1].item() == IGNORE_INDEX
        trained_targets = enc.labels[enc.labels != IGNORE_INDEX]
        assert not torch.isin(trained_targets, torch.tensor(sorted(SP.skipped))).any()
        checked += 1
    assert checked >= 120


def test_hf_tokenizer_through_protocol_gives_same_ids():
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=load_demo_tokenizer_raw(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    hf_tok = QwenTokenizer(hf)
    assert hf_tok.special == SP
    conv = [{"role": "user", "content": "<image> What is 42?"}, {"role": "assistant", "content": "A cat.\n\n"}]
    a = preencode_chat(conv, [(100, 80)], tokenizer=hf, preset=Q2)
    b = preencode_chat(conv, [(100, 80)], tokenizer=TOK, preset=Q2)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)


def _trained_text(enc) -> str:
    return RAW.decode(
        [i for i, m in zip(enc.input_ids.tolist(), enc.target_mask.tolist()) if m], skip_special_tokens=False
    )


def test_exact_labels_and_loss_mask_both_shapes():
    openai = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
    llava = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there"}]
    a = preencode_chat(openai, tokenizer=TOK, preset=Q2)
    b = preencode_chat(llava, tokenizer=TOK, preset=Q2)
    # Qwen2-VL's official template inserts its default system turn
    expected_ids = (
        [SP.im_start]
        + _ids("system\nYou are a helpful assistant.")
        + [SP.im_end]
        + _ids("\n")
        + [SP.im_start]
        + _ids("user\nHi")
        + [SP.im_end]
        + _ids("\n")
        + [SP.im_start]
        + _ids("assistant\nHello there")
        + [SP.im_end]
        + _ids("\n")
    )
    assert a.input_ids.tolist() == b.input_ids.tolist() == expected_ids
    assert torch.equal(a.labels, b.labels) and torch.equal(a.loss_mask, b.loss_mask)
    answer = _ids("Hello there")
    start = len(expected_ids) - 2 - len(answer)  # first answer token index
    labels = [IGNORE_INDEX] * len(expected_ids)
    # position i predicts token i+1 when token i+1 is trained: answer tokens and <|im_end|>
    for k, tid in enumerate(answer + [SP.im_end]):
        labels[start - 1 + k] = tid
    assert a.labels.tolist() == labels
    assert a.loss_mask.tolist() == [float(x != IGNORE_INDEX) for x in labels]
    assert _trained_text(a) == "Hello there<|im_end|>"  # not the "<|im_start|>assistant\n" header


def test_loss_policies_and_system_prompt():
    conv = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]
    assert _trained_text(preencode_chat(conv, tokenizer=TOK, preset=Q2)) == "A1<|im_end|>A2<|im_end|>"
    last = preencode_chat(conv, tokenizer=TOK, preset=Q2, config=ChatConfig(loss_policy="last_turn"))
    assert _trained_text(last) == "A2<|im_end|>"
    full = preencode_chat(conv, tokenizer=TOK, preset=Q2, config=ChatConfig(loss_policy="all", system_prompt="S"))
    assert _trained_text(full) == "S<|im_end|>Q1<|im_end|>A1<|im_end|>Q2<|im_end|>A2<|im_end|>"
    text = RAW.decode(full.input_ids.tolist(), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1")
    # the template default per preset; None means no system turn at all
    for preset, expected in (
        (Q2, "You are a helpful assistant."),
        (get_preset("qwen2.5-vl"), "You are a helpful assistant."),
        (get_preset("qwen3-vl"), None),
    ):
        text = RAW.decode(
            preencode_chat(conv, tokenizer=TOK, preset=preset).input_ids.tolist(), skip_special_tokens=False
        )
        head = f"<|im_start|>system\n{expected}<|im_end|>\n" if expected else ""
        assert text.startswith(head + "<|im_start|>user\nQ1"), preset.name
        none = preencode_chat(conv, tokenizer=TOK, preset=preset, config=ChatConfig(system_prompt=None))
        assert RAW.decode(none.input_ids.tolist(), skip_special_tokens=False).startswith("<|im_start|>user\nQ1")
    # an existing system turn is kept and the configured prompt is not added
    with_sys = [{"role": "system", "content": "Own"}] + conv
    text = RAW.decode(
        preencode_chat(with_sys, tokenizer=TOK, preset=Q2, config=ChatConfig(system_prompt="S")).input_ids.tolist(),
        skip_special_tokens=False,
    )
    assert text.startswith("<|im_start|>system\nOwn<|im_end|>") and "\nS<|im_end|>" not in text


def test_media_placement():
    # no placeholders: media first in the first user turn; several images per turn in order
    conv = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Look"},
        {"role": "assistant", "content": "ok"},
    ]
    enc = preencode_chat(conv, [(56, 56), (112, 56)], tokenizer=TOK, preset=Q2)
    text = RAW.decode(enc.input_ids.tolist(), skip_special_tokens=False)
    assert (
        "<|im_start|>user\n<|vision_start|>"
        + "<|image_pad|>" * 4
        + "<|vision_end|><|vision_start|>"
        + "<|image_pad|>" * 8
        + "<|vision_end|>Look<|im_end|>"
    ) in text
    assert enc.image_token_counts == [4, 8] and enc.image_grid_thw.tolist() == [[1, 4, 4], [1, 4, 8]]
    # typed content parts
    typed = [
        {"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "image"}, {"type": "text", "text": "B"}]},
        {"role": "assistant", "content": "ok"},
    ]
    text = RAW.decode(
        preencode_chat(typed, [(56, 56)], tokenizer=TOK, preset=Q2).input_ids.tolist(), skip_special_tokens=False
    )
    assert "user\nA<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>B<|im_end|>" in text
    # Qwen3-VL video: timestamps + one block per temporal step
    q3 = get_preset("qwen3-vl")
    enc = preencode_chat(
        [{"role": "user", "content": "<video>Go"}, {"role": "assistant", "content": "ok"}],
        videos=[(4, 64, 64, 2.0)],
        tokenizer=TOK,
        preset=q3,
    )
    text = RAW.decode(enc.input_ids.tolist(), skip_special_tokens=False)
    n = enc.video_token_counts[0] // 2
    block = "<|vision_start|>" + "<|video_pad|>" * n + "<|vision_end|>"
    assert f"user\n<0.2 seconds>{block}<1.2 seconds>{block}Go" in text
    assert enc.second_per_grid_ts == [1.0]


def _png(w, h, mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (w, h), 128).save(buf, format="PNG")
    return buf.getvalue()


def test_encode_chat_end_to_end():
    conv = [{"role": "user", "content": "<image> and <image>"}, {"role": "assistant", "content": "two"}]
    enc, vis = encode_chat(conv, [_png(100, 50), _png(30, 300, "L")], tokenizer=TOK, preset=Q2)
    assert vis.image_grid_thw.tolist() == enc.image_grid_thw.tolist()
    assert vis.pixel_values.shape == (int(vis.image_grid_thw.prod(-1).sum()), Q2.patch_dim)
    assert sum(enc.image_token_counts) == int(vis.image_grid_thw.prod(-1).sum()) // 4
    assert vis.pixel_values_videos is None
    frames = [Image.new("RGB", (64, 48), c) for c in (0, 80, 160)]
    enc, vis = encode_chat(
        [{"role": "user", "content": "<video>"}, {"role": "assistant", "content": "x"}],
        videos=[frames],
        tokenizer=TOK,
        preset=Q2,
        video_fps=[3.0],
    )
    assert vis.video_grid_thw.tolist() == enc.video_grid_thw.tolist() and vis.second_per_grid_ts == [2 / 3]


def _reason(fn) -> str:
    with pytest.raises(SampleSkipped) as err:
        fn()
    return err.value.reason


def test_bad_input_paths():
    ok = [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}]
    pre = lambda conv, imgs=(), vids=(), cfg=None: preencode_chat(
        conv, imgs, vids, tokenizer=TOK, preset=Q2, config=cfg
    )
    assert _reason(lambda: pre(ok, [(56, 56), (56, 56)])) == "media_count_mismatch"
    assert _reason(lambda: pre(ok, [])) == "media_count_mismatch"
    assert (
        _reason(lambda: pre([{"role": "user", "content": "<video>"}, {"role": "assistant", "content": "x"}]))
        == "media_count_mismatch"
    )
    assert _reason(lambda: pre([])) == "empty_conversation"
    assert _reason(lambda: pre({"messages": []})) == "empty_conversation"
    assert _reason(lambda: pre("not json")) == "bad_conversation"
    assert _reason(lambda: pre([{"role": "user", "content": "hi"}])) == "no_assistant_turn"
    # an empty assistant turn (no content, no tool calls) is never trained: a counted skip
    for content in ("", None, [], [{"type": "text", "text": ""}]):
        empty = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
        assert _reason(lambda empty=empty: pre(empty)) == "empty_assistant_turn"
    assert (
        _trained_text(pre([{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}])) == " <|im_end|>"
    )
    many = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert _reason(lambda: pre(many, [(56, 56)] * 3, cfg=ChatConfig(max_num_images=2))) == "too_many_images"
    assert _reason(lambda: pre(ok, [(2000, 2000)], cfg=ChatConfig(max_visual_tokens=100))) == "too_many_visual_tokens"
    assert _reason(lambda: pre(ok, [(0, 56)])) == "corrupt_image"
    assert _reason(lambda: pre(ok, [(28, 6000)])) == "extreme_aspect_ratio"
    enc = lambda imgs: encode_chat(ok, imgs, tokenizer=TOK, preset=Q2)
    assert _reason(lambda: enc([b"garbage"])) == "corrupt_image"
    assert _reason(lambda: enc([_png(40, 40)[:60]])) == "corrupt_image"  # header ok, body truncated
    assert _reason(lambda: enc([Image.new("I;16", (40, 40))])) == "unsupported_image_mode"
    assert _reason(lambda: enc([Image.new("F", (40, 40))])) == "unsupported_image_mode"


def test_config_errors():
    for kwargs, knob in [
        ({"loss_policy": "everything"}, "loss_policy"),
        ({"max_num_images": -1}, "max_num_images"),
        ({"max_visual_tokens": 0}, "max_visual_tokens"),
        ({"system_prompt": 3}, "system_prompt"),
    ]:
        with pytest.raises(ConfigError) as err:
            ChatConfig(**kwargs)
        assert err.value.knob == knob
    with pytest.raises(ConfigError) as err:
        QwenTokenizer(object())
    assert err.value.knob == "tokenizer"
    from tokenizers import Tokenizer, models

    with pytest.raises(ConfigError) as err:  # no Qwen special tokens
        QwenTokenizer(Tokenizer(models.BPE()))
    assert err.value.knob == "tokenizer"


def test_demo_tokenizer_asset_is_small_deterministic_and_qwen_like(tmp_path):
    asset = ROOT / "energon_pack/assets/qwen_demo_tokenizer.json"
    assert asset.stat().st_size < 300_000
    out = tmp_path / "tok.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/make_demo_tokenizer.py"), str(out)], check=True, capture_output=True
    )
    assert out.read_bytes() == asset.read_bytes()
    # special tokens are single tokens with ids above the learned vocabulary; digits split one by one
    ids = _ids("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>2024<|im_end|>")
    assert ids[0] == SP.im_start and SP.vision_start in ids and ids[-1] == SP.im_end
    assert len(_ids("2024")) == 4
    assert min(SP.skipped | {SP.im_end, SP.pad}) >= RAW.get_vocab_size() - 8
