"""The ``inspect`` report: counts, percentiles, skips with first lines, packer fill vs the concat baseline."""

import json
import warnings

import numpy as np
import pytest

from energon_pack.chat import DemoTokenizerWarning
from energon_pack.cli.inspect import HINT_NAMES, show
from energon_pack.sft.inspect import best_baseline, concat_baseline, format_report, inspect_jsonl

GOOD = {"prompt": "Hi there", "completion": "Hello!"}  # 7 tokens with the demo tokenizer


def test_report_exact_counts_and_fill(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps(GOOD)] * 8 + ["{bad", "", json.dumps({"prompt": "x"})]) + "\n")
    report = inspect_jsonl(path, tokenizer="demo", seq_length=16)
    assert (report["lines"], report["usable"], report["tokens"]) == (11, 8, 56)
    assert report["skips"] == {
        "empty_line": {"count": 1, "first_lines": [10]},
        "invalid_json": {"count": 1, "first_lines": [9]},
        "missing_field": {"count": 1, "first_lines": [11]},
    }
    assert report["length"]["p50"] == 7.0 and report["length"]["max"] == 7
    assert report["packing"]["packs"] == 4 and report["packing"]["fill"] == 56 / 64  # two 7-token samples per 16
    assert report["baseline_concat"]["mbs"] == 2 and report["baseline_concat"]["fill"] == 56 / 64
    assert report["tokenizer"].startswith("demo") and report["hints"] == []
    assert show(path, tokenizer="demo", seq_length=16, json_out=tmp_path / "r.json") == 0
    assert "invalid_json" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["usable"] == 8


def test_concat_baseline_counts_overflow():
    lengths = np.array([3, 5, 7, 9])
    assert concat_baseline(lengths, 10, 2, seed=0)["rows"] == 2
    assert concat_baseline(lengths, 10, 4)["overflow_rate"] == 1.0 and concat_baseline(lengths, 10, 4)["fill"] == 1.0
    assert best_baseline(np.full(100, 30), 100)["mbs"] == 3


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_no_tokenizer_warns_and_the_report_names_the_tokenizer(tmp_path):
    path = _write(tmp_path / "d.jsonl", [GOOD] * 3)
    with pytest.warns(
        DemoTokenizerWarning,
        match=r'inspect: no tokenizer given, so the offline DEMO tokenizer is used.*tokenizer="demo"',
    ):
        report = inspect_jsonl(path, seq_length=16)
    assert report["tokenizer"] == "demo (the 773-token offline demo tokenizer, not a real vocabulary)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for by name: silent
        assert inspect_jsonl(path, tokenizer="demo", seq_length=16)["tokenizer"] == report["tokenizer"]
    assert "tokenizer demo (the 773-token" in format_report(report).splitlines()[0]


CHAT = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}], "id": 1}


def test_hint_chat_records_without_format_chat(tmp_path, capsys):
    path = _write(tmp_path / "chat.jsonl", [CHAT] * 20)
    report = inspect_jsonl(path, tokenizer="demo", seq_length=64)
    assert report["skips"]["missing_field"]["count"] == 20
    assert report["hints"] == [
        "20 of 20 lines skip with missing_field: the records have the fields 'messages', 'id'; "
        "'messages' holds chat turns: use format=\"chat\""
    ]
    cli = inspect_jsonl(path, tokenizer="demo", seq_length=64, names=HINT_NAMES)[
        "hints"
    ]  # energon-pack inspect: the flag
    assert cli == [report["hints"][0].replace('format="chat"', "--format chat")]
    assert show(path, tokenizer="demo", seq_length=64) == 1
    assert "  hint: 20 of 20 lines skip with missing_field" in capsys.readouterr().out
    fixed = inspect_jsonl(path, tokenizer="demo", format="chat", seq_length=64)
    assert fixed["usable"] == 20 and fixed["hints"] == []


def test_hint_prompt_completion_records_with_format_chat_and_renamed_fields(tmp_path):
    path = _write(tmp_path / "pc.jsonl", [GOOD] * 6)
    report = inspect_jsonl(path, tokenizer="demo", format="chat", seq_length=64)
    assert report["hints"] == [
        "6 of 6 lines skip with bad_conversation: the records have the fields 'prompt', "
        "'completion'; they are prompt/completion records: use format=\"prompt_completion\""
    ]
    path = _write(tmp_path / "qa.jsonl", [{"question": "Hi there", "answer": "Hello!"}] * 5 + [GOOD])
    report = inspect_jsonl(path, tokenizer="demo", seq_length=64)
    assert report["hints"] == [
        "5 of 6 lines skip with missing_field: the records have the fields 'question', 'answer', "
        "'prompt', 'completion', not the prompt field 'prompt' and completion field 'completion': "
        'name yours with prompt_field= / completion_field=, or use format="chat" for chat turns'
    ]
    assert inspect_jsonl(path, tokenizer="demo", seq_length=64, names=HINT_NAMES)["hints"][0].endswith(
        "name yours with --prompt-field / --completion-field, or use --format chat for chat turns"
    )
    assert (
        inspect_jsonl(path, tokenizer="demo", seq_length=64, prompt_field="question", completion_field="answer")[
            "skips"
        ]["missing_field"]["count"]
        == 1
    )
    # a minority of broken lines gives no hint
    path = _write(tmp_path / "mostly_ok.jsonl", [GOOD] * 5 + [{"prompt": "x"}])
    assert inspect_jsonl(path, tokenizer="demo", seq_length=64)["hints"] == []


def test_width_below_most_samples_hint_and_no_misleading_baseline(tmp_path, capsys):
    long = {"prompt": "word " * 60, "completion": "answer " * 60}
    path = _write(tmp_path / "long.jsonl", [long] * 9 + [GOOD])
    report = inspect_jsonl(path, tokenizer="demo", seq_length=100)
    L = report["length"]
    assert report["packing"]["oversize"] == 9 and L["p50"] > 100
    assert report["baseline_concat"] is None  # was a 99.96%-style "fill" counting cut rows as full
    assert report["hints"] == [
        f"the width 100 is below 9 of 10 usable samples (median length {L['p50']:.0f}, p99 {L['p99']:.0f}): they are "
        "never packed, and the fill above covers only the 1 that fit. Use a width of at least the p99 length, better "
        f"several times the median (e.g. seq_length=2048)"
    ]
    assert inspect_jsonl(path, tokenizer="demo", seq_length=100, names=HINT_NAMES)["hints"][0].endswith(
        "(e.g. --seq-length 2048)"
    )
    assert show(path, tokenizer="demo", seq_length=100) == 0
    out = capsys.readouterr().out
    assert "baseline" not in out and "hint: the width 100 is below 9 of 10 usable samples" in out
    # a width that fits: baseline present, computed over the samples that fit, no hint
    ok = inspect_jsonl(path, tokenizer="demo", seq_length=1024)
    assert ok["hints"] == [] and ok["baseline_concat"]["fill"] <= 1.0 and ok["packing"]["oversize"] == 0


def test_baseline_counts_only_samples_that_fit(tmp_path):
    long = {"prompt": "word " * 60, "completion": "answer " * 60}
    path = _write(tmp_path / "mix.jsonl", [GOOD] * 8 + [long] * 2)
    report = inspect_jsonl(path, tokenizer="demo", seq_length=16)
    assert report["packing"]["oversize"] == 2 and report["hints"] == []
    # only the eight 7-token samples: MBS 2 fills 14 of 16 per row (a long sample would count as a full row)
    assert report["baseline_concat"]["mbs"] == 2 and report["baseline_concat"]["fill"] == 56 / 64


def test_the_old_width_keyword_still_works_and_warns(tmp_path):
    path = _write(tmp_path / "d.jsonl", [GOOD] * 3)
    with pytest.warns(DeprecationWarning, match="seq_length"):
        old = inspect_jsonl(path, tokenizer="demo", width=16)
    assert old["packing"] == inspect_jsonl(path, tokenizer="demo", seq_length=16)["packing"]
