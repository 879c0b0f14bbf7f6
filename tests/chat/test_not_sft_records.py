"""Data that is not plain SFT of the modalities trained here is a counted skip naming it, never trained as text:
LLaMA-Factory audio, KTO examples labelled undesirable, preference pairs (DPO/ORPO/ranking), v1 reasoning parts and
fractional loss weights. LLaMA-Factory v1 typed parts (``value``, ``tool_call``) and its 0/1 ``loss_weight`` train
as written. Checked on the normaliser every path shares, the GPT-SFT chat path and the Energon VLM encoder."""

from __future__ import annotations

import json
import warnings

import pytest
import webdataset as wds
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack import QwenVLPackingTaskEncoder, prepare
from energon_pack.chat import ChatConfig, encode_text_chat, load_tokenizer, normalize_conversation
from energon_pack.errors import SampleSkipped
from energon_pack.sft import JsonlSFTDataset

TOK = load_tokenizer("demo")
V1_TURNS = [
    {"role": "user", "content": [{"type": "text", "value": "hi"}], "loss_weight": 0.0},
    {"role": "assistant", "content": [{"type": "text", "value": "Hello!"}], "loss_weight": 1.0},
]
NOT_SFT = {
    "unsupported_audio": {
        "messages": [{"role": "user", "content": "<audio>What's that sound?"}, {"role": "assistant", "content": "A"}],
        "audios": ["a.wav"],
    },
    "kto_undesirable": {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "bad"}],
        "kto_tag": False,
    },
    "preference_data": {
        "conversations": [{"from": "human", "value": "q"}],
        "chosen": {"from": "gpt", "value": "a"},
        "rejected": {"from": "gpt", "value": "b"},
    },
    "unsupported_reasoning": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "value": "q"}]},
            {"role": "assistant", "content": [{"type": "reasoning", "value": "hmm"}, {"type": "text", "value": "a"}]},
        ]
    },
    "unsupported_loss_weight": {"messages": [{**V1_TURNS[0], "loss_weight": 0.5}, V1_TURNS[1]]},
}


@pytest.mark.parametrize("reason", sorted(NOT_SFT))
def test_not_sft_records_are_skipped_by_name(reason):
    with pytest.raises(SampleSkipped) as err:
        normalize_conversation(NOT_SFT[reason])
    assert err.value.reason == reason


def test_more_shapes_of_the_same():
    for record, reason in (
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "unsupported_audio"),
        ([{"role": "user", "content": "<audio> hi"}, {"role": "assistant", "content": "x"}], "unsupported_audio"),
        ({"instruction": "q", "output": ["better", "worse"]}, "preference_data"),  # LLaMA-Factory alpaca ranking
        ({"messages": [{"role": "user", "content": "q"}], "label": False}, "kto_undesirable"),
    ):
        with pytest.raises(SampleSkipped) as err:
            normalize_conversation(record)
        assert err.value.reason == reason, record


def test_v1_parts_and_loss_weight_train_as_written():
    assert normalize_conversation({"messages": V1_TURNS})[0].parts == (("text", "hi"),)
    desirable = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "good"}]}
    ids, target = encode_text_chat({**desirable, "kto_tag": True}, tokenizer=TOK, config=ChatConfig())
    ids0, target0 = encode_text_chat(desirable, tokenizer=TOK, config=ChatConfig())
    assert ids.tolist() == ids0.tolist() and target.tolist() == target0.tolist()  # a desirable KTO example is SFT
    flipped = [{**V1_TURNS[0], "loss_weight": 1.0}, {**V1_TURNS[1], "loss_weight": 0.0}]
    plain = [{"role": t["role"], "content": t["content"][0]["value"]} for t in V1_TURNS]
    ids, as_written = encode_text_chat({"messages": V1_TURNS}, tokenizer=TOK, config=ChatConfig())
    _, default = encode_text_chat({"messages": plain}, tokenizer=TOK, config=ChatConfig())
    assert as_written.tolist() == default.tolist()  # user 0, assistant 1: the default policy exactly
    _, reversed_mask = encode_text_chat(
        {"messages": flipped}, tokenizer=TOK, config=ChatConfig(loss_policy="last_turn")
    )
    assert reversed_mask.any() and not (reversed_mask & as_written).any()  # loss_weight wins over the policy
    ids_all, mask_all = encode_text_chat(
        {"messages": [{**V1_TURNS[0], "loss_weight": 1.0}, V1_TURNS[1]]}, tokenizer=TOK, config=ChatConfig()
    )
    assert mask_all.sum() > as_written.sum()  # the user turn is trained too, as its loss_weight says
    calls = normalize_conversation(
        {
            "messages": [
                V1_TURNS[0],
                {
                    "role": "assistant",
                    "content": [{"type": "tool_call", "value": '{"name": "f", "arguments": {"x": 1}}'}],
                },
            ]
        }
    )
    assert calls[1].tool_calls == (("f", '{"x": 1}'),) and calls[1].parts == ()


def test_gpt_sft_chat_path_counts_them(tmp_path):
    path = tmp_path / "mixed.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    lines = [good, {"messages": V1_TURNS}, *NOT_SFT.values(), NOT_SFT["kto_undesirable"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    ds = JsonlSFTDataset(path, TOK, format="chat", cache_dir=tmp_path / "c")
    assert dict(ds.skips) == {
        "kto_undesirable": 2,
        "preference_data": 1,
        "unsupported_audio": 1,
        "unsupported_loss_weight": 1,
        "unsupported_reasoning": 1,
    }


def test_energon_encoder_skips_them_through_the_loader(tmp_path):
    root = tmp_path / "shards"
    root.mkdir()
    samples = [("good", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "an answer"}])]
    samples += [("v1", V1_TURNS), ("audio", NOT_SFT["unsupported_audio"]["messages"])]
    samples += [("reason", NOT_SFT["unsupported_reasoning"]["messages"])]
    with wds.TarWriter(str(root / "data-000000.tar")) as sink:
        for i in range(40):
            name, turns = samples[i % len(samples)]
            sink.write({"__key__": f"{name}-{i:03d}", "json": json.dumps({"conversations": turns}).encode()})
    prepare(root)
    te = QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=512)
    ds = get_train_dataset(
        str(root),
        batch_size=1,
        task_encoder=te,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        packing_buffer_size=8,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        repeat=False,
    )
    keys = [k for batch in get_loader(ds) for k in batch["__keys__"]]
    assert sorted({k.split("-")[0] for k in keys}) == ["good", "v1"]
    assert len(keys) == 20


def test_chosen_mode_trains_the_pair_and_still_refuses_the_rest(tmp_path):
    """``preference="chosen"`` reads preference pairs only: audio, KTO-undesirable, reasoning and fractional loss
    weights stay the same counted skips, on the GPT-SFT chat path and through the Energon VLM encoder's loader."""
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in NOT_SFT.values()))
    ds = JsonlSFTDataset(path, TOK, format="chat", preference="chosen", cache_dir=tmp_path / "c")
    assert dict(ds.skips) == {
        "kto_undesirable": 1,
        "unsupported_audio": 1,
        "unsupported_loss_weight": 1,
        "unsupported_reasoning": 1,
    }
    pair_line = list(NOT_SFT).index("preference_data")
    assert ds.lengths[pair_line] == len(
        encode_text_chat(
            {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, tokenizer=TOK
        )[0]
    )
    root = tmp_path / "shards"
    root.mkdir()
    records = [("pair", NOT_SFT["preference_data"]), ("audio", NOT_SFT["unsupported_audio"])]
    with wds.TarWriter(str(root / "data-000000.tar")) as sink:
        for i in range(12):
            name, record = records[i % 2]
            sink.write({"__key__": f"{name}-{i:03d}", "json": json.dumps(record).encode()})
    prepare(root)
    keys = {}
    for preference in ("refuse", "chosen"):
        te = QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=512, chat=ChatConfig(preference=preference))
        ds = get_train_dataset(
            str(root),
            batch_size=1,
            task_encoder=te,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            packing_buffer_size=8,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=False,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the refused run emits nothing: its warning says so
            keys[preference] = sorted(k for batch in get_loader(ds) for k in batch["__keys__"])
    assert keys == {"refuse": [], "chosen": [f"pair-{i:03d}" for i in range(0, 12, 2)]}
