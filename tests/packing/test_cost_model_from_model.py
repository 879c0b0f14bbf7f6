"""``cost_model=`` follows the model being trained: names, fitted JSON files, transformers Qwen-VL configs and models,
Megatron-Bridge providers resolve to exact coefficients; wrong forms are one ConfigError naming ``cost_model``; the
default rule says its guess in one log line per process; the SFT sampler records the model's stable name."""

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

from energon_pack.errors import ConfigError
from energon_pack.packing import step_cost
from energon_pack.packing.step_cost import (
    FITTED,
    SHAPES,
    StepCostModel,
    cost_model_from,
    cost_model_name,
    resolve_cost_model,
    same_cost_model,
    shape_from_config,
)
from energon_pack.sft import TokenBudgetBatchSampler

Q2 = dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, patch_size=14, spatial_merge_size=2)
Q25 = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14, window_size=112)
Q25["fullatt_block_indexes"] = [7, 15, 23, 31]

#: the published config.json values of each model (text_config, vision_config), the rows of SHAPES
PUBLISHED = {
    "qwen2-vl-2b": (Qwen2VLConfig, dict(hidden_size=1536, num_hidden_layers=28, intermediate_size=8960,
                    num_attention_heads=12, num_key_value_heads=2, vocab_size=151936), {**Q2, "hidden_size": 1536}),
    "qwen2-vl-7b": (Qwen2VLConfig, dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                    num_attention_heads=28, num_key_value_heads=4, vocab_size=152064), {**Q2, "hidden_size": 3584}),
    "qwen2.5-vl-3b": (Qwen2_5_VLConfig, dict(hidden_size=2048, num_hidden_layers=36, intermediate_size=11008,
                      num_attention_heads=16, num_key_value_heads=2, vocab_size=151936),
                      {**Q25, "out_hidden_size": 2048}),
    "qwen2.5-vl-7b": (Qwen2_5_VLConfig, dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                      num_attention_heads=28, num_key_value_heads=4, vocab_size=152064),
                      {**Q25, "out_hidden_size": 3584}),
    "qwen3-vl-4b": (Qwen3VLConfig, dict(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936),
                    dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2560, patch_size=16,
                         deepstack_visual_indexes=[5, 11, 17])),
    "qwen3-vl-8b": (Qwen3VLConfig, dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936),
                    dict(depth=27, hidden_size=1152, intermediate_size=4304, out_hidden_size=4096, patch_size=16,
                         deepstack_visual_indexes=[8, 16, 24])),
}  # fmt: skip


def hf_config(name):
    cls, text, vision = PUBLISHED[name]
    return cls(text_config=text, vision_config=vision)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_hf_configs_derive_the_named_shape(name):
    config = hf_config(name)
    assert shape_from_config(config) == SHAPES[name]
    assert cost_model_from(config) == StepCostModel.from_shape(name)  # the exact coefficients
    assert cost_model_from(SimpleNamespace(config=config)) == StepCostModel.from_shape(name)  # a model: its .config


def test_tiny_config_derives_its_own_shape():
    text = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1000)  # fmt: skip
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=64, patch_size=14, window_size=56)
    shape = shape_from_config(
        Qwen2_5_VLConfig(text_config=text, vision_config={**vision, "fullatt_block_indexes": [1]})
    )
    assert shape == step_cost.ModelShape(
        "qwen2_5_vl-64x2",
        step_cost.LLMShape(64, 2, 128, 4, 2, 16, 1000),
        step_cost.VisionShape(32, 2, 64, 64, 14, gated_mlp=True, full_blocks=1, window_patches=16),
    )
    model = cost_model_from(Qwen2_5_VLConfig(text_config=text, vision_config={**vision, "fullatt_block_indexes": [1]}))
    assert model.source == "flops:qwen2_5_vl-64x2" and model == StepCostModel.from_shape(shape)


def test_bridge_provider_fields_derive_the_named_shape():
    """Megatron's names (Bridge 0.6.2's Qwen25VLModelProvider: a GPTModelProvider with the HF vision_config)."""
    vision = hf_config("qwen2.5-vl-3b").vision_config
    provider = SimpleNamespace(hidden_size=2048, num_layers=36, ffn_hidden_size=11008, num_attention_heads=16,
                               num_query_groups=2, kv_channels=128, vocab_size=151936, gated_linear_unit=True,
                               vision_config=vision)  # fmt: skip
    assert cost_model_from(provider) == StepCostModel.from_shape("qwen2.5-vl-3b")
    text_only = SimpleNamespace(**{**vars(provider), "vision_config": None, "kv_channels": None})
    assert shape_from_config(text_only) == step_cost.ModelShape("simplenamespace-2048x36", SHAPES["qwen2.5-vl-3b"].llm)


def test_names_files_and_mappings_resolve_exactly(tmp_path):
    assert cost_model_from("qwen2.5-vl-3b") == StepCostModel.from_shape("qwen2.5-vl-3b")
    assert cost_model_from("qwen2.5-vl-3b@h200-eager") is FITTED["qwen2.5-vl-3b@h200-eager"]
    fitted = StepCostModel(1.0, 5e-05, per_patch=0.6, per_patch_squared=9e-06, source="fit:my_run")
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({**fitted.as_dict(), "r2": 0.99}))  # fit metadata beside the coefficients is kept out
    assert cost_model_from(str(path)) == fitted and cost_model_from(path) == fitted
    assert cost_model_from(fitted.as_dict()) == fitted
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"per_token": 1, "per_token_squared": 2e-5}))
    assert cost_model_from(str(bare)) == StepCostModel(1.0, 2e-5, source="file:bare.json")
    assert (
        cost_model_name(fitted)
        == cost_model_name(cost_model_from(str(path)))
        == "fit:my_run#" + (cost_model_name(fitted).split("#")[1])
    )
    assert cost_model_name(fitted) != cost_model_name(FITTED["qwen2.5-vl-3b@h200-eager"])


@pytest.mark.parametrize(
    "content, problem",
    [
        ("not json", "is not JSON"),
        ("[1, 2]", "is a list, not a JSON object"),
        ('{"per_token": 1}', "has no 'per_token_squared'"),
        ('{"per_token": 1, "per_token_squared": 0, "per_patchs": 1}', "has unknown coefficient 'per_patchs'"),
        ('{"per_token": 1, "per_token_squared": -1}', "has per_token_squared=-1"),
        ('{"per_token": 0, "per_token_squared": 1}', "has per_token=0"),
    ],
)
def test_a_wrong_file_is_one_error_naming_the_knob(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        cost_model_from(str(path))
    assert caught.value.knob == "cost_model" and problem in str(caught.value)


@pytest.mark.parametrize("spec", ["qwen9-vl", "missing.json", 3, SimpleNamespace(hidden_size=8)])
def test_a_wrong_form_is_one_error_naming_the_knob(spec):
    with pytest.raises(ConfigError) as caught:
        cost_model_from(spec)
    assert caught.value.knob == "cost_model"


def test_the_default_rule_says_its_guess_once(caplog, monkeypatch):
    monkeypatch.setattr(step_cost, "_said", set())
    with caplog.at_level(logging.INFO, logger="energon_pack"):
        for _ in range(3):
            model, name = resolve_cost_model(None, default_shape="qwen3-vl-8b", road="TheEncoder")
        seen, seen_name = resolve_cost_model(None, seen_model=hf_config("qwen2.5-vl-3b"), road="cfg.model")
        resolve_cost_model(None, seen_model=hf_config("qwen2.5-vl-3b"), road="cfg.model")
        resolve_cost_model("qwen2.5-vl-3b")  # named: nothing to say
    lines = [r for r in caplog.records if "balance='compute' prices" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO]
    assert (
        lines[0]
        .getMessage()
        .startswith("balance='compute' prices qwen3-vl-8b (TheEncoder's default shape); pass cost_model=<your")
    )
    assert model == StepCostModel.from_shape("qwen3-vl-8b") and name.endswith(" (default)")
    assert seen == StepCostModel.from_shape("qwen2.5-vl-3b") and seen_name == cost_model_name(seen)
    assert lines[1].getMessage() == f"balance='compute' prices qwen2.5-vl-3b ({seen_name}), the model of cfg.model"


def test_same_cost_model_reads_states_saved_before_stable_names():
    default = cost_model_name(StepCostModel.from_shape("qwen2.5-vl-7b"), defaulted=True)
    three = cost_model_name(StepCostModel.from_shape("qwen2.5-vl-3b"))
    assert same_cost_model(None, default) and not same_cost_model(None, three)
    assert same_cost_model("qwen2.5-vl-3b", three) and same_cost_model(three, three)
    assert same_cost_model(default, default.removesuffix(" (default)"))
    assert not same_cost_model(default, three) and not same_cost_model("qwen2.5-vl-7b", three)


def test_sft_sampler_prices_an_hf_config_and_refuses_another_model_on_resume():
    lengths = np.random.default_rng(0).integers(20, 3000, size=300)
    sampler = TokenBudgetBatchSampler(lengths, 4096, cost_model=hf_config("qwen2.5-vl-3b"), shuffle=False)
    named = TokenBudgetBatchSampler(lengths, 4096, cost_model="qwen2.5-vl-3b", shuffle=False)
    assert sampler._step_cost == StepCostModel.from_shape("qwen2.5-vl-3b") and list(sampler) == list(named)
    state = sampler.state_dict(3)
    assert state["config"]["cost_model"] == cost_model_name(StepCostModel.from_shape("qwen2.5-vl-3b"))
    named.load_state_dict(state)  # the same model by another form resumes
    other = TokenBudgetBatchSampler(lengths, 4096, cost_model="qwen2-vl-2b", shuffle=False)
    with pytest.raises(ValueError, match=r"saved with a different \['cost_model'\]"):
        other.load_state_dict(state)
    with pytest.raises(ConfigError) as caught:
        TokenBudgetBatchSampler(lengths, 4096, cost_model="qwen9")
    assert caught.value.knob == "cost_model"
