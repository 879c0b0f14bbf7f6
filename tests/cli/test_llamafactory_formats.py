"""LLaMA-Factory data on the GPT-SFT chat path and the Energon text path: ShareGPT tool calls
(``function_call`` / ``observation`` turns, ``tools`` as a JSON string, a top-level ``system``) end in
the OpenAI shape and render token for token as the official Qwen3-VL template renders that shape;
alpaca records (``instruction`` + ``input``, ``history``, ``system``) render as LLaMA-Factory builds
their turns; unknown roles are a counted ``unknown_role`` skip, never a literal turn."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_tool_calls import load

from energon_pack.chat import load_demo_tokenizer_raw
from energon_pack.chat.conversation import Message, normalize_conversation
from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
from energon_pack.errors import SampleSkipped
from energon_pack.sft import JsonlSFTDataset

transformers = pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parents[1]  # tests/
DATA = HERE / "data" / "llamafactory"
TEMPLATE = (HERE / "data" / "chat_templates" / "qwen3_vl_instruct.jinja").read_text()
RAW = load_demo_tokenizer_raw()
HF = transformers.PreTrainedTokenizerFast(tokenizer_object=load_demo_tokenizer_raw())
GLAIVE = json.loads((DATA / "glaive_toolcall_demo.json").read_text())
ALPACA = json.loads((DATA / "alpaca_demo.json").read_text())


def function(name, description, properties, required):
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


#: GLAIVE[0] and GLAIVE[2] as OpenAI messages + tools: what LLaMA-Factory's Qwen formatter renders
OPENAI_0 = {
    "messages": [
        {"role": "user", "content": "I have chicken, bell peppers, and rice. Find me a recipe?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("search_recipes", {"ingredients": ["chicken", "bell peppers", "rice"]})],
        },
        {"role": "tool", "content": '{"recipes": [{"name": "Chicken and Bell Pepper Stir Fry"}]}'},
        {"role": "assistant", "content": "Try a Chicken and Bell Pepper Stir Fry."},
    ],
    "tools": [
        function(
            "search_recipes",
            "Search for recipes based on ingredients",
            {
                "ingredients": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The ingredients to search for",
                }
            },
            ["ingredients"],
        )
    ],
}
OPENAI_2 = {
    "messages": [
        {"role": "system", "content": "You are a currency assistant."},
        {"role": "user", "content": "Convert 100 USD to EUR and to GBP."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("convert_currency", {"amount": 100, "from": "USD", "to": "EUR"}),
                call("convert_currency", {"amount": 100, "from": "USD", "to": "GBP"}),
            ],
        },
        {"role": "tool", "content": '{"converted_amount": 92.5}'},
        {"role": "assistant", "content": "100 USD is 92.5 EUR."},
    ],
    "tools": [
        function(
            "convert_currency",
            "Convert an amount from one currency to another",
            {"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
            ["amount", "from", "to"],
        )
    ],
}
#: ALPACA[1] as LLaMA-Factory's AlpacaDatasetConverter turns it: system, history pairs, "instruction\ninput", output
OPENAI_ALPACA_1 = {
    "messages": [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 1 and 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And 2 and 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Add the two numbers.\n2 and 3"},
        {"role": "assistant", "content": "5"},
    ]
}

UNKNOWN_ROLE = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "bot", "value": "Hello"}]}
UNKNOWN_ROLE_MSG = {
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "function", "content": "{}"},
        {"role": "assistant", "content": "Hello"},
    ]
}


def official_ids(record) -> list[int]:
    text = HF.apply_chat_template(record["messages"], chat_template=TEMPLATE, tools=record.get("tools"), tokenize=False)
    return RAW.encode(text, add_special_tokens=False).ids


def trained_text(encoded) -> str:
    return RAW.decode(encoded.input_ids[encoded.target_mask].tolist(), skip_special_tokens=False)


@pytest.fixture(scope="module")
def lf_jsonl(tmp_path_factory):
    """The fixtures as JSONL: glaive records 0-2, alpaca records 0-1, two unknown-role records."""
    path = tmp_path_factory.mktemp("lf") / "lf.jsonl"
    records = [*GLAIVE, *ALPACA[:2], UNKNOWN_ROLE, UNKNOWN_ROLE_MSG]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_llamafactory_tool_calls_normalise_to_the_openai_shape():
    for lf, openai in ((GLAIVE[0], OPENAI_0), (GLAIVE[2], OPENAI_2)):
        ours, theirs = normalize_conversation(lf), normalize_conversation(openai)
        assert list(ours) == list(theirs) and ours.tools == theirs.tools and len(ours.tools) == 1
    two = normalize_conversation(GLAIVE[2])
    assert two[0] == Message("system", (("text", "You are a currency assistant."),))  # the top-level system field
    assert two[2].tool_calls == (
        ("convert_currency", '{"amount": 100, "from": "USD", "to": "EUR"}'),
        ("convert_currency", '{"amount": 100, "from": "USD", "to": "GBP"}'),
    )
    assert normalize_conversation(GLAIVE[1]).tools == ()  # "tools": "[]"
    # a system turn among the turns wins over the top-level field (LLaMA-Factory's rule)
    both = normalize_conversation({**OPENAI_2, "system": "ignored"})
    assert [m.role for m in both].count("system") == 1 and both[0].parts == (("text", "You are a currency assistant."),)


@pytest.mark.parametrize(
    "record, reason, detail",
    [
        (
            {"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": "not json"}]},
            "bad_conversation",
            "turn 1 (function_call) is not JSON",
        ),
        (
            {
                "conversations": [
                    {"from": "human", "value": "a"},
                    {"from": "function_call", "value": '{"arguments": {}}'},
                ]
            },
            "bad_conversation",
            "turn 1 tool call 0 has no function name",
        ),
        (
            {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "tools": "{broken"},
            "bad_conversation",
            "tools is not JSON",
        ),
        (
            {
                "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}],
                "tools": '{"name": "f"}',
            },
            "bad_conversation",
            "tools is dict, not a list",
        ),
        (UNKNOWN_ROLE, "unknown_role", "turn 1 has role 'bot'"),
        (UNKNOWN_ROLE_MSG, "unknown_role", "turn 1 has role 'function'"),
        ({"instruction": "a", "output": "b", "history": [["only one"]]}, "bad_conversation", "alpaca history item 0"),
        (
            {"instruction": "a", "output": ["b", "c"]},
            "preference_data",
            "alpaca output is a list: LLaMA-Factory ranking",
        ),
    ],
)
def test_bad_llamafactory_records_are_counted_skips(record, reason, detail):
    with pytest.raises(SampleSkipped) as err:
        normalize_conversation(record)
    assert err.value.reason == reason and err.value.detail.startswith(detail)


def test_gpt_sft_chat_renders_llamafactory_tool_calls_and_alpaca_like_the_official_template(lf_jsonl):
    ds = JsonlSFTDataset(lf_jsonl, "demo", format="chat")
    assert ds.skips == {"unknown_role": 2}
    assert ds[0].input_ids.tolist() == official_ids(OPENAI_0)
    assert ds[2].input_ids.tolist() == official_ids(OPENAI_2)
    assert ds[4].input_ids.tolist() == official_ids(OPENAI_ALPACA_1)
    assert trained_text(ds[0]) == (
        '<tool_call>\n{"name": "search_recipes", "arguments": {"ingredients": '
        '["chicken", "bell peppers", "rice"]}}\n</tool_call><|im_end|>'
        "Try a Chicken and Bell Pepper Stir Fry.<|im_end|>"
    )
    assert trained_text(ds[2]) == (
        '<tool_call>\n{"name": "convert_currency", "arguments": {"amount": 100, "from": '
        '"USD", "to": "EUR"}}\n</tool_call>\n<tool_call>\n{"name": "convert_currency", '
        '"arguments": {"amount": 100, "from": "USD", "to": "GBP"}}\n</tool_call><|im_end|>'
        "100 USD is 92.5 EUR.<|im_end|>"
    )
    assert RAW.decode(ds[3].input_ids.tolist(), skip_special_tokens=False) == (
        "<|im_start|>user\nDescribe a process of making crepes.<|im_end|>\n<|im_start|>assistant\n"
        "Whisk flour, eggs and milk; cook thin layers in a hot pan.<|im_end|>\n"
    )  # empty input: no "\n"
    assert trained_text(ds[4]) == "2<|im_end|>4<|im_end|>5<|im_end|>"


def test_energon_text_path_takes_llamafactory_records_and_counts_unknown_roles(lf_jsonl, tmp_path):
    path = tmp_path / "lf.jsonl"
    path.write_bytes(lf_jsonl.read_bytes())
    assert prepare_jsonl(path) == 7
    segments, skips = load(path, TextPackingTaskEncoder(tokenizer="demo", format="chat", seq_length=1024), workers=2)
    assert skips == {"unknown_role": 2} and len(segments) == 5
    texts = [RAW.decode(ids, skip_special_tokens=False) for ids, _ in segments.values()]
    assert RAW.decode(official_ids(OPENAI_0), skip_special_tokens=False) in texts
    assert not any(
        "<|im_start|>bot" in t or "<|im_start|>function" in t or "<|im_start|>observation" in t for t in texts
    )


def test_inspect_cli_reads_alpaca_with_format_chat(tmp_path):
    path = tmp_path / "alpaca.jsonl"
    records = [*ALPACA[:2], {"instruction": "Say hi.", "input": "", "output": "Hi."}, UNKNOWN_ROLE]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = tmp_path / "report.json"
    env = {**os.environ, "ENERGON_PACK_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "energon_pack.cli",
            "inspect",
            str(path),
            "--format",
            "chat",
            "--tokenizer",
            "demo",
            "--seq-length",
            "512",
            "--json-out",
            str(report),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(report.read_text())
    assert out["lines"] == 4 and out["usable"] == 3
    assert {k: v["count"] for k, v in out["skips"].items()} == {"unknown_role": 1}


def test_convert_refuses_what_it_cannot_train_by_name_and_notes_tool_calls(tmp_path):
    """LLaMA-Factory's audio, KTO and preference demo shapes: counted skips naming them (never written as SFT
    text); v1 typed parts convert; tool-call records are written with a note naming the preset that trains them."""
    from energon_pack.cli.convert import convert

    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    records = [
        {"messages": [{"role": "user", "content": "<audio>What's that sound?"}, turns[1]], "audios": ["a.wav"]},
        {"messages": turns, "kto_tag": False},
        {"messages": turns, "kto_tag": True},
        {"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "a"}, "rejected": {}},
        {"messages": [{"role": "user", "content": [{"type": "text", "value": "hi"}], "loss_weight": 0.0}, turns[1]]},
        {
            "conversations": [
                {"from": "human", "value": "call it"},
                {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
                {"from": "observation", "value": "ok"},
                {"from": "gpt", "value": "done"},
            ],
            "tools": '[{"name": "f", "parameters": {}}]',
        },
    ]
    src = tmp_path / "lf.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    s = convert(src, tmp_path / "out", workers=1, progress=False)
    assert s.skipped == {"unsupported_audio": 1, "kto_undesirable": 1, "preference_data": 1} and s.written == 3
    assert s.tool_records == 1
    assert "1 of 3 written record(s) hold tool calls or tools: only the qwen3-vl preset trains them" in s.format_text()


#: records of LLaMA-Factory's dpo_en_demo.json shape (ShareGPT pairwise: prompt turns, a chosen and a rejected turn)
DPO_DEMO = [
    {
        "conversations": [{"from": "human", "value": "Name three primary colours."}],
        "chosen": {"from": "gpt", "value": "Red, yellow and blue."},
        "rejected": {"from": "gpt", "value": "Green."},
    },
    {
        "conversations": [
            {"from": "human", "value": "What is 2 + 2?"},
            {"from": "gpt", "value": "4."},
            {"from": "human", "value": "And times 3?"},
        ],
        "chosen": {"from": "gpt", "value": "12."},
        "rejected": {"from": "gpt", "value": "7."},
    },
    {
        "conversations": [{"from": "human", "value": "Translate 'thank you' to French."}],
        "system": "You are a translator.",
        "chosen": {"from": "gpt", "value": "Merci."},
        "rejected": {"from": "gpt", "value": "Gracias."},
    },
]
#: DPO_DEMO as the SFT records of their chosen answers, written by hand
DPO_DEMO_SFT = [
    {
        "conversations": [
            {"from": "human", "value": "Name three primary colours."},
            {"from": "gpt", "value": "Red, yellow and blue."},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "What is 2 + 2?"},
            {"from": "gpt", "value": "4."},
            {"from": "human", "value": "And times 3?"},
            {"from": "gpt", "value": "12."},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "Translate 'thank you' to French."},
            {"from": "gpt", "value": "Merci."},
        ],
        "system": "You are a translator.",
    },
]
DPO_TRAINED = ["Red, yellow and blue.<|im_end|>", "4.<|im_end|>12.<|im_end|>", "Merci.<|im_end|>"]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def shard_records(out):
    """The JSON records of a convert output's shards, in key order."""
    import tarfile

    found = {}
    for shard in sorted(out.glob("data-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(".json"):
                    found[m.name] = json.loads(tar.extractfile(m).read())
    return [found[k] for k in sorted(found)]


def test_convert_with_preference_chosen_writes_the_chosen_answers_as_sft_and_the_loader_packs_them(tmp_path):
    from energon_pack.cli.convert import convert
    from energon_pack.errors import ConfigError
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    src = write_jsonl(tmp_path / "dpo_en_demo.jsonl", DPO_DEMO)
    with pytest.raises(ConfigError, match="preference_data=3"):  # the default: all refused, nothing written
        convert(src, tmp_path / "refused", workers=1, progress=False)
    s = convert(src, tmp_path / "out", workers=2, progress=False, samples_per_shard=2, preference="chosen")
    assert (s.written, s.skipped, s.shards, s.format) == (3, {}, 2, "sharegpt")
    assert shard_records(tmp_path / "out") == DPO_DEMO_SFT  # SFT records: prompt + chosen, no pair fields
    twin = convert(write_jsonl(tmp_path / "sft.jsonl", DPO_DEMO_SFT), tmp_path / "twin", workers=1, progress=False)
    te = QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=1024)  # the shards need no option to load
    segments, skips = load(tmp_path / "out", te, workers=2)
    twin_segments, _ = load(tmp_path / "twin", te, workers=2)
    assert twin.written == 3 and skips == {} and segments == twin_segments and len(segments) == 3
    trained = [RAW.decode(segments[k][1], skip_special_tokens=False) for k in sorted(segments)]
    assert trained == DPO_TRAINED


def test_convert_reads_trl_and_alpaca_pairs_in_chosen_mode_and_keeps_unreadable_ones_a_preference_skip(
    tmp_path, capsys
):
    """TRL's keys (``prompt`` / ``chosen``) and alpaca pairwise (no ``output``) tell auto-detection no shape: in
    chosen mode they are read as their chosen answers; a pair of an unread shape is a counted skip naming it."""
    from energon_pack.cli.convert import main

    records = [
        {"prompt": "Name three primary colours.", "chosen": "Red, yellow and blue.", "rejected": "Green."},
        {
            "chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
            "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}],
        },
        {"instruction": "Say thanks", "input": "in French", "chosen": "Merci.", "rejected": "Gracias."},
        {"prompt": "q", "chosen": 3, "rejected": 4},
    ]
    ranking = {"instruction": "Count to two", "input": "", "output": ["1, 2", "2, 1"]}
    src = write_jsonl(tmp_path / "trl.jsonl", records)
    assert main([str(src), str(tmp_path / "refused"), "--workers", "0", "--no-progress"]) == 2  # no shape told
    lines = write_jsonl(tmp_path / "lines.jsonl", [*records, ranking])  # detected as alpaca (instruction + output)
    assert main([str(lines), str(tmp_path / "refused"), "--workers", "0", "--no-progress"]) == 2
    assert "could be converted: preference_data=5 (e.g. line 1: chosen/rejected: a DPO/ORPO" in capsys.readouterr().err
    flags = ["--workers", "0", "--no-progress", "--json", "--preference", "chosen", "--max-skipped-share", "0.3"]
    assert (
        main([str(src), str(tmp_path / "out"), *flags]) == 0 and main([str(lines), str(tmp_path / "o2"), *flags]) == 0
    )
    summary = json.loads((tmp_path / "out" / "convert_summary.json").read_text())
    assert summary["written"] == 3 and summary["skipped"] == {"preference_data": 1}
    assert summary["detected"] == "messages (JSONL, preference pairs, read as their chosen answers)"
    assert summary["examples"]["preference_data"] == [
        "line 4: chosen/rejected of a shape not read as SFT: chosen is 3: not a string, a turn or a list of turns"
    ]
    assert shard_records(tmp_path / "o2")[3:] == [
        {"messages": [{"role": "user", "content": "Count to two"}, {"role": "assistant", "content": "1, 2"}]}
    ]
    assert shard_records(tmp_path / "out") == [
        {
            "messages": [
                {"role": "user", "content": "Name three primary colours."},
                {"role": "assistant", "content": "Red, yellow and blue."},
            ]
        },
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
        {
            "messages": [
                {"role": "user", "content": "Say thanks\nin French"},
                {"role": "assistant", "content": "Merci."},
            ]
        },
    ]


def test_energon_text_path_and_gpt_sft_cli_train_the_chosen_answers(tmp_path, monkeypatch, capsys):
    from energon_pack.cli.main import main, parse_args
    from energon_pack.cli.options import field_kw

    path = write_jsonl(tmp_path / "dpo.jsonl", DPO_DEMO)
    assert prepare_jsonl(path) == 3
    te = TextPackingTaskEncoder(tokenizer="demo", format="chat", preference="chosen", seq_length=1024)
    segments, skips = load(path, te, workers=2)
    twin = write_jsonl(tmp_path / "sft.jsonl", DPO_DEMO_SFT)
    prepare_jsonl(twin)
    twin_segments, _ = load(twin, TextPackingTaskEncoder(tokenizer="demo", format="chat", seq_length=1024), workers=2)
    assert skips == {} and sorted(segments.values()) == sorted(twin_segments.values()) and len(segments) == 3
    with pytest.warns(RuntimeWarning, match=r'preference_data: 3\. Likely fix: .*preference="chosen" \(--preference'):
        refused, _ = load(path, TextPackingTaskEncoder(tokenizer="demo", format="chat", seq_length=1024))
    assert refused == {}  # the default: every pair refused

    monkeypatch.setenv("ENERGON_PACK_CACHE_DIR", str(tmp_path / "cache"))
    inspect = ["inspect", str(path), "--format", "chat", "--tokenizer", "demo", "--seq-length", "512", "--json-out"]
    assert main([*inspect, str(tmp_path / "chosen.json"), "--preference", "chosen"]) == 0
    assert main([*inspect, str(tmp_path / "refused.json")]) == 1  # no usable line
    chosen, refused = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("chosen", "refused"))
    assert (chosen["usable"], chosen["skips"]) == (3, {})
    assert refused["usable"] == 0 and {k: v["count"] for k, v in refused["skips"].items()} == {"preference_data": 3}
    for argv in (
        ["pack-offline", str(path), str(tmp_path / "packs"), "--format", "chat", "--preference", "chosen"],
        ["bench-sft", "--data", str(path), "--format", "chat", "--preference", "chosen"],
    ):
        assert field_kw(parse_args(argv)) == {"preference": "chosen"}
    assert field_kw(parse_args(["inspect", str(path), "--format", "chat"])) == {}
    capsys.readouterr()
    assert main(["inspect", str(path), "--preference", "chosen", "--tokenizer", "demo"]) == 2
    assert "--preference applies to --format chat only (--format prompt_completion)" in capsys.readouterr().err
