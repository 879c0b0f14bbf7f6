"""NeMo / Megatron-Bridge GPT-SFT records (``{"input", "output"}``) train without flags, exactly as the same text
under our ``prompt``/``completion`` names; explicit field names always win; a file with neither pair is skipped
naming the default fields."""

from __future__ import annotations

import json

import numpy as np
import pytest

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


def test_a_json_array_is_refused_with_the_fix(tmp_path):
    """A JSON array read as lines would be all invalid_json skips: one error naming JSONL and the one-liner."""
    from energon_pack.errors import ConfigError

    records = [{"prompt": p, "completion": c} for p, c in PAIRS]
    array = tmp_path / "data.json"
    array.write_text(json.dumps(records, indent=1))
    for build in (
        lambda: JsonlSFTDataset(array, "demo", cache_dir=tmp_path / "c"),
        lambda: inspect_jsonl(array, tokenizer="demo", seq_length=256, cache_dir=tmp_path / "c"),
    ):
        with pytest.raises(ConfigError) as err:
            build()
        assert err.value.knob == "path" and "is one JSON array; GPT-SFT data is JSONL" in str(err.value)
    fix = str(err.value).split("Fix: write it as JSONL: ")[1].replace(" > data.jsonl", "")
    import shlex
    import subprocess
    import sys

    out = subprocess.run([sys.executable if a == "python" else a for a in shlex.split(fix)], capture_output=True)
    (tmp_path / "data.jsonl").write_bytes(out.stdout)
    assert len(JsonlSFTDataset(tmp_path / "data.jsonl", "demo", cache_dir=tmp_path / "c")) == 20
