"""The ``inspect`` report: counts, percentiles, skips with first lines, packer fill vs the concat baseline."""

import json

import numpy as np

from energon_pack.sft.inspect import best_baseline, concat_baseline, inspect_jsonl, main

GOOD = {"prompt": "Hi there", "completion": "Hello!"}  # 7 tokens with the demo tokenizer


def test_report_exact_counts_and_fill(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps(GOOD)] * 8 + ["{bad", "", json.dumps({"prompt": "x"})]) + "\n")
    report = inspect_jsonl(path, width=16)
    assert (report["lines"], report["usable"], report["tokens"]) == (11, 8, 56)
    assert report["skips"] == {"empty_line": {"count": 1, "first_lines": [10]},
                               "invalid_json": {"count": 1, "first_lines": [9]},
                               "missing_field": {"count": 1, "first_lines": [11]}}
    assert report["length"]["p50"] == 7.0 and report["length"]["max"] == 7
    assert report["packing"]["packs"] == 4 and report["packing"]["fill"] == 56 / 64  # two 7-token samples per 16
    assert report["baseline_concat"]["mbs"] == 2 and report["baseline_concat"]["fill"] == 56 / 64
    assert main(path, width=16, json_out=tmp_path / "r.json") == 0
    assert "invalid_json" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["usable"] == 8


def test_concat_baseline_counts_overflow():
    lengths = np.array([3, 5, 7, 9])
    assert concat_baseline(lengths, 10, 2, seed=0)["rows"] == 2
    assert concat_baseline(lengths, 10, 4)["overflow_rate"] == 1.0 and concat_baseline(lengths, 10, 4)["fill"] == 1.0
    assert best_baseline(np.full(100, 30), 100)["mbs"] == 3
