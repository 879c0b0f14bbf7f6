"""GPT-SFT JSONL through Energon (prepared .jsonl) packed by the carry-over wrapper, with worker processes."""

import json

import numpy as np
import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_savable_loader, get_train_dataset

from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.sft import JsonlSFTDataset

BAD = {
    7: ('{"prompt": }', "invalid_json"),
    19: ('{"question": "no prompt field"}', "missing_field"),
    23: ('{"prompt": "p", "completion": "   "}', "empty_completion"),
    31: (json.dumps({"prompt": "tell a long story", "completion": " long" * 600}), "oversize"),
}
LINES = 60


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("jsonl") / "sft.jsonl"
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for i in range(LINES):
            if i in BAD:
                f.write(BAD[i][0] + "\n")
                continue
            prompt = " ".join(["what", "is", "the", "answer"] * int(rng.integers(1, 12)))
            f.write(
                json.dumps({"prompt": f"{i}: {prompt}", "completion": " it is " + "yes " * int(rng.integers(1, 30))})
                + "\n"
            )
    assert prepare_jsonl(path) == LINES
    return path


def dataset(path, te, workers=0, buffer=8, repeat=False):
    return get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=buffer,
        repeat=repeat,
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_max_segments_is_a_packing_budget_so_static_cu_seqlens_always_fit(jsonl, workers):
    """Without the budget a pack of more short samples than max_segments failed in build_thd_batch."""
    te = TextPackingTaskEncoder(
        tokenizer="demo", seq_length=512, max_segments=3, pad_to_max_length=True, pad_cu_seqlens=True
    )
    batches = list(get_loader(dataset(jsonl, te, workers=workers)))
    keys = [k for b in batches for k in b["__keys__"]]
    assert sorted(keys, key=int) == [str(i) for i in range(LINES) if i not in BAD]
    assert {len(b["__keys__"]) for b in batches} <= {1, 2, 3} and max(len(b["__keys__"]) for b in batches) == 3
    assert {tuple(b["cu_seqlens_q"].shape) for b in batches} == {(4,)}


@pytest.mark.parametrize("workers", [0, 2])
def test_every_valid_line_once_and_bad_lines_counted(jsonl, workers):
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=512)
    batches = list(get_loader(dataset(jsonl, te, workers=workers)))
    keys = [k for b in batches for k in b["__keys__"]]
    assert sorted(keys, key=int) == [str(i) for i in range(LINES) if i not in BAD]
    skips = {}
    for b in batches:  # the last stats of each worker
        skips[(b["packing_stats"]["rank"], b["packing_stats"]["worker"])] = dict(b["packing_stats"]["skips"])
    total = {}
    for per_worker in skips.values():
        for reason, n in per_worker.items():
            total[reason] = total.get(reason, 0) + n
    assert total == {reason: 1 for _, reason in BAD.values()}
    for b in batches:
        assert b["input_ids"].shape[1] <= 512
        assert float(b["loss_mask"][b["padding_mask"]].sum()) == 0


def test_segments_equal_the_jsonl_dataset_encoding(jsonl):
    """The Energon path and the mmap JSONL path tokenize a line identically."""
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=512)
    ref = JsonlSFTDataset(jsonl, load_demo_tokenizer(), format="prompt_completion")
    batch = next(iter(get_loader(dataset(jsonl, te))))
    cu = batch["cu_seqlens_q"].tolist()
    for n, key in enumerate(batch["__keys__"]):
        enc = ref[int(key)]
        seg = batch["input_ids"][0, cu[n] : cu[n + 1]]
        assert torch.equal(seg, torch.from_numpy(enc.input_ids))
        labels = batch["labels"][0, cu[n] : cu[n + 1]]
        # label i is token i+1 exactly where token i+1 is supervised; the last label is -100
        want = np.where(enc.target_mask[1:], enc.input_ids[1:], -100).tolist() + [-100]
        assert labels.tolist() == want


def test_truncate_policy_keeps_long_lines(jsonl):
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=512, overlength="truncate")
    batches = list(get_loader(dataset(jsonl, te)))
    keys = [k for b in batches for k in b["__keys__"]]
    assert "31" in keys
    b = next(b for b in batches if "31" in b["__keys__"])
    assert b["num_segments"] == 1 and b["real_tokens"] == 512


def test_resume_is_exact(jsonl):
    def make():
        return get_savable_loader(
            dataset(jsonl, TextPackingTaskEncoder(tokenizer="demo", seq_length=256), workers=2, repeat=True),
            checkpoint_every_min_n_samples=1,
            checkpoint_every_sec=0,
        )

    loader = make()
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.save_state_rank()
    ref = [next(it) for _ in range(6)]
    restored = make()
    restored.restore_state_rank(state)
    rit = iter(restored)
    for expected in ref:
        got = next(rit)
        assert got["__keys__"] == expected["__keys__"]
        assert torch.equal(got["input_ids"], expected["input_ids"]) and torch.equal(got["labels"], expected["labels"])
