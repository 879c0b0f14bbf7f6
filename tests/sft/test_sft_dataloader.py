"""End to end: JsonlSFTDataset + TokenBudgetBatchSampler + InBatchPacker in a torch DataLoader with 2 workers."""

import json
import random

import pytest
import torch
from torch.utils.data import DataLoader

from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.sft.collate import InBatchPacker
from energon_pack.sft.dataset import JsonlSFTDataset
from energon_pack.sft.sampler import TokenBudgetBatchSampler

TOK = load_demo_tokenizer()
SEQ_LENGTH = 128


def write_mixed_chat_file(path, n=120):
    rng = random.Random(0)
    words = "the cat sat on a mat and then it ran far away from home".split()
    lines = []
    for i in range(n):
        say = lambda k: " ".join(rng.choice(words) for _ in range(k))  # noqa: E731
        if i % 17 == 5:
            lines.append("{broken")
        elif i % 2:
            lines.append(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": say(rng.randint(1, 12))},
                            {"role": "assistant", "content": say(rng.randint(1, 20))},
                        ]
                    }
                )
            )
        else:
            lines.append(
                json.dumps(
                    {
                        "conversations": [
                            {"from": "human", "value": say(rng.randint(1, 12))},
                            {"from": "gpt", "value": say(rng.randint(1, 30))},
                        ]
                    }
                )
            )
    path.write_text("\n".join(lines) + "\n")


def test_dataloader_two_workers_two_ranks_end_to_end(tmp_path):
    path = tmp_path / "chat.jsonl"
    write_mixed_chat_file(path)
    ds = JsonlSFTDataset(path, TOK, format="chat", max_length=SEQ_LENGTH)
    assert ds.skips == {"invalid_json": 7}
    collate = InBatchPacker.for_dataset(ds, SEQ_LENGTH, cp=2, pad_to_max_length=True)
    seen, steps = [], []
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(ds, SEQ_LENGTH, cp=2, num_replicas=2, rank=rank, seed=1)
        sampler.set_epoch(1)
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=2)
        batches = list(loader)
        steps.append(len(batches))
        expected_order = [mb for mb in sampler]
        for batch, mb in zip(batches, expected_order):
            assert batch["input_ids"].shape == (1, SEQ_LENGTH) and batch["labels"].shape == (1, SEQ_LENGTH)
            if batch["padding_segments"]:
                assert batch["loss_mask"].sum() == 0 and batch["real_tokens"] == 0
                continue
            keys = batch["__keys__"]
            assert keys == [i + 1 for i in mb]  # the collated row holds exactly the sampled lines, in order
            seen.extend(keys)
            cu = batch["cu_seqlens_q"].tolist()
            assert [b - a for a, b in zip(cu, cu[1:])] == [int(ds.lengths[k - 1]) for k in keys]
            # labels are the next token inside a segment wherever the loss mask is on
            on = batch["loss_mask"][0].bool()
            nxt = torch.roll(batch["input_ids"][0], -1)
            assert torch.equal(batch["labels"][0][on], nxt[on]) and (batch["labels"][0][~on] == -100).all()
    assert steps[0] == steps[1]
    good_lines = [i + 1 for i in range(len(ds)) if ds.lengths[i] > 0]
    assert sorted(seen) == good_lines  # each usable line exactly once over both ranks


def test_for_dataset_old_name_width_still_works_and_warns(tmp_path):
    path = tmp_path / "chat.jsonl"
    write_mixed_chat_file(path, n=20)
    ds = JsonlSFTDataset(path, TOK, format="chat", max_length=SEQ_LENGTH)
    with pytest.warns(DeprecationWarning, match=r"InBatchPacker\.for_dataset: 'width' is deprecated, use 'seq_length'"):
        old = InBatchPacker.for_dataset(ds, width=SEQ_LENGTH, cp=2)
    assert old.layout == InBatchPacker.for_dataset(ds, seq_length=SEQ_LENGTH, cp=2).layout
    assert old.layout.seq_length == SEQ_LENGTH and old.layout.pad_token_id == ds.pad_token_id
