"""One overlength policy under every balance mode and road (issue 45): ``"error"`` raises naming ``overlength``,
the default ``"skip"`` counts the sample. Under the default ``balance="compute"`` (and in rounds mode) "error" was
a silent counted skip, because the compute-balanced packer never saw the policy."""

import json

import pytest
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
from energon_pack.integrations.bridge_sft import build_sft_pack_dataset
from energon_pack.packing import ComputeBalancedPacker, OnlinePacker, OversizeError

LINES, LONG, WIDTH = 12, 5, 256
ROADS = [("carry", "tokens"), ("carry", "compute"), ("rounds", "tokens")]


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    """12 prompt/completion lines (a prepared Energon dataset); line 5 is ~1800 tokens, over the width."""
    path = tmp_path_factory.mktemp("overlength") / "sft.jsonl"
    with open(path, "w") as f:
        for i in range(LINES):
            completion = " long" * 600 if i == LONG else " it is yes" * (i + 1)
            f.write(json.dumps({"prompt": f"{i}: q", "completion": completion}) + "\n")
    assert prepare_jsonl(path) == LINES
    return path


def _batches(path, mode, balance, workers=0, **kw):
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=WIDTH, packing_mode=mode, balance=balance, **kw)
    ds = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=4,
        repeat=False,
    )
    return list(get_loader(ds))


@pytest.mark.parametrize("mode,balance", ROADS)
def test_energon_overlength_error_raises_naming_the_knob_and_the_sample(jsonl, mode, balance):
    with pytest.raises(ValueError, match=r"overlength: sample '5' needs \[1805\] of the pack's budgets \[256\]"):
        _batches(jsonl, mode, balance, overlength="error")


@pytest.mark.parametrize("mode,balance", ROADS)
def test_energon_overlength_default_skips_with_a_count(jsonl, mode, balance):
    batches = _batches(jsonl, mode, balance)
    keys = sorted((k for b in batches for k in b["__keys__"]), key=int)
    assert keys == [str(i) for i in range(LINES) if i != LONG]
    assert dict(batches[-1]["packing_stats"]["skips"]) == {"oversize": 1}


def test_energon_overlength_error_crosses_worker_processes(jsonl):
    """With a worker process the DataLoader re-raises it (as its RuntimeError); the message still names the knob."""
    with pytest.raises(Exception, match=r"overlength: sample '5' needs \[1805\]"):
        _batches(jsonl, "carry", "compute", workers=1, overlength="error")


@pytest.mark.parametrize("balance", ["tokens", "compute"])
def test_gpt_sft_road_overlength_error_and_skip_under_both_balances(tmp_path, jsonl, balance):
    with pytest.raises(ValueError, match=r"line 6 has 1805 tokens > max_length 256 \(overlength='error'; use 'skip'"):
        build_sft_pack_dataset(
            str(jsonl), "demo", seq_length=WIDTH, overlength="error", balance=balance, cache_dir=str(tmp_path)
        )
    packs = build_sft_pack_dataset(str(jsonl), "demo", seq_length=WIDTH, balance=balance, cache_dir=str(tmp_path))
    planned = sorted(i for p in packs.sampler.plan() for i in p)
    assert planned == [i for i in range(LINES) if i != LONG]
    assert dict(packs.sampler.skips) == {"too_long": 1}  # the dataset's reason: over max_length


@pytest.mark.parametrize("packer_class,step_cost", [(OnlinePacker, ()), (ComputeBalancedPacker, (1.0,))])
def test_both_streaming_packers_take_the_same_oversize_policy(packer_class, step_cost):
    with pytest.raises(OversizeError, match=r"item 'x' with cost \[11\] exceeds capacity \[10\]"):
        packer_class(10, on_oversize="error").push("x", 11, *step_cost)
    packer = packer_class(10)
    assert packer.push("x", 11, *step_cost) == []
    assert packer.pop_skipped() == [("x", "oversize")]
    assert dict(packer.stats.skips) == {"oversize": 1}
    with pytest.raises(ValueError, match="on_oversize must be 'skip' or 'error', got 'drop'"):
        packer_class(10, on_oversize="drop")
