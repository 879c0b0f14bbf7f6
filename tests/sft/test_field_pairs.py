"""NeMo / Megatron-Bridge GPT-SFT records (``{"input", "output"}``) train without flags, exactly as the same text
under our ``prompt``/``completion`` names; explicit field names always win; a file with neither pair is skipped
naming the default fields."""

from __future__ import annotations

import json

import numpy as np

from energon_pack.sft import JsonlSFTDataset, inspect_jsonl
from energon_pack.sft.dataset import field_pair


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


PAIRS = [(f"question {i}?", "answer " * (i % 5 + 1)) for i in range(20)]


def _tokens(ds):
    return [(e.input_ids.tolist(), e.target_mask.tolist()) for e in (ds.encode_line(i) for i in range(len(ds)))]


def test_input_output_records_train_like_prompt_completion(tmp_path):
    ours = _write(tmp_path / "ours.jsonl", [{"prompt": p, "completion": c} for p, c in PAIRS])
    nemo = _write(tmp_path / "nemo.jsonl", [{"input": p, "output": c} for p, c in PAIRS])
    a = JsonlSFTDataset(ours, "demo", cache_dir=tmp_path / "c")
    b = JsonlSFTDataset(nemo, "demo", cache_dir=tmp_path / "c")
    assert (b.format.prompt_field, b.format.completion_field) == ("input", "output")
    assert _tokens(a) == _tokens(b) and len(b) == 20
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert b.skips == {}
    report = inspect_jsonl(nemo, tokenizer="demo", seq_length=256, cache_dir=tmp_path / "c")
    assert report["usable"] == 20 and report["skips"] == {}


def test_explicit_fields_win_and_ours_come_first(tmp_path):
    both = _write(tmp_path / "both.jsonl", [{"prompt": "p", "completion": "c", "input": "i", "output": "o"}])
    assert field_pair(JsonlSFTDataset(both, "demo", cache_dir=tmp_path / "c").index) == ("prompt", "completion")
    ds = JsonlSFTDataset(both, "demo", cache_dir=tmp_path / "c", prompt_field="input", completion_field="output")
    assert ds.format.prompt_field == "input"
    neither = _write(tmp_path / "neither.jsonl", [{"question": "q", "answer": "a"}] * 3)
    ds = JsonlSFTDataset(neither, "demo", cache_dir=tmp_path / "c")
    assert ds.skips == {"missing_field": 3} and "no 'prompt' field" in ds.skip_example("missing_field")
    assert "'prompt' / 'completion'" in ds.mismatch_hint()
