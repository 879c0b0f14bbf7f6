"""``preference="chosen"``: a preference record (LLaMA-Factory ShareGPT / alpaca pairwise and ranking, TRL explicit
and implicit prompt) trains as the SFT record of its prompt and chosen answer, token for token, on the shared
normaliser, the text and VLM encoders, the GPT-SFT chat format (its length bound included); the default still
refuses it as ``preference_data``, and an unknown mode is a ConfigError naming ``preference``."""

from __future__ import annotations

import json

import pytest

from energon_pack.chat import ChatConfig, encode_text_chat, load_tokenizer
from energon_pack.chat.conversation import PREFERENCE_MODES, chosen_as_sft, normalize_conversation
from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.qwen_vl import encoded_length, get_preset, preencode_chat
from energon_pack.sft import JsonlSFTDataset
from energon_pack.sft import dataset as dataset_module
from energon_pack.sft.formats import ChatFormat

TOK = load_tokenizer("demo")
CHOSEN = ChatConfig(preference="chosen")
Q = "Which planet is known as the Red Planet?"
GOOD, BAD = "Mars, for the iron oxide on its surface.", "Jupiter."

#: (name, preference record, the SFT record of its chosen answer), one per accepted shape
SHAPES = [
    (
        "llamafactory_sharegpt",  # dpo_en_demo.json
        {
            "conversations": [{"from": "human", "value": Q}],
            "chosen": {"from": "gpt", "value": GOOD},
            "rejected": {"from": "gpt", "value": BAD},
        },
        {"conversations": [{"from": "human", "value": Q}, {"from": "gpt", "value": GOOD}]},
    ),
    (
        "llamafactory_sharegpt_multi_turn_system",
        {
            "conversations": [
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello!"},
                {"from": "human", "value": Q},
            ],
            "system": "Answer briefly.",
            "chosen": {"from": "gpt", "value": GOOD},
            "rejected": {"from": "gpt", "value": BAD},
        },
        {
            "conversations": [
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello!"},
                {"from": "human", "value": Q},
                {"from": "gpt", "value": GOOD},
            ],
            "system": "Answer briefly.",
        },
    ),
    (
        "llamafactory_messages_chosen_list",
        {
            "messages": [{"role": "user", "content": Q}],
            "chosen": [{"role": "assistant", "content": GOOD}],
            "rejected": [{"role": "assistant", "content": BAD}],
        },
        {"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": GOOD}]},
    ),
    (
        "llamafactory_alpaca_pairwise",
        {"instruction": "Name the planet.", "input": "the Red Planet", "chosen": GOOD, "rejected": BAD},
        {"instruction": "Name the planet.", "input": "the Red Planet", "output": GOOD},
    ),
    (
        "llamafactory_alpaca_ranking",
        {"instruction": "Name the planet.", "input": "the Red Planet", "output": [GOOD, BAD]},
        {"instruction": "Name the planet.", "input": "the Red Planet", "output": GOOD},
    ),
    (
        "trl_explicit_standard",
        {"prompt": Q, "chosen": GOOD, "rejected": BAD},
        {"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": GOOD}]},
    ),
    (
        "trl_explicit_conversational",
        {
            "prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": Q}],
            "chosen": [{"role": "assistant", "content": GOOD}],
            "rejected": [{"role": "assistant", "content": BAD}],
        },
        {
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": Q},
                {"role": "assistant", "content": GOOD},
            ]
        },
    ),
    (
        "trl_implicit",
        {
            "chosen": [{"role": "user", "content": Q}, {"role": "assistant", "content": GOOD}],
            "rejected": [{"role": "user", "content": Q}, {"role": "assistant", "content": BAD}],
        },
        {"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": GOOD}]},
    ),
]
IDS = [name for name, _, _ in SHAPES]


def test_the_modes():
    assert PREFERENCE_MODES == ("refuse", "chosen")


@pytest.mark.parametrize("name, pair, sft", SHAPES, ids=IDS)
def test_each_shape_becomes_its_chosen_sft_record_and_encodes_as_it(name, pair, sft):
    assert chosen_as_sft(pair) == sft
    assert chosen_as_sft(sft) is sft  # an SFT record is left as it is
    ids, target = encode_text_chat(pair, tokenizer=TOK, config=CHOSEN)
    ids0, target0 = encode_text_chat(sft, tokenizer=TOK, config=ChatConfig())
    assert ids.tolist() == ids0.tolist() and target.tolist() == target0.tolist()
    trained = TOK.inner.decode(ids[target].tolist(), skip_special_tokens=False)
    history = "Hello!<|im_end|>" if name == "llamafactory_sharegpt_multi_turn_system" else ""
    assert trained == history + GOOD + "<|im_end|>"  # the chosen answer is learnt; the rejected one is nowhere
    assert BAD not in TOK.inner.decode(ids.tolist(), skip_special_tokens=False)


@pytest.mark.parametrize("name, pair, sft", SHAPES, ids=IDS)
def test_the_default_still_refuses_each_shape_and_names_the_option(name, pair, sft):
    for config in (None, ChatConfig(), ChatConfig(preference="refuse")):
        with pytest.raises(SampleSkipped) as err:
            encode_text_chat(pair, tokenizer=TOK, config=config)
        assert err.value.reason == "preference_data"
        assert 'preference="chosen" (--preference chosen)' in err.value.detail


def test_other_fields_are_kept_and_the_pair_fields_dropped():
    pair = {
        "id": 7,
        "images": ["a.jpg"],
        "tools": "[]",
        "system": "s",
        "prompt": "<image>What is it?",
        "chosen": "A cat.",
        "rejected": "A dog.",
    }
    assert chosen_as_sft(pair) == {
        "id": 7,
        "images": ["a.jpg"],
        "tools": "[]",
        "system": "s",
        "messages": [{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "A cat."}],
    }
    # a JSON-string conversation (a Parquet column) is read as its turns
    text = {"conversations": json.dumps([{"from": "human", "value": "q"}]), "chosen": "a", "rejected": "b"}
    assert chosen_as_sft(text) == {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}


@pytest.mark.parametrize(
    "pair, detail",
    [
        ({"chosen": "a", "rejected": "b"}, "chosen is str with no prompt, conversations/messages or instruction"),
        ({"prompt": "q", "chosen": 3, "rejected": 4}, "chosen is 3: not a string, a turn or a list of turns"),
        ({"prompt": {"q": 1}, "chosen": "a", "rejected": "b"}, "prompt is dict, not a string or a list of turns"),
        ({"instruction": "q", "chosen": ["a"], "rejected": ["b"]}, "alpaca chosen is list, not a string"),
        ({"instruction": "q", "output": [1, 2]}, "alpaca ranking output [1, 2]: its first item"),
        ({"messages": {"role": "user"}, "chosen": "a", "rejected": "b"}, "messages is dict, not a list of turns"),
    ],
)
def test_a_pair_of_a_shape_not_read_stays_a_preference_skip_naming_it(pair, detail):
    with pytest.raises(SampleSkipped) as err:
        normalize_conversation(pair, preference="chosen")
    assert err.value.reason == "preference_data"
    assert err.value.detail.startswith("chosen/rejected of a shape not read as SFT: " + detail)


def test_the_vlm_encoder_trains_the_chosen_answer_with_its_image():
    """LLaMA-Factory's multimodal DPO shape (``images`` beside the pair) through the Qwen-VL renderer."""
    pair = {
        "messages": [{"role": "user", "content": "<image>What is in the picture?"}],
        "chosen": {"role": "assistant", "content": "A red square."},
        "rejected": {"role": "assistant", "content": "A blue circle."},
        "images": ["1.jpg"],
    }
    sft = {
        "messages": [
            {"role": "user", "content": "<image>What is in the picture?"},
            {"role": "assistant", "content": "A red square."},
        ],
        "images": ["1.jpg"],
    }
    preset = get_preset("qwen2.5-vl")
    ours = preencode_chat(pair, [(56, 56)], tokenizer=TOK, preset=preset, config=CHOSEN)
    plain = preencode_chat(sft, [(56, 56)], tokenizer=TOK, preset=preset, config=ChatConfig())
    assert ours.input_ids.tolist() == plain.input_ids.tolist() and ours.labels.tolist() == plain.labels.tolist()
    assert ours.image_grid_thw.tolist() == plain.image_grid_thw.tolist() == [[1, 4, 4]]
    assert encoded_length(pair, [(56, 56)], tokenizer=TOK, preset=preset, config=CHOSEN) == ours.length
    with pytest.raises(SampleSkipped, match="preference_data"):
        encoded_length(pair, [(56, 56)], tokenizer=TOK, preset=preset)


def test_an_unknown_mode_is_a_config_error_naming_preference():
    for build in (
        lambda: ChatConfig(preference="both"),
        lambda: ChatFormat(TOK, preference="chosen_only"),
        lambda: normalize_conversation(SHAPES[0][1], preference=True),
    ):
        with pytest.raises(ConfigError) as err:
            build()
        assert err.value.knob == "preference" and "refuse" in err.value.fix and "chosen" in err.value.fix


def test_the_chat_format_fingerprint_differs_between_modes():
    refuse, chosen = ChatFormat(TOK), ChatFormat(TOK, preference="chosen")
    assert refuse.fingerprint() == ChatFormat(TOK, preference="refuse").fingerprint()
    assert chosen.fingerprint() != refuse.fingerprint() and chosen.fingerprint().startswith("chat:")


def write_pairs(path):
    sft = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "plain"}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in [sft, *(pair for _, pair, _ in SHAPES)]))
    return path


def test_the_gpt_sft_chat_dataset_trains_the_chosen_answers(tmp_path):
    path = write_pairs(tmp_path / "pairs.jsonl")
    refused = JsonlSFTDataset(path, TOK, format="chat", cache_dir=tmp_path / "c")
    assert refused.skips == {"preference_data": len(SHAPES)} and refused.lengths.tolist()[1:] == [-1] * len(SHAPES)
    ds = JsonlSFTDataset(path, TOK, format="chat", preference="chosen", cache_dir=tmp_path / "c")
    assert ds.skips == {}
    for i, (_, _, sft) in enumerate(SHAPES, 1):
        ids, target = encode_text_chat(sft, tokenizer=TOK, config=ChatConfig())
        assert ds[i].input_ids.tolist() == ids.tolist() and ds[i].target_mask.tolist() == target.tolist()
        assert ds.lengths[i] == len(ids)


def test_the_length_bound_reads_a_chosen_pair_by_its_bytes(tmp_path, monkeypatch):
    """max_length 32 and <= 16 bytes a token: a chosen answer of 600 bytes is too long untokenised in chosen mode
    (the bound reads the pair as the format does); the default leaves it to the format's preference skip."""
    monkeypatch.setattr(dataset_module, "BYTE_BOUND_MIN_BYTES", 0)
    pair = {"prompt": "Hi", "chosen": "x" * 600, "rejected": "no"}
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(pair) + "\n")
    chosen = JsonlSFTDataset(path, TOK, format="chat", preference="chosen", max_length=32, cache_dir=tmp_path / "c")
    assert chosen.skipped_lines == [
        (1, "too_long", "line 1: at least 38 tokens (602 bytes of text, <= 16 bytes a token) > max_length 32")
    ]
    refused = JsonlSFTDataset(path, TOK, format="chat", max_length=32, cache_dir=tmp_path / "c")
    assert [(n, reason) for n, reason, _ in refused.skipped_lines] == [(1, "preference_data")]
