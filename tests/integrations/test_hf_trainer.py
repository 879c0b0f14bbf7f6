"""transformers.Trainer (and trl.SFTTrainer) on our packs: PackedIterableDataset, PackedCollator, EnergonStateCallback.

Packs come from the real Energon savable loader over WebDataset shards written here (text and image samples);
tiny random Qwen-VL models (fp32, no downloads) train on the CPU. The Trainer's loss and gradients are compared with
our own step (packed_forward + packed_loss, normalised over the step's supervised tokens); a run stopped at a
checkpoint and resumed trains the same packs (``__keys__``) as an uninterrupted one.
"""

import copy

import pytest
import torch
from megatron.energon import WorkerConfig

from _hf_helpers import NO_IMPLICIT_PREPARE, small_preset, tiny_model
from _hf_trainer_helpers import (
    Grads,
    Recording,
    energon_loader,
    our_step,
    sft_loader,
    tiny_text_model,
    trainer_args,
    write_jsonl,
    write_shards,
)
from energon_pack.energon.plan import plan_epoch
from energon_pack.errors import ConfigError
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = NO_IMPLICIT_PREPARE


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """24 samples: every third with an image, answers of 2-12 words."""
    return write_shards(tmp_path_factory.mktemp("trainer_shards"))


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("trainer_jsonl") / "train.jsonl")


def _loader(root, name, *, workers=0):
    return energon_loader(root, name, workers=workers)


def _args(tmp_path, **kw):
    return trainer_args(tmp_path, **kw)


@pytest.mark.parametrize(
    ("name", "accumulate"),
    [("qwen2-vl", 1), ("qwen2.5-vl", 1), ("qwen2.5-vl", 2), ("qwen3-vl", 1), ("text", 2)],
)
def test_a_trainer_step_is_our_step(shards, jsonl, name, accumulate, tmp_path):
    """Trainer + PackedCollator: the same loss and gradients as our step on the same packs, with gradient
    accumulation normalised over the supervised tokens of both packs (num_items_in_batch). "text": a text-only Qwen2
    on the GPT-SFT JSONL road's packs."""
    tok = load_demo_tokenizer()
    if name == "text":
        model, packs_from = tiny_text_model(tok), lambda: sft_loader(jsonl)[0]
    else:
        model, packs_from = tiny_model(name, tok), lambda: _loader(shards, name)
    model = H.prepare_model(model.train())
    ours = copy.deepcopy(model)
    dataset = H.PackedIterableDataset(packs_from())
    collator = Recording(model)
    grads = Grads()
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, gradient_accumulation_steps=accumulate),
        train_dataset=dataset,
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[grads, H.PackedDataCallback()],
    )
    result = trainer.train()
    packs = list(zip(range(accumulate), packs_from()))
    assert [list(p["__keys__"]) for _, p in packs] == collator.keys[:accumulate]
    assert sum(p["num_segments"] for _, p in packs) > accumulate  # packed rows, not single samples
    loss, want = our_step(ours, [p for _, p in packs])
    assert result.training_loss == pytest.approx(loss, rel=1e-5)
    assert sorted(grads.grads) == sorted(want)
    for key, grad in want.items():
        torch.testing.assert_close(grads.grads[key], grad, rtol=1e-4, atol=1e-6, msg=key)


def test_trainer_labels_are_ours_one_position_later():
    batch = {
        "labels": torch.tensor([[5, 6, -100, 8, 9, -100]]),
        "loss_mask": torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0]]),
    }
    assert H.trainer_labels(batch).tolist() == [[-100, -100, 6, -100, 8, 9]]
    with pytest.raises(ConfigError, match="loss_mask.*other than 0 and 1"):
        H.trainer_labels({**batch, "loss_mask": batch["loss_mask"] * 0.5})
    with pytest.raises(ConfigError, match="labels.*last position is supervised"):
        H.trainer_labels({"labels": torch.tensor([[5, 6]]), "loss_mask": torch.tensor([[0.0, 1.0]])})


def test_the_collator_refuses_batches_of_packs_and_dropped_columns(shards):
    collator = H.PackedCollator(tiny_model("qwen2.5-vl", load_demo_tokenizer()))
    pack = next(iter(_loader(shards, "qwen2.5-vl")))
    with pytest.raises(
        ConfigError, match="per_device_train_batch_size.*got 2 packs.*set per_device_train_batch_size=1"
    ):
        collator([pack, pack])
    with pytest.raises(ConfigError, match="remove_unused_columns.*set remove_unused_columns=False"):
        collator([{"input_ids": pack["input_ids"]}])


def _train(shards, out, steps, *, workers=0, save_steps=None, resume=None):
    """The ``__keys__`` of the packs a Trainer run trained on (2 packs per step: gradient accumulation 2)."""
    model = H.prepare_model(tiny_model("qwen2.5-vl", load_demo_tokenizer()).train())
    dataset = H.PackedIterableDataset(_loader(shards, "qwen2.5-vl", workers=workers))
    collator = Recording(model)
    save = dict(save_strategy="steps", save_steps=save_steps) if save_steps else {}
    trainer = transformers.Trainer(
        model=model,
        args=_args(out, max_steps=steps, gradient_accumulation_steps=2, **save),
        train_dataset=dataset,
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[H.EnergonStateCallback(dataset)],
    )
    trainer.train(resume_from_checkpoint=resume)
    return collator.keys


@pytest.mark.parametrize("workers", [0, 1])
def test_a_resumed_run_trains_the_packs_of_an_uninterrupted_one(shards, tmp_path, workers):
    """Stopped after step 2 (checkpoint-2 holds the Energon state of the 4 packs trained, not of the one read
    ahead) and resumed: steps 3-4 train the packs of steps 3-4 of an uninterrupted run."""
    full = _train(shards, tmp_path / "full", 4, workers=workers)
    first = _train(shards, tmp_path / "run", 2, workers=workers, save_steps=2)
    state = tmp_path / "run" / "checkpoint-2" / "energon_loader_state_rank0.pt"
    assert state.is_file()
    resumed = _train(shards, tmp_path / "run", 4, workers=workers, resume=str(tmp_path / "run" / "checkpoint-2"))
    assert len(full) == 9 and len(first) == 5 and len(resumed) == 5  # each run reads one pack ahead
    assert first[:4] == full[:4]
    assert resumed[:4] == full[4:8]
    assert len({tuple(k) for k in full[:8]}) == 8


@pytest.mark.parametrize(
    ("knob", "value", "why"),
    [
        ("accelerator_config", {"dispatch_batches": None}, "dispatch slices every tensor of a pack"),
        ("remove_unused_columns", True, "drop the pack's keys"),
        ("dataloader_num_workers", 1, "replay the whole Energon stream"),
    ],
)
def test_arguments_that_break_packs_are_refused_by_name(tmp_path, knob, value, why):
    H.check_trainer_args(_args(tmp_path))
    with pytest.raises(ConfigError, match=f"{knob}.*{why}.*TRAINER_SETTINGS"):
        H.check_trainer_args(_args(tmp_path, **{knob: value}))


def test_arguments_without_max_steps_are_refused_naming_it_and_the_plan(shards, tmp_path):
    """An Energon stream of packs has no length: check_trainer_args (PackedDataCallback at init) says to set
    max_steps and where it comes from, the Energon epoch plan (transformers 5.x's Trainer refuses it at
    construction too, without saying what to set it to)."""
    with pytest.raises(ConfigError, match=r"max_steps.*is -1.*set max_steps=.*plan_epoch\(.*\)\.max_steps\(epochs="):
        H.check_trainer_args(_args(tmp_path, max_steps=-1), H.PackedIterableDataset(_loader(shards, "qwen2.5-vl")))
    H.check_trainer_args(_args(tmp_path, max_steps=-1))  # no dataset named: the Trainer's own check stands


def test_the_gpt_sft_plan_gives_the_trainer_its_steps_per_epoch(jsonl, tmp_path):
    """On the GPT-SFT road the dataset has the plan's length: num_train_epochs=2 with gradient accumulation 4 over 6
    packs is 2 x (4 + 2) packs in 4 steps (the last step of each epoch takes what the epoch has left), each epoch
    the plan's packs once; steps_per_epoch says the same."""
    loader, sampler = sft_loader(jsonl)
    plan = [[int(i) + 1 for i in pack] for pack in sampler.plan()]
    assert len(plan) == len(sampler) == 6 and H.steps_per_epoch(sampler, 4) == 2
    model = H.prepare_model(tiny_text_model(load_demo_tokenizer()).train())
    collator = Recording(model)
    dataset = H.PackedIterableDataset(loader)
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, max_steps=-1, num_train_epochs=2, gradient_accumulation_steps=4),
        train_dataset=dataset,
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[H.PackedDataCallback(dataset)],
    )
    assert trainer.train().global_step == 4
    assert collator.keys == plan + plan
    with pytest.raises(ConfigError, match="gradient_accumulation_steps.*int >= 1"):
        H.steps_per_epoch(sampler, 0)


def test_the_lm_head_projects_the_supervised_positions_only(shards):
    """PackedCollator's logits_to_keep: logits for the positions that predict a supervised token, no T x vocab."""
    model = H.prepare_model(tiny_model("qwen2.5-vl", load_demo_tokenizer()))
    pack = next(iter(_loader(shards, "qwen2.5-vl")))
    kwargs = H.PackedCollator(model)([pack])
    labels = kwargs.pop("labels")
    logits = model(**kwargs).logits
    supervised = int(pack["loss_mask"].sum())
    assert logits.reshape(-1, logits.shape[-1]).shape == (supervised, 776) and supervised < pack["input_ids"].shape[1]
    full = model(**{k: v for k, v in kwargs.items() if k != "logits_to_keep"}).logits
    assert full.shape[1] == pack["input_ids"].shape[1]
    torch.testing.assert_close(
        H.packed_trainer_loss({"logits": logits}, labels), H.packed_trainer_loss({"logits": full}, labels)
    )
    with pytest.raises(ConfigError, match="logits_to_keep.*shape"):
        H.packed_trainer_loss({"logits": logits[..., 1:, :]}, labels)


def test_supervised_logits_cut_the_peak_memory_of_a_trainer_step():
    """A Trainer step on a 1,321-token pack (331 supervised) of a tiny Qwen2 with Qwen's 151,936-row vocabulary: the
    default logits_to_keep (supervised positions only) needs under half the host memory of the full T x vocab
    logits (measured 594 vs 2,297 MiB above the step's start; one process, lower peak first)."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "_hf_logits_memory.py"
    run = subprocess.run(
        [sys.executable, str(script), "supervised", "full"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = {r["mode"]: r for r in map(json.loads, re.findall(r"^\{\"mode\".*$", run.stdout, re.M))}
    assert got["full"]["tokens"] == got["supervised"]["tokens"] == 1321
    assert got["full"]["supervised"] == 331
    assert got["supervised"]["peak_mib"] * 2 < got["full"]["peak_mib"]


def test_the_energon_epoch_plan_gives_max_steps_that_train_every_sample_once(shards, tmp_path):
    """max_steps from plan_epoch (headers only) over a one-pass loader (repeat=False): the Trainer trains every
    pack the loader delivers, so each of the 24 samples exactly once."""
    encoder = QwenVLPackingTaskEncoder(tokenizer="demo", preset=small_preset("qwen2.5-vl"), seq_length=128)
    plan = plan_epoch(
        str(shards), encoder, packing_buffer_size=6, seed=3, shuffle_buffer_size=8, max_samples_per_sequence=4
    )
    steps = plan.max_steps(epochs=1, accumulation=2)
    model = H.prepare_model(tiny_model("qwen2.5-vl", load_demo_tokenizer()).train())
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, seed_offset=3)
    dataset = H.PackedIterableDataset(energon_loader(shards, "qwen2.5-vl", worker_config=wc, repeat=False))
    collator = Recording(model)
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, max_steps=steps, gradient_accumulation_steps=2),
        train_dataset=dataset,
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[H.EnergonStateCallback(dataset)],
    )
    assert trainer.train().global_step == steps
    assert len(collator.keys) == plan.packs_per_rank[0]
    assert sorted(k for pack in collator.keys for k in pack) == [f"s{i:02d}" for i in range(24)]
