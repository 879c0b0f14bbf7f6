"""format="text": pretraining-style documents (``{"text": ...}``: LLaMA-Factory's c4_demo, TRL's text datasets)
train whole, each ending with EOS, in the in-batch packer (DataLoader workers), pack-offline and inspect."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader

from energon_pack.chat import load_tokenizer
from energon_pack.sft import JsonlSFTDataset, TokenBudgetBatchSampler, inspect_jsonl
from energon_pack.sft.collate import InBatchPacker
from energon_pack.sft.formats import TextFormat

TOK = load_tokenizer("demo")
DOCS = [f"document {i}: " + "words and more words " * (i % 7 + 1) for i in range(40)]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_document_is_its_tokens_then_eos_all_supervised():
    fmt = TextFormat(TOK)
    enc = fmt.encode({"text": "hello world"})
    eos = TOK.token_to_id("<|endoftext|>")
    assert enc.input_ids.tolist() == fmt.tokenizer.encode_text("hello world") + [eos] and enc.target_mask.all()
    for bad, reason in (({"txt": "x"}, "missing_field"), ({"text": "  "}, "empty_text"), ([1], "missing_field")):
        with pytest.raises(Exception) as err:
            fmt.encode(bad)
        assert err.value.reason == reason
    assert TextFormat(TOK, text_field="content").fingerprint() != fmt.fingerprint()


def test_documents_pack_with_eos_between_them_through_dataloader_workers(tmp_path):
    path = _write(tmp_path / "c4.jsonl", [{"text": d} for d in DOCS] + [{"text": ""}])
    ds = JsonlSFTDataset(path, TOK, format="text", max_length=128, cache_dir=tmp_path / "c")
    assert ds.skips == {"empty_text": 1}
    eos = TOK.token_to_id("<|endoftext|>")
    sampler = TokenBudgetBatchSampler(ds, 128, seed=0)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=InBatchPacker.for_dataset(ds, 128), num_workers=2)
    seen = []
    for batch in loader:
        cu = batch["cu_seqlens_q"].tolist()
        ids, labels, mask = batch["input_ids"][0], batch["labels"][0], batch["loss_mask"][0]
        for a, b in zip(cu, cu[1:]):
            assert ids[b - 1] == eos  # every document ends with EOS
            assert torch.equal(labels[a : b - 1], ids[a + 1 : b]) and mask[a : b - 1].all()  # all supervised
            assert labels[b - 1] == -100 and mask[b - 1] == 0  # nothing predicted across the boundary
        seen += batch["__keys__"]
    assert sorted(seen) == list(range(1, 41))


def test_pack_offline_and_inspect_take_text(tmp_path):
    pytest.importorskip("pyarrow")
    from energon_pack.sft.pack_offline import pack_offline

    path = _write(tmp_path / "c4.jsonl", [{"text": d} for d in DOCS])
    s = pack_offline(path, tmp_path / "packs", seq_length=256, tokenizer=TOK, format="text", cache_dir=tmp_path / "c")
    assert s.samples == 40 and s.skips == {}
    assert json.loads((tmp_path / "packs" / "256_metadata.jsonl").read_text())[0]["energon_pack"]["format"] == "text"
    report = inspect_jsonl(path, tokenizer="demo", seq_length=256, cache_dir=tmp_path / "c")  # the default format
    assert 'format="text"' in " ".join(report["hints"])
    assert (
        inspect_jsonl(path, tokenizer="demo", format="text", seq_length=256, cache_dir=tmp_path / "c")["usable"] == 40
    )
