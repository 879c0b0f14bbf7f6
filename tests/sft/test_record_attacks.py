"""Records read wrong (issue 45): alpaca records on the default prompt/completion road train their instruction
(LLaMA-Factory's rule, the chat road's own), an empty prompt field beside a filled one is a counted skip, and one KTO
label rule (bool, 0/1, "true"/"false"/"1"/"0" in any case; anything else a counted skip naming it) holds on every
road: prompt/completion (GPT-SFT, pack-offline, the Energon text encoder), chat (GPT-SFT, the Qwen-VL loader) and
convert -> loader. TRL's prompt/completion records (standard and conversational, KTO's form too) read as chat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import webdataset as wds
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack import QwenVLPackingTaskEncoder, prepare
from energon_pack.chat import ChatConfig, encode_text_chat, load_tokenizer
from energon_pack.chat.conversation import alpaca_turns, kto_label
from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
from energon_pack.errors import SampleSkipped
from energon_pack.sft import JsonlSFTDataset
from energon_pack.sft.formats import PromptCompletionFormat

TOK = load_tokenizer("demo")
EOS = "<|endoftext|>"

ALPACA = [
    {"instruction": "Translate to French: cat", "input": "", "output": "chat"},
    {"instruction": "Add the numbers.", "input": "2 3", "output": "5"},
    {"instruction": "Name a colour.", "output": "Red."},  # no input key at all
    {"instruction": "And times 3?", "input": "", "output": "15", "history": [["Add 2 3", "5"]]},
    {"instruction": "Say hi.", "input": "", "output": "Hi.", "system": "Be brief."},
]
#: what prompt/completion trains of each usable ALPACA record: (prompt text, supervised text)
ALPACA_TRAINED = [
    ("Translate to French: cat", "chat" + EOS),
    ("Add the numbers.\n2 3", "5" + EOS),
    ("Name a colour.", "Red." + EOS),
]


def _write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _split(ids, target) -> tuple[str, str]:
    """(the unsupervised prefix, the supervised rest) of one sample, decoded; the supervised part is a suffix."""
    ids, target = list(ids), [bool(t) for t in target]
    first = target.index(True)
    assert all(target[first:]), target
    return TOK.decode([int(t) for t in ids[:first]]), TOK.decode([int(t) for t in ids[first:]])


def _trained(enc) -> tuple[str, str]:
    """:func:`_split` of an encoded record."""
    return _split(enc.input_ids, enc.target_mask)


# ---------------------------------------------------------------------------------------------- alpaca, the reader
def test_prompt_completion_reads_alpaca_records_as_alpaca_does(tmp_path):
    no_input = JsonlSFTDataset(_write(tmp_path / "a.jsonl", [ALPACA[2]] * 3), TOK, cache_dir=tmp_path / "c")
    assert (no_input.format.prompt_field, no_input.format.completion_field) == ("instruction", "output")  # sniffed
    assert no_input.skips == {} and _trained(no_input[0]) == ALPACA_TRAINED[2]
    for field in ("input", "instruction"):  # the sniffed NeMo pair and the alpaca pair give the same samples
        fmt = PromptCompletionFormat(TOK, prompt_field=field, completion_field="output")
        assert [_trained(fmt.encode(r)) for r in ALPACA[:3]] == ALPACA_TRAINED
    # the one rule: the prompt is exactly the user turn the chat road builds from the same record
    assert [alpaca_turns(r)[-2]["content"] for r in ALPACA[:3]] == [p for p, _ in ALPACA_TRAINED]
    fmt = PromptCompletionFormat(TOK, prompt_field="input", completion_field="output")
    for record, reason, detail in (
        (ALPACA[3], "needs_chat_format", "alpaca record with history: prompt/completion has no system or earlier"),
        (ALPACA[4], "needs_chat_format", "alpaca record with system: prompt/completion has no system or earlier"),
        (
            {"input": "", "output": "x", "prompt": "the question"},
            "prompt_field_mismatch",
            "the prompt field 'input' is empty but 'prompt' holds text",
        ),
        (
            {"instruction": " ", "input": "", "output": "x", "prompt": "q"},
            "prompt_field_mismatch",
            "the prompt field 'input' is empty but 'prompt' holds text",
        ),
    ):
        with pytest.raises(SampleSkipped) as err:
            fmt.encode(record)
        assert (err.value.reason, err.value.detail[: len(detail)]) == (reason, detail)
    plain = PromptCompletionFormat(TOK)  # an empty prompt with no other prompt field still trains (NeMo allows it)
    assert _trained(plain.encode({"prompt": "", "completion": "ok"})) == (
        "",
        "ok" + EOS,
    )


# ---------------------------------------------------------------------------- alpaca, through the real CLI commands
def _packed_samples(out: Path) -> list[tuple[str, str]]:
    """Every sample of pack-offline's Parquet as (prompt text, supervised text), in file order."""
    pq = pytest.importorskip("pyarrow.parquet")
    (path,) = out.glob("*.parquet")
    samples = []
    for row in pq.read_table(path).to_pylist():
        ids, loss, starts = row["input_ids"], row["loss_mask"], [*row["seq_start_id"], len(row["input_ids"])]
        for a, b in zip(starts, starts[1:]):
            target = [0] + loss[a : b - 1]  # loss_mask is rolled: loss[i] says token i + 1 is supervised
            samples.append(_split(ids[a:b], target))
    return samples


def test_pack_offline_and_inspect_train_the_alpaca_instruction(tmp_path, capsys):
    from energon_pack.cli import main

    src = _write(tmp_path / "alpaca.jsonl", ALPACA)
    out, summary, report = tmp_path / "packs", tmp_path / "summary.json", tmp_path / "report.json"
    common = ["--tokenizer", "demo", "--cache-dir", str(tmp_path / "c")]
    argv = ["pack-offline", str(src), str(out), "--seq-length", "64", "--json-out", str(summary), *common]
    assert main(argv) == 0
    assert "needs_chat_format: 2" in capsys.readouterr().out
    s = json.loads(summary.read_text())
    assert (s["lines"], s["samples"], s["skips"]) == (5, 3, {"needs_chat_format": 2})
    assert sorted(_packed_samples(out)) == sorted(ALPACA_TRAINED)
    assert main(["inspect", str(src), "--seq-length", "64", "--json-out", str(report), *common]) == 0
    r = json.loads(report.read_text())
    assert (r["usable"], {k: v["count"] for k, v in r["skips"].items()}) == (3, {"needs_chat_format": 2})
    assert r["skips"]["needs_chat_format"]["first_lines"] == [4, 5]


# ------------------------------------------------------------------------------------------------------- KTO labels
#: every spelling of a KTO label read, with what it says (True and 1 compare equal: a list, not a dict)
SPELLINGS = [
    (True, True),
    ("true", True),
    ("True", True),
    (" TRUE ", True),
    (1, True),
    ("1", True),
    (False, False),
    ("false", False),
    ("False", False),
    (0, False),
    ("0", False),
]
UNREADABLE = ["maybe", 2, 0.5, "", [True]]
#: the index of each label of _kto_records that trains
DESIRABLE = [i for i, (_, says) in enumerate(SPELLINGS) if says]
COUNTS = {"kto_undesirable": 5, "kto_label_unreadable": len(UNREADABLE)}


def test_one_kto_label_rule():
    assert [(v, kto_label("label", v)) for v, _ in SPELLINGS] == SPELLINGS
    assert [type(kto_label("label", v)) for v, _ in SPELLINGS] == [bool] * len(SPELLINGS)
    assert kto_label("label", None) is None
    for value in UNREADABLE:
        with pytest.raises(SampleSkipped) as err:
            kto_label("kto_tag", value)
        assert err.value.reason == "kto_label_unreadable" and err.value.detail.startswith(f"KTO kto_tag is {value!r}")


def _kto_records(make) -> list:
    """One record per spelling, then one per unreadable value, made by ``make(i, label)``."""
    return [make(i, v) for i, v in enumerate([v for v, _ in SPELLINGS] + UNREADABLE)]


def _pc(i, label):  # TRL's unpaired KTO record: prompt, completion, label
    return {"prompt": f"question {i}", "completion": f"answer {i}", "label": label}


def _chat(i, label):  # LLaMA-Factory's KTO record: messages and kto_tag
    turns = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
    return {"messages": turns, "kto_tag": label}


def _trl_chat(i, label):  # TRL's conversational KTO record
    return {
        "prompt": [{"role": "user", "content": f"question {i}"}],
        "completion": [{"role": "assistant", "content": f"answer {i}"}],
        "label": label,
    }


@pytest.mark.parametrize("fmt, make", [("prompt_completion", _pc), ("chat", _chat), ("chat", _trl_chat)])
def test_gpt_sft_roads_skip_every_undesirable_spelling(tmp_path, fmt, make):
    path = _write(tmp_path / "kto.jsonl", _kto_records(make))
    ds = JsonlSFTDataset(path, TOK, format=fmt, cache_dir=tmp_path / "c")
    assert [i for i in range(len(ds)) if ds.lengths[i] > 0] == DESIRABLE
    assert dict(ds.skips) == COUNTS
    serial = JsonlSFTDataset(path, TOK, format=fmt, cache_dir=tmp_path / "s", length_batch=False)
    assert serial.lengths.tolist() == ds.lengths.tolist()  # the batched pass's lean route reads them as encode does
    assert "is 'maybe': a KTO label is true/false" in ds.skip_example("kto_label_unreadable")
    enc = ds[DESIRABLE[1]]
    if fmt == "chat":  # TRL's records train exactly as the same turns written as messages
        ids, target = encode_text_chat(_chat(DESIRABLE[1], True), tokenizer=TOK, config=ChatConfig())
        assert (enc.input_ids.tolist(), enc.target_mask.tolist()) == (ids.tolist(), target.tolist())
    else:
        assert _trained(enc) == ("question 1", "answer 1" + EOS)


def test_trl_string_records_on_the_chat_road_name_the_prompt_completion_format():
    """TRL's standard (strings) form is prompt/completion data: on the chat road a skip naming the format that reads
    it (its conversational form reads as chat, above)."""
    with pytest.raises(SampleSkipped) as err:
        encode_text_chat(_pc(0, True), tokenizer=TOK, config=ChatConfig())
    assert (err.value.reason, err.value.detail) == (
        "bad_conversation",
        'prompt/completion strings, not chat turns: read them with format="prompt_completion" (--format '
        "prompt_completion), or write TRL's conversational form (lists of turns)",
    )


def _total_skips(batches) -> dict[str, int]:
    last = {}
    for b in batches:  # each worker's last stats
        stats = b["packing_stats"]
        last[(stats["rank"], stats["worker"])] = dict(stats["skips"])
    total: dict[str, int] = {}
    for per_worker in last.values():
        for reason, n in per_worker.items():
            total[reason] = total.get(reason, 0) + n
    return total


def _load(path, te, keys_of=lambda k: k):
    ds = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    batches = list(get_loader(ds))
    return sorted(keys_of(k) for b in batches for k in b["__keys__"]), _total_skips(batches)


def test_energon_text_encoder_skips_every_undesirable_spelling(tmp_path):
    path = _write(tmp_path / "kto.jsonl", _kto_records(_pc))
    assert prepare_jsonl(path) == len(SPELLINGS) + len(UNREADABLE)
    assert _load(path, TextPackingTaskEncoder(tokenizer="demo", seq_length=256), int) == (DESIRABLE, COUNTS)


def test_qwen_vl_loader_skips_every_undesirable_spelling(tmp_path):
    records = _kto_records(_chat) + _kto_records(_trl_chat)
    root = tmp_path / "shards"
    root.mkdir()
    with wds.TarWriter(str(root / "data-000000.tar")) as sink:
        for i, record in enumerate(records):
            sink.write({"__key__": f"{i:03d}", "json": json.dumps(record).encode()})
    prepare(root)
    keys, skips = _load(root, QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=512), int)
    assert keys == DESIRABLE + [len(records) // 2 + i for i in DESIRABLE]
    assert skips == {reason: 2 * n for reason, n in COUNTS.items()}


@pytest.mark.parametrize("makes", [(_chat,), (_trl_chat,), (_chat, _trl_chat, _pc)])
def test_convert_then_loader_skip_every_undesirable_spelling(tmp_path, makes):
    """LLaMA-Factory's and TRL's KTO records (TRL's alone too: detected as prompt/completion), written as messages."""
    from energon_pack.cli.convert import convert

    src = _write(tmp_path / "kto.jsonl", [r for make in makes for r in _kto_records(make)])
    s = convert(src, tmp_path / "out", workers=1, progress=False)
    assert (s.skipped, s.written) == ({k: n * len(makes) for k, n in COUNTS.items()}, len(DESIRABLE) * len(makes))
    with wds.WebDataset(str(next((tmp_path / "out").glob("*.tar"))), shardshuffle=False) as written:
        docs = [json.loads(sample["json"]) for sample in written]
    assert docs[1] == {"messages": _chat(1, "true")["messages"], ("kto_tag" if makes[0] is _chat else "label"): "true"}
    keys, skips = _load(tmp_path / "out", QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=512))
    assert len(keys) == len(DESIRABLE) * len(makes) and skips == {}


def test_the_byte_bound_reads_records_as_the_format_does(tmp_path, monkeypatch):
    """A line too long by its bytes alone: a KTO-undesirable one stays ``kto_undesirable`` (the format decides) and an
    alpaca one is bounded by its instruction, which the format trains (not by its empty ``input``)."""
    from energon_pack.sft import dataset as dataset_module

    monkeypatch.setattr(dataset_module, "BYTE_BOUND_MIN_BYTES", 0)
    lines = [
        {"input": "Hi", "output": "x" * 600, "label": "false"},
        {"instruction": "x" * 600, "input": "", "output": "ok"},
        {"input": "Hi", "output": "ok", "label": "1"},
    ]
    ds = JsonlSFTDataset(_write(tmp_path / "d.jsonl", lines), TOK, max_length=16, cache_dir=tmp_path / "c")
    lengths, reasons, details, _ = ds.compute_lengths(workers=1, batch=True)
    assert [reasons[-1 - n] if n < 0 else n for n in lengths] == ["kto_undesirable", "too_long", 4]
    assert details[2] == "line 2: at least 38 tokens (602 bytes of text, <= 16 bytes a token) > max_length 16"
