"""The Bridge roads price the model Bridge trains: ``check_bridge_config(cfg)`` hands ``cfg.model`` (a Megatron-Bridge
Qwen2.5-VL-3B provider's fields) to the provider's encoder, so ``balance="compute"`` packs under the 3B shape, one log
line says so, the stats and the resume fingerprint name it, and a restore under another model is refused by name; the
GPT-SFT provider prices ``cfg.model`` the same way."""

import logging
import pickle
from types import SimpleNamespace

import pytest
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from transformers import Qwen2_5_VLConfig

from energon_pack.energon.fingerprint import ResumeConfigError
from energon_pack.integrations.bridge import (
    BridgeQwenVLPackingTaskEncoder,
    check_bridge_config,
    check_bridge_sft_config,
    make_bridge_dataset_provider,
    make_bridge_sft_dataset_provider,
)
from energon_pack.packing import StepCostModel, step_cost
from energon_pack.packing.step_cost import cost_model_name
from energon_pack.qwen_vl import get_preset
from harness.loaders import close, roundtrip

PRESET = get_preset("qwen2.5-vl", max_pixels=400 * 28 * 28)
#: the published config.json values of Qwen2.5-VL-3B and -7B (text_config; vision out_hidden_size)
TEXT = {
    "qwen2.5-vl-3b": dict(hidden_size=2048, num_hidden_layers=36, intermediate_size=11008, num_attention_heads=16,
                          num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-vl-7b": dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944, num_attention_heads=28,
                          num_key_value_heads=4, vocab_size=152064),
}  # fmt: skip
VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14, window_size=112,
              fullatt_block_indexes=[7, 15, 23, 31])  # fmt: skip


def provider_of(name):
    """A Megatron-Bridge Qwen2.5-VL model provider's fields (Megatron's names, the HF vision_config) for ``name``."""
    config = Qwen2_5_VLConfig(
        text_config=TEXT[name], vision_config={**VISION, "out_hidden_size": TEXT[name]["hidden_size"]}
    )
    text = config.text_config
    return SimpleNamespace(
        hidden_size=text.hidden_size,
        num_layers=text.num_hidden_layers,
        ffn_hidden_size=text.intermediate_size,
        num_attention_heads=text.num_attention_heads,
        num_query_groups=text.num_key_value_heads,
        kv_channels=text.hidden_size // text.num_attention_heads,
        vocab_size=text.vocab_size,
        gated_linear_unit=True,
        vision_config=config.vision_config,
        calculate_per_token_loss=True,
        seq_length=4096,
        init_method=lambda weight: weight,  # a Bridge provider holds callables: it never rides in the encoder
    )


def bridge_cfg(path, model):
    """A Bridge config as a recipe leaves it for our packs, its dataset our provider (encoder with no cost_model)."""
    encoder = BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=4096)
    return SimpleNamespace(
        train=SimpleNamespace(micro_batch_size=1),
        ddp=SimpleNamespace(average_in_collective=False),
        model=provider_of(model),
        dataset=make_bridge_dataset_provider(path, encoder, packing_buffer_size=16),
    )


def loader(cfg):
    check_bridge_config(cfg, allow_demo_tokenizer=True)
    ds = get_train_dataset(
        cfg.dataset.path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=cfg.dataset.task_encoder,
        packing_buffer_size=cfg.dataset.packing_buffer_size,
        repeat=True,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def test_check_bridge_config_prices_the_bridge_model_named_in_log_stats_and_resume(demo_shards, caplog, monkeypatch):
    monkeypatch.setattr(step_cost, "_said", set())  # the log line is said once per process
    cfg = bridge_cfg(str(demo_shards), "qwen2.5-vl-3b")
    with caplog.at_level(logging.INFO, logger="energon_pack"):
        first = loader(cfg)
        encoder = cfg.dataset.task_encoder
        name = cost_model_name(StepCostModel.from_shape("qwen2.5-vl-3b"))
        assert encoder.packing.cost_model is None and encoder.cost_model_name == name
        assert pickle.loads(pickle.dumps(encoder)).cost_model_name == name  # what spawned loader workers get
        it = iter(first)
        batches = [next(it) for _ in range(3)]
    said = [r.getMessage() for r in caplog.records if "balance='compute' prices" in r.getMessage()]
    assert said == [f"balance='compute' prices qwen2.5-vl-3b ({name}), the model of BridgeQwenVLPackingTaskEncoder"]
    assert [b["packing_stats"]["cost_model"] for b in batches] == [name] * 3
    assert encoder.resume_knobs()["cost_model"] == name
    state = roundtrip(first.save_state_rank())
    close(first)
    same = loader(bridge_cfg(str(demo_shards), "qwen2.5-vl-3b"))  # the same model: resumes
    same.restore_state_rank(state)
    close(same)
    other = loader(bridge_cfg(str(demo_shards), "qwen2.5-vl-7b"))  # another model trains: refused by name
    with pytest.raises(ResumeConfigError) as caught:
        other.restore_state_rank(state)
    close(other)
    assert caught.value.knob == "cost_model"
    assert f"under the step-cost model {name}, this loader prices flops:qwen2.5-vl-7b#" in str(caught.value)


def test_a_named_cost_model_wins_over_the_bridge_model(demo_shards):
    cfg = bridge_cfg(str(demo_shards), "qwen2.5-vl-7b")
    encoder = BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=4096, cost_model="qwen2-vl-2b")
    cfg.dataset = make_bridge_dataset_provider(str(demo_shards), encoder)
    check_bridge_config(cfg, allow_demo_tokenizer=True)
    assert encoder.cost_model_name == cost_model_name(StepCostModel.from_shape("qwen2-vl-2b"))


def test_the_validation_encoder_prices_the_bridge_model_too(demo_shards):
    cfg = bridge_cfg(str(demo_shards), "qwen2.5-vl-3b")
    cfg.dataset.validation_task_encoder = BridgeQwenVLPackingTaskEncoder(
        tokenizer="demo", preset=PRESET, seq_length=4096
    )
    check_bridge_config(cfg, allow_demo_tokenizer=True)
    name = cost_model_name(StepCostModel.from_shape("qwen2.5-vl-3b"))
    assert cfg.dataset.task_encoder.cost_model_name == cfg.dataset.validation_task_encoder.cost_model_name == name


def test_check_bridge_sft_config_prices_the_bridge_model(tmp_path):
    cfg = SimpleNamespace(
        train=SimpleNamespace(micro_batch_size=1, global_batch_size=1),
        ddp=SimpleNamespace(average_in_collective=False),
        model=provider_of("qwen2.5-vl-3b"),
        dataset=make_bridge_sft_dataset_provider(str(tmp_path / "train.jsonl"), "demo", seq_length=4096),
    )
    check_bridge_sft_config(cfg)
    assert cfg.dataset._priced_model == StepCostModel.from_shape("qwen2.5-vl-3b")
