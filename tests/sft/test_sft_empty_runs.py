"""GPT-SFT Python loader (issue 21, item 3): an empty run is an AllSkippedError, and every batch
carries the dataset's skips. Real JSONL files through a real torch DataLoader with worker processes."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from torch.utils.data import DataLoader

from energon_pack.errors import AllSkippedError
from energon_pack.sft import InBatchPacker, JsonlSFTDataset, TokenBudgetBatchSampler

WIDTH = 128


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _loader(ds, sampler, workers=0):
    return DataLoader(
        ds, batch_sampler=sampler, num_workers=workers, collate_fn=InBatchPacker.for_dataset(ds, WIDTH, sampler=sampler)
    )


def test_wrong_field_names_raise_all_skipped_naming_reason_count_example_and_fix(tmp_path):
    path = _write(tmp_path / "qa.jsonl", [{"question": f"q{i}", "answer": "a"} for i in range(999)])
    ds = JsonlSFTDataset(path, "demo", max_length=WIDTH, cache_dir=tmp_path)
    assert ds.skips == {"missing_field": 999}
    with pytest.raises(AllSkippedError) as err:  # before a DataLoader could yield zero batches
        TokenBudgetBatchSampler(ds, WIDTH)
    msg = str(err.value)
    assert f"over {path}: all 999 lines were skipped" in msg
    assert "skips by reason: missing_field: 999." in msg
    assert "Example (missing_field): line 1: no 'prompt' field (has ['answer', 'question'])." in msg
    assert (
        "format='prompt_completion' (it reads 'prompt' / 'completion': rename with prompt_field= / completion_field=)"
        in msg
    )
    assert f"energon-pack inspect {path}" in msg
    # a bare lengths array (what inspect plans with) still answers plan()/stats; len() and iter() raise
    bare = TokenBudgetBatchSampler(ds.lengths, WIDTH)
    assert bare.plan() == [] and bare.stats.skips == {"unusable": 999}
    loader = DataLoader(ds, batch_sampler=bare, collate_fn=InBatchPacker.for_dataset(ds, WIDTH))
    for attempt in (lambda: len(loader), lambda: list(loader)):
        with pytest.raises(AllSkippedError, match=r"all 999 lines were skipped.*unusable: 999"):
            attempt()
    # renaming the fields is the fix
    fixed = JsonlSFTDataset(
        path, "demo", max_length=WIDTH, cache_dir=tmp_path, prompt_field="question", completion_field="answer"
    )
    assert sum(len(b) for b in TokenBudgetBatchSampler(fixed, WIDTH)) == 999


def test_prompt_completion_records_read_as_chat_name_the_chat_format(tmp_path):
    path = _write(tmp_path / "pc.jsonl", [{"prompt": "q", "completion": "a"}] * 5)
    ds = JsonlSFTDataset(path, "demo", format="chat", cache_dir=tmp_path)
    with pytest.raises(
        AllSkippedError,
        match=r"bad_conversation: 5\. Example \(bad_conversation\): line 1: .*"
        r"Likely fix: the records may not match format='chat': .*one of \(",
    ):
        TokenBudgetBatchSampler(ds, WIDTH)


@pytest.mark.parametrize("max_length", [None, WIDTH])
def test_every_line_too_long_names_the_width(tmp_path, max_length):
    path = _write(tmp_path / "long.jsonl", [{"prompt": "word " * 400, "completion": "a"}] * 4)
    ds = JsonlSFTDataset(path, "demo", max_length=max_length, cache_dir=tmp_path)
    reason = "oversize" if max_length is None else "too_long"
    with pytest.raises(
        AllSkippedError,
        match=rf"{reason}: 4\. Example \({reason}\): line 1: .*"
        rf"Likely fix: the width \({WIDTH}\) or the dataset's max_length may be too small",
    ):
        TokenBudgetBatchSampler(ds, WIDTH)


def _mixed_file(path):
    records = []
    for i in range(120):
        kind = i % 10
        if kind == 3:
            records.append({"instruction": "wrong fields"})  # missing_field
        elif kind == 5:
            records.append("{broken")  # invalid_json
        elif kind == 7:
            records.append({"prompt": "long " * 300, "completion": "x"})  # too_long / oversize
        elif kind == 9 and i < 50:
            records.append({"prompt": "q", "completion": "  "})  # empty completion
        else:
            records.append({"prompt": f"question {i} " * (1 + i % 4), "completion": f"answer {i}"})
    return _write(path, records)


@pytest.mark.parametrize("ranks", [1, 2])
def test_mixed_file_batches_carry_the_dataset_skips_and_valid_plus_skipped_is_total(tmp_path, ranks):
    path = _mixed_file(tmp_path / "mixed.jsonl")
    ds = JsonlSFTDataset(path, "demo", max_length=WIDTH, cache_dir=tmp_path)
    total = len(ds)
    assert total == 120 and set(ds.skips) == {"missing_field", "invalid_json", "too_long", "empty_completion"}
    delivered = 0
    for rank in range(ranks):
        sampler = TokenBudgetBatchSampler(ds, WIDTH, cp=2, num_replicas=ranks, rank=rank)
        assert sampler.stats.skips == ds.skips
        assert sampler.stats.samples + sampler.stats.skipped == total
        batches = list(_loader(ds, sampler, workers=2))
        assert batches
        for batch in batches:
            stats = batch["packing_stats"]
            assert Counter(dict(stats["skips"])) == ds.skips  # exactly the dataset's, in every batch
            assert stats["samples"] + sum(n for _, n in stats["skips"]) == total
            delivered += batch["num_segments"] - batch["padding_segments"]
    assert delivered + sum(ds.skips.values()) == total  # each valid line once over all ranks
    # without the sampler the batches still carry the dataset's skips
    row = InBatchPacker.for_dataset(ds, WIDTH)([ds[i] for i in TokenBudgetBatchSampler(ds, WIDTH).plan()[0]])
    assert Counter(dict(row["packing_stats"]["skips"])) == ds.skips


def test_lines_wider_than_the_width_are_counted_beside_the_dataset_skips(tmp_path):
    path = _mixed_file(tmp_path / "mixed.jsonl")
    ds = JsonlSFTDataset(path, "demo", cache_dir=tmp_path)  # no max_length: the sampler finds the long lines
    sampler = TokenBudgetBatchSampler(ds, WIDTH)
    assert "too_long" not in ds.skips and sampler.stats.skips == ds.skips + Counter(oversize=12)
    assert sampler.stats.samples + sampler.stats.skipped == len(ds)
    bare = TokenBudgetBatchSampler(ds.lengths, WIDTH)  # a bare lengths array: unnamed skips still count
    assert bare.stats.skips == Counter(unusable=sum(ds.skips.values()), oversize=12)
