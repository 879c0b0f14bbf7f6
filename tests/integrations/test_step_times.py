"""The step-time recorders: StepTimeCallback on a tiny transformers.Trainer run (CPU, packs from the real Energon loader
over shards written here) writes one line per optimizer step with the terms of the packs that step trained;
StepTimer in a plain loop and around a Bridge-style forward_step."""

import functools
import json

import pytest
import torch

from _hf_helpers import NO_IMPLICIT_PREPARE, tiny_model
from _hf_trainer_helpers import Recording, energon_loader, trainer_args, write_shards
from energon_pack.integrations import hf as H
from energon_pack.integrations.step_times import StepTimer
from energon_pack.packing.calibrate import pack_cost_terms, read_step_times, sum_terms
from energon_pack.qwen_vl import load_demo_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = NO_IMPLICIT_PREPARE


def hf_terms(pack):
    """The terms of a pack as HF's forward sees it (PackedCollator: the padded cu_seqlens as cu_seq_lens_q)."""
    return pack_cost_terms(
        {
            "input_ids": pack["input_ids"],
            "cu_seq_lens_q": pack["cu_seqlens_q_padded"],
            "image_grid_thw": pack.get("image_grid_thw"),
            "video_grid_thw": pack.get("video_grid_thw"),
        }
    )


def test_trainer_callback_records_each_optimizer_step_with_its_packs_terms(tmp_path):
    from energon_pack.integrations.step_times import StepTimeCallback

    (tmp_path / "shards").mkdir()
    shards = write_shards(tmp_path / "shards")
    model = H.prepare_model(tiny_model("qwen2.5-vl", load_demo_tokenizer()).train())
    collator = Recording(model)
    path = tmp_path / "steps.jsonl"
    hooks = dict(model._forward_pre_hooks)
    trainer = transformers.Trainer(
        model=model,
        args=trainer_args(tmp_path / "out", max_steps=2, gradient_accumulation_steps=2),
        train_dataset=H.PackedIterableDataset(energon_loader(shards, "qwen2.5-vl")),
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[StepTimeCallback(path)],
    )
    trainer.train()
    records, skipped = read_step_times(path)
    assert skipped == 0 and [r.step for r in records] == [0, 1] and all(r.seconds > 0 for r in records)
    packs = [p for _, p in zip(range(4), energon_loader(shards, "qwen2.5-vl"))]
    assert [list(p["__keys__"]) for p in packs] == collator.keys[:4]  # the packs the four micro-batches trained
    want = [sum_terms([hf_terms(a), hf_terms(b)]) for a, b in zip(packs[::2], packs[1::2])]
    assert [r.terms for r in records] == want
    assert [r.terms["micro_batches"] for r in records] == [2.0, 2.0]
    assert (
        sum(r.terms["images"] for r in records)
        == sum(len(p["image_grid_thw"]) for p in packs if p.get("image_grid_thw") is not None)
        > 0
    )
    assert model._forward_pre_hooks == hooks  # the callback's hook is gone after training


def test_step_timer_in_a_loop_and_around_a_bridge_forward_step(tmp_path):
    """``with timer.step(batch)`` per step; a Bridge-style ``forward_step(state, data_iterator, model)`` wrapped with
    2 micro-batches per iteration: a step closes when the next iteration starts, the last open one is not written."""
    packs = [
        {"input_ids": torch.zeros(1, 16), "cu_seqlens_q": torch.tensor([0, 4, 10]), "image_grid_thw": None},
        {
            "input_ids": torch.zeros(1, 16),
            "cu_seqlens_q": torch.tensor([0, 16]),
            "image_grid_thw": torch.tensor([[1, 2, 4]]),
        },
    ]
    loop = tmp_path / "loop.jsonl"
    with StepTimer(loop, device="cpu") as timer:
        for pack in packs:
            with timer.step(pack):
                sum(range(1000))
        with pytest.raises(RuntimeError), timer.step(packs[0]):
            raise RuntimeError("a failed step is no step time")
        timer.record([packs[0], packs[1]], 0.25)
    records, _ = read_step_times(loop)
    assert [r.step for r in records] == [0, 1, 2]
    assert [r.terms["tokens_squared"] for r in records] == [16.0 + 36, 256.0, 16.0 + 36 + 256]
    assert records[2].seconds == 0.25 and records[2].terms["micro_batches"] == 2.0 and records[1].terms["patches"] == 8

    calls = []

    def forward_step(state, data_iterator, model, return_schedule_plan=False):
        """Bridge's signature: draws one micro-batch from the iterator."""
        calls.append(next(data_iterator)["cu_seqlens_q"][-1].item())
        return None, None

    bridge = tmp_path / "bridge.jsonl"
    timer = StepTimer(bridge, device="cpu")
    wrapped = timer.wrap_forward_step(forward_step, micro_batches=2)
    assert wrapped.__name__ == "forward_step" and wrapped.__module__ == forward_step.__module__
    data = iter(packs * 3)
    for _ in range(3):  # three iterations of two micro-batches
        for _ in range(2):
            functools.partial(wrapped, "state")(data, "model")
    timer.close()
    assert calls == [10, 16] * 3
    lines = [json.loads(line) for line in bridge.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1] and [line["micro_batches"] for line in lines] == [2.0, 2.0]
    assert [line["slots"] for line in lines] == [32.0, 32.0] and all(line["seconds"] > 0 for line in lines)
    # Bridge's own timer instead: the wrapper only notes, end_step takes the seconds
    timer = StepTimer(tmp_path / "timers.jsonl", device="cpu")
    noting = timer.wrap_forward_step(forward_step, micro_batches=0)
    noting("state", iter(packs), "model")
    noting("state", data_iterator=iter(packs[1:]), model="model")
    timer.end_step(0.5)
    timer.close()
    (record,) = read_step_times(tmp_path / "timers.jsonl")[0]
    assert record.seconds == 0.5 and record.terms["slots"] == 32.0 and record.terms["segments"] == 3.0
