"""Token-id parity with the OFFICIAL Qwen2-VL / Qwen2.5-VL / Qwen3-VL Instruct chat templates.

The reference side is independent of our renderer: transformers' ``apply_chat_template`` renders
the official Jinja template (stored under ``tests/data/chat_templates/``, sources in the README
there; nothing is downloaded), every ``<|image_pad|>`` / ``<|video_pad|>`` is expanded the way the
HF processor does it, and the whole string is tokenised in one go with the demo tokenizer. Our
side is ``preencode_chat`` on the same content-list conversation with image sizes as metadata.

What waits on the preset-default-system-prompt API (``VisionPreset.default_system_prompt``,
``ChatConfig()`` = "use the preset's default", ``ChatConfig(system_prompt=None)`` = "no system
prompt"): the tests named ``*_default_config_*`` / ``*preset_default*``. They touch
``preset.default_system_prompt`` first, so until the API lands they fail on that attribute.
Everything else must pass today.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("jinja2")

from transformers import PreTrainedTokenizerFast  # noqa: E402

from energon_pack.qwen_vl import (  # noqa: E402
    ChatConfig,
    VideoMeta,
    get_preset,
    image_grid_thw,
    load_demo_tokenizer,
    load_demo_tokenizer_raw,
    preencode_chat,
    video_grid_thw,
)

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "data" / "chat_templates"

# preset name -> (template file, sha256 of the file). Sources: tests/data/chat_templates/README.md
MODELS = {
    # Qwen/Qwen2-VL-7B-Instruct chat_template.json / tokenizer_config.json "chat_template";
    # byte-identical in transformers tests/models/qwen2_vl/test_processing_qwen2_vl.py
    # (prepare_processor_dict) and xorbitsai/inference xinference/model/llm/llm_family.json
    # ("qwen2-vl-instruct").
    "qwen2-vl": ("qwen2_vl_instruct.jinja", "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb"),
    # Qwen/Qwen2.5-VL-7B-Instruct: the same string as Qwen2-VL (xinference llm_family.json
    # "qwen2.5-vl-instruct"; the processor_config / tokenizer_config of a Qwen2.5-VL-7B fine-tune,
    # mit-han-lab/StreamingVLM; transformers' Qwen2.5-VL processor tests use it too).
    "qwen2.5-vl": ("qwen2_5_vl_instruct.jinja", "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb"),
    # Qwen/Qwen3-VL-8B-Instruct (the whole Qwen3-VL-*-Instruct family shares it): xinference
    # xinference/model/llm/llm_family.json ("Qwen3-VL-Instruct"), whose sha256 equals the one
    # zhongkaifu/TensorSharp InferenceWeb.Tests/QwenImageIntentScorerTests.cs pins for the GGUF
    # template of Qwen/Qwen3-VL-8B-Instruct-GGUF (and unsloth's GGUF).
    "qwen3-vl": ("qwen3_vl_instruct.jinja", "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"),
}
QWEN2_DEFAULT_SYSTEM = "You are a helpful assistant."
EXPECTED_DEFAULT_SYSTEM = {"qwen2-vl": QWEN2_DEFAULT_SYSTEM, "qwen2.5-vl": QWEN2_DEFAULT_SYSTEM, "qwen3-vl": None}

RAW = load_demo_tokenizer_raw()
TOK = load_demo_tokenizer()
HF_TOK = PreTrainedTokenizerFast(tokenizer_object=load_demo_tokenizer_raw())


def _template(preset_name: str) -> str:
    return (TEMPLATE_DIR / MODELS[preset_name][0]).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Reference: official template + HF-processor-style pad expansion + one-shot tokenisation
# ---------------------------------------------------------------------------------------------


def render_official(preset_name: str, messages: list[dict], **kwargs) -> str:
    """The official template rendered by transformers. Keys whose value is None are dropped first, as
    transformers 5.24 does itself (OpenAI-style ``content: None`` beside ``tool_calls``): the
    templates test ``message.content is string`` and would iterate None on older releases."""
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    return HF_TOK.apply_chat_template(
        messages,
        chat_template=_template(preset_name),
        tokenize=False,
        add_generation_prompt=kwargs.pop("add_generation_prompt", False),
        **kwargs,
    )


_MEDIA_RE = re.compile(r"<\|image_pad\|>|<\|vision_start\|><\|video_pad\|><\|vision_end\|>")


def expand_media(text: str, preset_name: str, images, videos) -> str:
    """Expand the template's single pads like the HF processors: an image pad becomes t*h*w/merge^2
    pads; a Qwen2/2.5-VL video pad likewise; a Qwen3-VL video block becomes, per temporal grid step,
    ``<{t:.1f} seconds>`` + vision_start + pads(h*w/merge^2) + vision_end (the Qwen3VLProcessor
    layout; timestamps average the first/last frame time of each temporal patch)."""
    preset = get_preset(preset_name)
    merge2 = preset.merge_size**2
    imgs, vids = iter(images), iter(videos)

    def repl(m: re.Match) -> str:
        if m.group() == "<|image_pad|>":
            w, h = next(imgs)
            t, gh, gw = image_grid_thw(h, w, preset)
            return "<|image_pad|>" * (t * gh * gw // merge2)
        v = next(vids)
        t, gh, gw = video_grid_thw(v.num_frames, v.height, v.width, preset)
        if preset.rope_style != "qwen3":
            return "<|vision_start|>" + "<|video_pad|>" * (t * gh * gw // merge2) + "<|vision_end|>"
        fps = v.fps or preset.video_fps
        idx = list(range(v.num_frames))
        idx += [idx[-1]] * (-len(idx) % preset.temporal_patch_size)
        secs = [i / fps for i in idx]
        out = ""
        for k in range(t):
            ts = (secs[k * 2] + secs[k * 2 + 1]) / 2
            out += f"<{ts:.1f} seconds><|vision_start|>" + "<|video_pad|>" * (gh * gw // merge2) + "<|vision_end|>"
        return out

    expanded = _MEDIA_RE.sub(repl, text)
    assert next(imgs, None) is None and next(vids, None) is None, "template dropped some media"
    return expanded


def official_ids(preset_name: str, messages: list[dict], images=(), videos=(), **kwargs) -> list[int]:
    text = expand_media(render_official(preset_name, messages, **kwargs), preset_name, images, videos)
    ids = HF_TOK.encode(text, add_special_tokens=False)
    assert ids == RAW.encode(text, add_special_tokens=False).ids  # HF wrapper == raw tokenizer
    return ids


def our_ids(
    preset_name: str, messages: list[dict], images=(), videos=(), config: ChatConfig | None = None
) -> list[int]:
    enc = preencode_chat(
        messages,
        images=list(images),
        videos=list(videos),
        tokenizer=TOK,
        preset=get_preset(preset_name),
        config=config if config is not None else ChatConfig(),
    )
    return enc.input_ids.tolist()


def _first_diff(a: list[int], b: list[int]) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (
        f"lengths {len(a)} vs {len(b)}; first difference at {i}: "
        f"ours {RAW.decode(a[max(0, i - 8) : i + 8], skip_special_tokens=False)!r} vs "
        f"official {RAW.decode(b[max(0, i - 8) : i + 8], skip_special_tokens=False)!r}"
    )


def assert_same(ours: list[int], official: list[int]) -> None:
    assert ours == official, _first_diff(ours, official)


# ---------------------------------------------------------------------------------------------
# Conversations (content-list form; images only in user turns, system only as the first turn:
# the domain all three templates and our renderer share)
# ---------------------------------------------------------------------------------------------

IMG, VID = {"type": "image"}, {"type": "video"}


def T(text: str) -> dict:
    return {"type": "text", "text": text}


def U(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def A(text) -> dict:
    return {"role": "assistant", "content": text if isinstance(text, str) else list(text)}


def S(text) -> dict:
    return {"role": "system", "content": text}


CASES: dict[str, tuple[list[dict], list[tuple[int, int]], list[VideoMeta]]] = {
    "text_only": ([U(T("Hello there.")), A("Hi! How can I help?")], [], []),
    "text_only_system": ([S("You are a pirate."), U(T("Hello.")), A("Arr.")], [], []),
    "image_first": ([U(IMG, T("Describe this image.")), A("A cat on a mat.")], [(640, 480)], []),
    "image_last_system": ([S("Be concise."), U(T("What is in the picture? "), IMG), A("A dog.")], [(224, 224)], []),
    "image_middle": ([U(T("Compare the left "), IMG, T(" with nothing else.")), A("Done.")], [(1000, 200)], []),
    "two_images_adjacent": ([U(IMG, IMG, T("Which one is brighter?")), A("The second.")], [(320, 240), (240, 320)], []),
    "three_images_spread_system": (
        [
            S("You compare pictures."),
            U(T("First: "), IMG, T("\nSecond: "), IMG, T("\nThird: "), IMG, T("\nRank them.")),
            A("2 > 1 > 3"),
        ],
        [(512, 512), (28, 28), (1920, 1080)],
        [],
    ),
    "multi_turn_images_system": (
        [
            S("You are a helpful assistant."),
            U(IMG, T("What is this?")),
            A("A chart."),
            U(T("And the trend?")),
            A("Upward."),
            U(IMG, T("Same for this one?")),
            A("No, downward."),
        ],
        [(800, 600), (600, 800)],
        [],
    ),
    "multi_turn_text": ([U(T("1+1?")), A("2"), U(T("times 3?")), A("6"), U(T("minus 6?")), A("0")], [], []),
    "unicode_system": (
        [S("你是一个有用的助手。"), U(IMG, T("这张图片里有什么？😀 Ünïcödé — naïve café")), A("一只猫 🐱。")],
        [(300, 200)],
        [],
    ),
    "newlines": ([U(T("\nline one\n\nline two\r\n\tindented\n"), IMG, T("\n\n")), A("\nanswer\n\n")], [(448, 448)], []),
    "empty_ish": ([U(IMG, T("")), A(" ")], [(100, 100)], []),
    "image_only_user": ([U(IMG), A("ok")], [(50, 2000)], []),
    "string_contents_system": (
        [S("Plain string system."), {"role": "user", "content": "plain string user"}, A("plain string assistant")],
        [],
        [],
    ),
    "system_as_text_list": ([S([T("Part one. "), T("Part two.")]), U(IMG, T("Go.")), A("Went.")], [(640, 360)], []),
    "adjacent_text_parts": (
        [U(T("hel"), T("lo wor"), T("ld"), IMG, T("!"), T("?")), A([T("an"), T("swer")])],
        [(256, 256)],
        [],
    ),
    "whitespace_parts_system": ([S("   "), U(T("  "), IMG, T("\t \t")), A("  spaced  ")], [(333, 777)], []),
    "long_text": ([U(T("lorem ipsum dolor sit amet, " * 40), IMG), A("consectetur " * 30)], [(1024, 768)], []),
    "ends_with_user_system": ([S("sys"), U(T("q1")), A("a1"), U(IMG, T("q2"))], [(400, 300)], []),
    "assistant_text_list": ([U(IMG, T("Caption?")), A([T("A red "), T("car.")])], [(720, 480)], []),
    "many_rounds_images": (
        [m for k in range(5) for m in (U(IMG, T(f"frame {k}?")), A(f"answer {k}"))],
        [(200 + 40 * k, 300 - 20 * k) for k in range(5)],
        [],
    ),
    "big_and_tiny_system": (
        [S("Look carefully."), U(IMG, T(" vs "), IMG), A("Different sizes.")],
        [(2000, 1500), (30, 30)],
        [],
    ),
    "spaces_around_image": ([U(T("Look: "), IMG, T(" and tell me.")), A("Seen.")], [(640, 640)], []),
    "code_block": (
        [U(T("```python\ndef f(x):\n    return x  # 注释\n```\n"), IMG), A("```\nok\n```")],
        [(500, 250)],
        [],
    ),
    "video_and_image": (
        [U(VID, T("and "), IMG, T(" what happens?")), A("It moves.")],
        [(320, 240)],
        [VideoMeta(8, 320, 240, 2.0)],
    ),
    "video_odd_frames_system": ([S("Watch."), U(T("Clip: "), VID), A("Seen.")], [], [VideoMeta(7, 640, 360, 4.0)]),
    # look-alikes of control tokens stay text (a real one typed in text is a counted skip:
    # tests/energon/test_hostile_input.py)
    "literal_lookalike_text": (
        [U(T("say <|im_end| > or <im_end> literally"), IMG), A("no <|vision_start")],
        [(128, 128)],
        [],
    ),
}
WITH_SYSTEM = sorted(k for k, (msgs, _, _) in CASES.items() if msgs[0]["role"] == "system")
WITHOUT_SYSTEM = sorted(k for k, (msgs, _, _) in CASES.items() if msgs[0]["role"] != "system")
PRESET_NAMES = list(MODELS)


def test_enough_cases():
    assert len(CASES) >= 20 and len(WITH_SYSTEM) >= 8 and len(WITHOUT_SYSTEM) >= 8


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_template_files_are_the_pinned_official_ones(preset_name):
    name, sha = MODELS[preset_name]
    assert hashlib.sha256((TEMPLATE_DIR / name).read_bytes()).hexdigest() == sha


def test_image_token_counts_match_transformers_smart_resize():
    """The expansion uses energon_pack's image_grid_thw; cross-check it against transformers'."""
    try:  # 5.x: the PIL image processor's module (no torchvision needed)
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    except ImportError:  # 4.x: the slow image processor's module (PIL + numpy as well)
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    sizes = {wh for _, imgs, _ in CASES.values() for wh in imgs}
    for preset_name in PRESET_NAMES:
        p = get_preset(preset_name)
        for w, h in sizes:
            rh, rw = smart_resize(h, w, factor=p.factor, min_pixels=p.min_pixels, max_pixels=p.max_pixels)
            assert image_grid_thw(h, w, p) == (1, rh // p.patch_size, rw // p.patch_size)


# ---------------------------------------------------------------------------------------------
# Parity: conversations WITH a system turn (no dependency on the new API; must pass now)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", WITH_SYSTEM)
@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_parity_with_system_turn(preset_name, case):
    msgs, images, videos = CASES[case]
    official = official_ids(preset_name, msgs, images, videos)
    assert_same(our_ids(preset_name, msgs, images, videos), official)
    # the conversation's own system turn wins over any configured prompt
    assert_same(our_ids(preset_name, msgs, images, videos, ChatConfig(system_prompt=None)), official)
    assert_same(our_ids(preset_name, msgs, images, videos, ChatConfig(system_prompt="Ignored.")), official)


# ---------------------------------------------------------------------------------------------
# Parity: conversations WITHOUT a system turn, default ChatConfig (waits on the API)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_preset_default_system_prompt(preset_name):
    assert get_preset(preset_name).default_system_prompt == EXPECTED_DEFAULT_SYSTEM[preset_name]


def test_preset_default_system_prompts_agree_with_templates():
    assert (
        get_preset("qwen2-vl").default_system_prompt
        == get_preset("qwen2.5-vl").default_system_prompt
        == QWEN2_DEFAULT_SYSTEM
    )
    assert get_preset("qwen3-vl").default_system_prompt is None
    # ...and that is what the official templates inject for a conversation without a system turn
    probe = [U(T("x")), A("y")]
    assert render_official("qwen2-vl", probe).startswith(f"<|im_start|>system\n{QWEN2_DEFAULT_SYSTEM}<|im_end|>\n")
    assert render_official("qwen3-vl", probe).startswith("<|im_start|>user\n")


@pytest.mark.parametrize("case", WITHOUT_SYSTEM)
@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_parity_default_config_without_system_turn(preset_name, case):
    assert get_preset(preset_name).default_system_prompt == EXPECTED_DEFAULT_SYSTEM[preset_name]  # the API
    msgs, images, videos = CASES[case]
    assert_same(
        our_ids(preset_name, msgs, images, videos, ChatConfig()), official_ids(preset_name, msgs, images, videos)
    )


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_default_config_differs_from_explicit_none_exactly_by_the_template_default(preset_name):
    default = get_preset(preset_name).default_system_prompt  # the API
    msgs, images, videos = CASES["image_first"]
    with_default = our_ids(preset_name, msgs, images, videos, ChatConfig())
    explicit_none = our_ids(preset_name, msgs, images, videos, ChatConfig(system_prompt=None))
    if default is None:
        assert with_default == explicit_none
    else:
        header = RAW.encode(f"<|im_start|>system\n{default}<|im_end|>\n", add_special_tokens=False).ids
        assert with_default == header + explicit_none


# ---------------------------------------------------------------------------------------------
# Explicit None / custom prompt (pass now and after the API)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", WITHOUT_SYSTEM)
@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_explicit_none_renders_no_system_turn(preset_name, case):
    msgs, images, videos = CASES[case]
    ours = our_ids(preset_name, msgs, images, videos, ChatConfig(system_prompt=None))
    official = official_ids(preset_name, msgs, images, videos)
    im_start = RAW.token_to_id("<|im_start|>")
    assert ours[0] == im_start and RAW.decode(ours[1:3], skip_special_tokens=False).startswith("user")
    if EXPECTED_DEFAULT_SYSTEM[preset_name] is None:
        assert_same(ours, official)  # Qwen3-VL's template adds no system turn either
    else:
        # Qwen2/2.5-VL's template always injects its default system turn: explicit None differs,
        # by exactly that turn
        assert ours != official
        header = RAW.encode(f"<|im_start|>system\n{QWEN2_DEFAULT_SYSTEM}<|im_end|>\n", add_special_tokens=False).ids
        assert_same(header + ours, official)


@pytest.mark.parametrize("case", WITHOUT_SYSTEM)
@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_custom_system_prompt_is_used(preset_name, case):
    msgs, images, videos = CASES[case]
    prompt = "Custom prompt: answer in French.\nAlways."
    ours = our_ids(preset_name, msgs, images, videos, ChatConfig(system_prompt=prompt))
    assert_same(ours, official_ids(preset_name, [S(prompt)] + msgs, images, videos))


@pytest.mark.parametrize("preset_name", ["qwen2-vl", "qwen2.5-vl"])
def test_qwen2_default_prompt_given_explicitly_matches_official(preset_name):
    """What ChatConfig() will do for Qwen2/2.5-VL, spelled out today."""
    for case in WITHOUT_SYSTEM:
        msgs, images, videos = CASES[case]
        assert_same(
            our_ids(preset_name, msgs, images, videos, ChatConfig(system_prompt=QWEN2_DEFAULT_SYSTEM)),
            official_ids(preset_name, msgs, images, videos),
        )


# ---------------------------------------------------------------------------------------------
# What the official templates do with the corner cases (facts about the templates themselves)
# ---------------------------------------------------------------------------------------------

VS_IMG = "<|vision_start|><|image_pad|><|vision_end|>"
VS_VID = "<|vision_start|><|video_pad|><|vision_end|>"


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_template_system_content_list(preset_name):
    msgs = [S([T("S1"), IMG, T("S2")]), U(T("hi")), A("yo")]
    out = render_official(preset_name, msgs)
    if preset_name == "qwen3-vl":  # only the text items of messages[0], concatenated; images dropped
        assert out.startswith("<|im_start|>system\nS1S2<|im_end|>\n")
    else:  # rendered like any other list content: images kept
        assert out.startswith(f"<|im_start|>system\nS1{VS_IMG}S2<|im_end|>\n")


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_template_assistant_images(preset_name):
    out = render_official(preset_name, [U(T("hi")), A([IMG, T("yo")])])
    if preset_name == "qwen3-vl":  # assistant list content: text items only, images dropped
        assert out.endswith("<|im_start|>assistant\nyo<|im_end|>\n")
    else:
        assert out.endswith(f"<|im_start|>assistant\n{VS_IMG}yo<|im_end|>\n")


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_template_add_vision_id(preset_name):
    msgs = [U(IMG, VID, IMG, T("q")), A("a")]
    plain = render_official(preset_name, msgs)
    labelled = render_official(preset_name, msgs, add_vision_id=True)
    assert f"{VS_IMG}{VS_VID}{VS_IMG}q" in plain  # off by default (our renderer never labels)
    assert f"Picture 1: {VS_IMG}Video 1: {VS_VID}Picture 2: {VS_IMG}q" in labelled


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_template_video_is_one_block_and_trailing_newline(preset_name):
    out = render_official(preset_name, [U(VID, T("q")), A("a")])
    assert f"<|im_start|>user\n{VS_VID}q<|im_end|>\n" in out
    assert out.endswith("<|im_start|>assistant\na<|im_end|>\n")  # one "\n" after the last <|im_end|>
    gen = render_official(preset_name, [U(T("q"))], add_generation_prompt=True)
    assert gen.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_qwen3_instruct_template_has_no_think_handling():
    """Qwen3-VL *Instruct*: assistant content is emitted verbatim; no <think> insertion/stripping,
    no reasoning_content, no enable_thinking (the Thinking variant's template differs)."""
    tpl = _template("qwen3-vl")
    assert "think" not in tpl and "reasoning_content" not in tpl
    content = "<think>\nplan\n</think>\n\nanswer"
    out = render_official("qwen3-vl", [U(T("q")), A("x"), U(T("q2")), A(content)])
    assert out.endswith(f"<|im_start|>assistant\n{content}<|im_end|>\n")
    assert "<|im_start|>assistant\nx<|im_end|>" in out  # earlier turns are not altered either
    msgs = [U(T("q")), A(content)]
    assert_same(our_ids("qwen3-vl", msgs, config=ChatConfig(system_prompt=None)), official_ids("qwen3-vl", msgs))


# ---------------------------------------------------------------------------------------------
# Known divergences outside the shared domain (strict xfail: flips to a failure once fixed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="Qwen3-VL template drops images in assistant turns; our renderer keeps them")
def test_divergence_qwen3_assistant_image():
    msgs = [U(T("draw")), A([IMG, T("here")])]
    ours = our_ids("qwen3-vl", msgs, [(64, 64)], config=ChatConfig(system_prompt=None))
    assert ours == official_ids("qwen3-vl", msgs)  # the official rendering has no image left


@pytest.mark.xfail(strict=True, reason="Qwen3-VL template drops images in the system turn; our renderer keeps them")
def test_divergence_qwen3_system_image():
    msgs = [S([IMG, T("sys")]), U(T("q")), A("a")]
    assert our_ids("qwen3-vl", msgs, [(64, 64)]) == official_ids("qwen3-vl", msgs)  # image dropped there


@pytest.mark.xfail(
    strict=True, reason="Qwen3-VL template renders only messages[0] as system; later system turns vanish"
)
def test_divergence_qwen3_later_system_turn():
    msgs = [S("first"), U(T("q")), S("second"), A("a")]
    assert our_ids("qwen3-vl", msgs) == official_ids("qwen3-vl", msgs)


@pytest.mark.parametrize("preset_name", ["qwen2-vl", "qwen2.5-vl"])
def test_qwen2_later_system_turn_matches(preset_name):
    msgs = [S("first"), U(T("q")), S("second"), A("a")]
    assert_same(our_ids(preset_name, msgs), official_ids(preset_name, msgs))


@pytest.mark.parametrize("preset_name", PRESET_NAMES)
def test_literal_image_placeholder_in_text_part_stays_text(preset_name):
    msgs = [S("s"), U(IMG, T("the tag <image> is HTML-ish")), A("a")]
    assert our_ids(preset_name, msgs, [(64, 64)]) == official_ids(preset_name, msgs, [(64, 64)])


@pytest.mark.parametrize("part", [{"text": "hi"}, {"image": "x.png"}, {"image_url": {"url": "x.png"}}])
def test_untyped_content_parts_classified_by_key(part):
    msgs = [S("s"), U(part, T(" q")), A("a")]
    images = [] if "text" in part else [(64, 64)]
    assert our_ids("qwen2-vl", msgs, images) == official_ids("qwen2-vl", msgs, images)


# ---------------------------------------------------------------------------------------------
# Tool calling (OpenAI shape: tools list, assistant content null + tool_calls, role "tool")
# ---------------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK_TOOL = {
    "type": "function",
    "function": {"name": "now", "description": "Heure locale — ünïcode", "parameters": {}},
}


def CALL(name: str, arguments, wrapped: bool = True) -> dict:
    fn = {"name": name, "arguments": arguments}
    return {"id": f"call_{name}", "type": "function", "function": fn} if wrapped else fn


def AT(content, *calls) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def TOOL(content) -> dict:
    return {"role": "tool", "tool_call_id": "x", "content": content}


TOOL_CASES: dict[str, tuple[list[dict], list[dict] | None, list[tuple[int, int]]]] = {
    "null_content_string_arguments": (
        [
            U(T("Weather in Paris?")),
            AT(None, CALL("get_weather", '{"city": "Paris"}')),
            TOOL('{"temp": 21}'),
            A("21 degrees."),
        ],
        [WEATHER_TOOL],
        [],
    ),
    "system_two_tools_dict_arguments": (
        [
            S("You can call tools."),
            U(T("Time and weather in Oslo?")),
            AT(None, CALL("now", {}), CALL("get_weather", {"city": "Oslo", "unit": "°C"})),
            TOOL("12:00"),
            TOOL([T("-3")]),
            A("Noon, -3."),
        ],
        [WEATHER_TOOL, CLOCK_TOOL],
        [],
    ),
    "content_and_call_unwrapped": (
        [
            U(T("Check Rome.")),
            AT("Let me check.", CALL("get_weather", {"city": "Rome"}, wrapped=False)),
            TOOL("sunny"),
            A("Sunny."),
        ],
        [WEATHER_TOOL],
        [],
    ),
    "calls_without_tools_list": (
        [U(T("q")), AT("", CALL("now", "{}")), TOOL("1"), TOOL("2"), TOOL("3"), A("three answers")],
        None,
        [],
    ),
    "image_then_tool": (
        [
            U(IMG, T("Where is this? Look up the weather there.")),
            AT(None, CALL("get_weather", '{"city": "Nice"}')),
            TOOL("warm"),
            A("Nice, and warm."),
            U(T("thanks")),
            A("You're welcome."),
        ],
        [WEATHER_TOOL],
        [(320, 240)],
    ),
    "tool_response_with_image": (
        [U(T("Show me the map.")), AT(None, CALL("map", {"z": 3})), TOOL([IMG, T("map tile")]), A("Here it is.")],
        None,
        [(256, 256)],
    ),
}


def _with_tools(msgs: list[dict], tools) -> dict:
    return {"messages": msgs, "tools": tools} if tools is not None else {"messages": msgs}


@pytest.mark.parametrize("case", sorted(TOOL_CASES))
def test_parity_tool_calls_qwen3_vl(case):
    msgs, tools, images = TOOL_CASES[case]
    official = official_ids("qwen3-vl", msgs, images, tools=tools)
    # the official rendering really carries the calls and the responses (not a vacuous match)
    text = RAW.decode(official, skip_special_tokens=False)
    assert '<tool_call>\n{"name": ' in text and "<|im_start|>user\n<tool_response>\n" in text
    assert "<|im_start|>tool" not in text and ("# Tools" in text) == bool(tools)
    enc = preencode_chat(
        _with_tools(msgs, tools), images=images, tokenizer=TOK, preset=get_preset("qwen3-vl"), config=ChatConfig()
    )
    assert_same(enc.input_ids.tolist(), official)


def test_tool_calls_supervised_tool_responses_not():
    msgs, tools, _ = TOOL_CASES["system_two_tools_dict_arguments"]
    enc = preencode_chat(_with_tools(msgs, tools), tokenizer=TOK, preset=get_preset("qwen3-vl"), config=ChatConfig())
    trained = RAW.decode(enc.input_ids[enc.target_mask].tolist(), skip_special_tokens=False)
    assert '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>' in trained
    assert '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "°C"}}' in trained
    assert "Noon, -3." in trained
    assert "tool_response" not in trained and "12:00" not in trained and "# Tools" not in trained


def test_text_chat_tool_calls_match_the_qwen3_template():
    """The GPT-SFT chat path renders tool calls the same way (no system prompt of its own)."""
    from energon_pack.chat import encode_text_chat

    for case in ("null_content_string_arguments", "system_two_tools_dict_arguments", "calls_without_tools_list"):
        msgs, tools, _ = TOOL_CASES[case]
        ids, _mask = encode_text_chat(_with_tools(msgs, tools), tokenizer=TOK)
        assert_same(ids.tolist(), official_ids("qwen3-vl", msgs, tools=tools))


@pytest.mark.parametrize("preset_name", ["qwen2-vl", "qwen2.5-vl"])
@pytest.mark.parametrize("case", ["null_content_string_arguments", "calls_without_tools_list"])
def test_qwen2_templates_have_no_tool_handling_so_tool_chats_are_skipped(preset_name, case):
    from energon_pack.errors import SampleSkipped

    msgs, tools, images = TOOL_CASES[case]
    # what the official template would train: the call dropped, an empty assistant turn, a literal "tool" role
    text = render_official(preset_name, msgs, tools=tools)
    assert "<tool_call>" not in text and "<|im_start|>assistant\n<|im_end|>" in text and "<|im_start|>tool\n" in text
    with pytest.raises(SampleSkipped) as exc:
        preencode_chat(_with_tools(msgs, tools), images=images, tokenizer=TOK, preset=get_preset(preset_name))
    assert exc.value.reason == "tool_calls_unsupported" and preset_name in exc.value.detail
    # a tools list alone (no calls in the conversation) is skipped as well: the template would drop it
    with pytest.raises(SampleSkipped, match="tool_calls_unsupported"):
        preencode_chat(
            {"messages": [U(T("hi")), A("hello")], "tools": [WEATHER_TOOL]},
            tokenizer=TOK,
            preset=get_preset(preset_name),
        )
