"""TRL's SFTTrainer (and PEFT LoRA through it) on our packs, as they are: SFT_SETTINGS, PackedCollator, no loss hook.

Packs come from the real Energon savable loader over WebDataset shards written here (Qwen2-VL, Qwen2.5-VL, Qwen3-VL
tiny models) and from our GPT-SFT JSONL road (a tiny text-only Qwen2). SFTTrainer's own loss (its fused LM head, no
T x vocab logits) on the collator's labels gives the loss and gradients of our own step on the same packs.
"""

import copy

import pytest
import torch

from _hf_helpers import NO_IMPLICIT_PREPARE, tiny_model
from _hf_trainer_helpers import (
    Grads,
    Recording,
    demo_processing_class,
    energon_loader,
    our_step,
    sft_loader,
    tiny_text_model,
    trainer_args,
    write_jsonl,
    write_shards,
)
from energon_pack.errors import ConfigError
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import load_demo_tokenizer

trl = pytest.importorskip("trl")
pytestmark = [NO_IMPLICIT_PREPARE, pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("sft_shards"))


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("sft_jsonl") / "train.jsonl")


def _model_and_loader(name, shards, jsonl):
    tok = load_demo_tokenizer()
    if name == "text":
        return tiny_text_model(tok), lambda: sft_loader(jsonl)[0]
    return tiny_model(name, tok), lambda: energon_loader(shards, name)


def _sft_trainer(model, loader, out, accumulate, **kw):
    collator = Recording(model, supervised_logits=False)
    grads = Grads()
    trainer = trl.SFTTrainer(
        model=model,
        args=trainer_args(out, trl.SFTConfig, gradient_accumulation_steps=accumulate),
        train_dataset=H.trl_dataset(loader),
        data_collator=collator,
        processing_class=demo_processing_class(),
        callbacks=[grads, H.PackedDataCallback()],
        **kw,
    )
    return trainer, collator, grads


def _assert_same_step(result, collator, grads, ours, packs_from, accumulate):
    packs = [p for _, p in zip(range(accumulate), packs_from())]
    assert [list(p["__keys__"]) for p in packs] == collator.keys[:accumulate]
    assert sum(p["num_segments"] for p in packs) > accumulate  # packed rows, not single samples
    loss, want = our_step(ours, packs)
    assert result.training_loss == pytest.approx(loss, rel=1e-5)
    assert sorted(grads.grads) == sorted(want)
    for key, grad in want.items():
        torch.testing.assert_close(grads.grads[key], grad, rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.parametrize(("name", "accumulate"), [("qwen2-vl", 1), ("qwen2.5-vl", 2), ("qwen3-vl", 1), ("text", 2)])
def test_an_sft_trainer_step_is_our_step(shards, jsonl, tmp_path, name, accumulate):
    """SFTTrainer (its own fused loss, normalised by num_items_in_batch over gradient accumulation) == our step; the
    pack it peeks at when built is still the first one trained."""
    model, loader = _model_and_loader(name, shards, jsonl)
    model = H.for_sft_trainer(H.prepare_model(model.train()))
    ours = copy.deepcopy(model)
    trainer, collator, grads = _sft_trainer(model, loader(), tmp_path, accumulate)
    result = trainer.train()
    _assert_same_step(result, collator, grads, ours, loader, accumulate)


def test_a_lora_sft_trainer_step_is_our_step_with_the_same_lora_model(shards, jsonl, tmp_path):
    """SFTTrainer(peft_config=LoraConfig): the LoRA gradients equal our step's on a LoRA model with the same weights."""
    peft = pytest.importorskip("peft")
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model, loader = _model_and_loader("qwen2.5-vl", shards, jsonl)
    model = H.for_sft_trainer(H.prepare_model(model.train()))
    ours = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(**lora))
    trainer, collator, grads = _sft_trainer(model, loader(), tmp_path, 2, peft_config=peft.LoraConfig(**lora))
    ours.load_state_dict(trainer.model.state_dict())
    result = trainer.train()
    assert grads.grads and all("lora_" in key for key in grads.grads)
    _assert_same_step(result, collator, grads, ours, loader, 2)


@pytest.mark.parametrize(
    ("knob", "value", "why"),
    [
        ("packing", True, "pack the packs again"),
        ("padding_free", True, "padding-free collator would replace PackedCollator"),
        ("dataset_kwargs", {}, "tokenize the packs again"),
        ("remove_unused_columns", True, "drop the pack's keys"),
    ],
)
def test_sft_config_settings_that_break_packs_are_refused_by_name(tmp_path, knob, value, why):
    H.check_trainer_args(trainer_args(tmp_path, trl.SFTConfig))
    with pytest.raises(ConfigError, match=f"{knob}.*{why}.*SFT_SETTINGS"):
        H.check_trainer_args(trainer_args(tmp_path, trl.SFTConfig, **{knob: value}))


def _sft_run(shards, out, steps, *, save_steps=None, resume=None):
    """The ``__keys__`` of the packs an SFTTrainer run trained on (gradient accumulation 2)."""
    model = H.for_sft_trainer(H.prepare_model(tiny_model("qwen2.5-vl", load_demo_tokenizer()).train()))
    dataset = H.trl_dataset(energon_loader(shards, "qwen2.5-vl"))
    collator = Recording(model, supervised_logits=False)
    save = dict(save_strategy="steps", save_steps=save_steps) if save_steps else {}
    trainer = trl.SFTTrainer(
        model=model,
        args=trainer_args(out, trl.SFTConfig, max_steps=steps, gradient_accumulation_steps=2, **save),
        train_dataset=dataset,
        data_collator=collator,
        processing_class=demo_processing_class(),
        callbacks=[H.EnergonStateCallback(dataset, resume_from=resume)],
    )
    trainer.train(resume_from_checkpoint=resume)
    return collator.keys


def test_a_resumed_sft_trainer_run_trains_the_packs_of_an_uninterrupted_one(shards, tmp_path):
    """SFTTrainer peeks at a pack when built: checkpoint-2 still holds the state after the 4 packs trained, and the
    loader restored by EnergonStateCallback(resume_from=...) before SFTTrainer is built trains the packs of steps
    3-4 of an uninterrupted run; a restore after SFTTrainer started the loader is refused naming resume_from."""
    full = _sft_run(shards, tmp_path / "full", 4)
    first = _sft_run(shards, tmp_path / "run", 2, save_steps=2)
    resumed = _sft_run(shards, tmp_path / "run", 4, resume=str(tmp_path / "run" / "checkpoint-2"))
    assert first[:4] == full[:4]
    assert resumed[:4] == full[4:8]
    assert len({tuple(k) for k in full[:8]}) == 8
    dataset = H.trl_dataset(energon_loader(shards, "qwen2.5-vl"))
    next(iter(dataset))
    with pytest.raises(ConfigError, match=r"resume_from.*already been read.*EnergonStateCallback\(dataset, resume_"):
        dataset.restore(
            torch.load(tmp_path / "run" / "checkpoint-2" / "energon_loader_state_rank0.pt", weights_only=False)
        )


def test_an_sft_config_run_of_a_model_that_takes_no_loss_kwargs_is_refused(shards, tmp_path):
    """Without for_sft_trainer, SFTTrainer would average per-pack means of a Qwen-VL model: refused by name."""
    model = H.prepare_model(tiny_model("qwen2.5-vl", load_demo_tokenizer()).train())
    trainer, _, _ = _sft_trainer(model, energon_loader(shards, "qwen2.5-vl"), tmp_path, 2)
    with pytest.raises(ConfigError, match=r"model.*per-pack means.*for_sft_trainer\(prepare_model\(model\)\)"):
        trainer.train()
