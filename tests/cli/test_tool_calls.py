"""OpenAI tool-call chats through the real Energon loader: rendered as the official Qwen3-VL template
renders them (qwen3-vl preset and the GPT-SFT chat path), a counted ``tool_calls_unsupported``
skip for the Qwen2/2.5-VL templates (which have no tool handling), and empty assistant turns a
counted ``empty_assistant_turn`` skip, never trained."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from PIL import Image

from energon_pack.chat import load_demo_tokenizer, load_demo_tokenizer_raw
from energon_pack.cli.convert import convert
from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.sft import JsonlSFTDataset

transformers = pytest.importorskip("transformers")

TEMPLATE = (Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "qwen3_vl_instruct.jinja").read_text()
RAW = load_demo_tokenizer_raw()
HF = transformers.PreTrainedTokenizerFast(tokenizer_object=load_demo_tokenizer_raw())

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_CHAT = {
    "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"wind": 3}'},
        {"role": "assistant", "content": "21 degrees, light wind."},
    ],
    "tools": TOOLS,
}
PLAIN = {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}]}
EMPTY_NULL = {"messages": [{"role": "user", "content": "Anything?"}, {"role": "assistant", "content": None}]}
EMPTY_STR = {
    "messages": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]
}


def official_ids(record) -> list[int]:
    text = HF.apply_chat_template(record["messages"], chat_template=TEMPLATE, tools=record.get("tools"), tokenize=False)
    return RAW.encode(text, add_special_tokens=False).ids


def load(path, te, workers=0):
    ds = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    tracker, segments = PackingStatsTracker(), {}
    for b in get_loader(ds):
        tracker.update(b["packing_stats"])
        cu = b["cu_seqlens_q"].tolist()
        for n, key in enumerate(b["__keys__"]):
            ids = b["input_ids"][0, cu[n] : cu[n + 1]]
            # labels are shifted: token i+1 is trained where label i is set, and the loss mask says the same
            set_ = b["labels"][0, cu[n] : cu[n + 1] - 1] != -100
            assert b["loss_mask"][0, cu[n] : cu[n + 1] - 1].bool().tolist() == set_.tolist()
            trained = ids[1:][set_]
            segments[key] = (ids.tolist(), trained.tolist())
    return segments, dict(tracker.total.skips)


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [PLAIN, TOOL_CHAT, EMPTY_NULL, PLAIN, EMPTY_STR, TOOL_CHAT]))
    assert prepare_jsonl(path) == 6
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_text_chat_renders_tool_calls_and_skips_empty_assistant_turns(chat_jsonl, workers):
    te = TextPackingTaskEncoder(tokenizer="demo", format="chat", seq_length=1024)
    segments, skips = load(chat_jsonl, te, workers)
    assert skips == {"empty_assistant_turn": 2}  # never trained, always counted
    assert sorted(segments, key=int) == ["0", "1", "3", "5"]
    ids, trained = segments["1"]
    assert ids == official_ids(TOOL_CHAT)  # the official Qwen3-VL rendering, token for token
    trained_text = RAW.decode(trained, skip_special_tokens=False)
    assert trained_text == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>21 degrees, light wind.<|im_end|>"
    )
    text = RAW.decode(ids, skip_special_tokens=False)
    assert "<|im_start|>tool" not in text and text.count("<|im_start|>user") == 2  # both responses: one user turn


def test_jsonl_dataset_path_matches_the_energon_path(chat_jsonl):
    ds = JsonlSFTDataset(chat_jsonl, "demo", format="chat")
    assert ds.skips == {"empty_assistant_turn": 2}
    assert ds[1].input_ids.tolist() == official_ids(TOOL_CHAT)


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tool_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool_shards")
    (root / "a.png").write_bytes(_png(0))
    image_chat = {
        "messages": [
            {"role": "user", "content": "<image>Where is this? Weather there?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "Paris, sunny."},
        ],
        "tools": TOOLS,
        "images": ["a.png"],
    }
    records = [PLAIN, TOOL_CHAT, image_chat, PLAIN]
    (root / "src.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = convert(root / "src.jsonl", root / "out", workers=1, samples_per_shard=2, progress=False)
    assert summary.written == 4
    return root / "out"


def test_qwen2_vl_templates_skip_tool_chats_with_a_counted_reason(tool_shards):
    for preset in ("qwen2-vl", "qwen2.5-vl"):
        segments, skips = load(
            tool_shards, QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=2048), workers=2
        )
        assert skips == {"tool_calls_unsupported": 2} and len(segments) == 2


def test_qwen3_vl_renders_tool_chats_like_the_official_template(tool_shards):
    segments, skips = load(tool_shards, QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen3-vl", seq_length=2048))
    assert skips == {} and len(segments) == 4
    texts = [RAW.decode(ids, skip_special_tokens=False) for ids, _ in segments.values()]
    with_calls = [t for t in texts if "<tool_call>" in t]
    assert len(with_calls) == 2
    official = RAW.decode(official_ids(TOOL_CHAT), skip_special_tokens=False)
    assert official in texts  # text-only tool chat: exactly the official rendering
    image_text = next(t for t in with_calls if "<|image_pad|>" in t)
    assert image_text.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in image_text


def test_demo_tokenizer_by_name_is_the_demo_tokenizer():
    assert TextPackingTaskEncoder(tokenizer="demo", format="chat").format.tokenizer.encode(
        "hello"
    ) == load_demo_tokenizer().encode("hello")
