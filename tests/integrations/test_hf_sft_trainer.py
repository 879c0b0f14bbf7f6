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
