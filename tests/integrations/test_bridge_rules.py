"""One Bridge package, one table of rules, one name per knob: Bridge's config names are read into the packing spec's
names in one place (``rules.SPEC_NAMES``), the VLM and GPT-SFT checks word a shared rule the same, the GPT-SFT
provider's packing knobs are the spec's (Bridge's old names refused naming the new one, ``pad_seq_to_mult`` accepted
with one deprecation line), and the old module path ``bridge_sft`` still imports."""

import warnings
from types import SimpleNamespace

import pytest

from energon_pack.errors import ConfigError
from energon_pack.integrations import bridge as B
from energon_pack.integrations.bridge import rules
from energon_pack.packing.spec import PackingSpec


def cfg_with(provider=None, **model):
    """A Bridge config our packs accept, with ``model`` fields changed."""
    return SimpleNamespace(
        train=SimpleNamespace(micro_batch_size=1, global_batch_size=1),
        ddp=SimpleNamespace(average_in_collective=False),
        model=SimpleNamespace(calculate_per_token_loss=True, seq_length=4096, **model),
        dist=SimpleNamespace(eval_context_parallel_size=None),
        dataset=provider,
    )


def sft_provider(**kw):
    return B.make_bridge_sft_dataset_provider("train.jsonl", "demo", seq_length=4096, **kw)


def test_bridge_names_become_the_spec_names_in_one_table():
    cfg = cfg_with(context_parallel_size=2, tensor_model_parallel_size=4, sequence_parallel=True)
    assert rules.topology(cfg) == {"cp": 2, "tp": 4, "sp": True, "eval_cp": None}
    assert rules.model_alignment(cfg) == 8 == PackingSpec(cp=2, tp=4, sp=True).alignment
    assert rules.spec_named({"packed_sequence_size": 4096, "pad_seq_to_mult": 8, "context_parallel_size": 2}) == {
        "seq_length": 4096,
        "pad_multiple": 8,
        "cp": 2,
    }
    assert set(rules.SPEC_NAMES.values()) - {"pad_multiple"} <= {f for f in PackingSpec.__dataclass_fields__}
    assert rules.topology(SimpleNamespace()) == {"cp": 1, "tp": 1, "sp": False, "eval_cp": None}  # unset: off


def test_an_encoder_built_from_the_bridge_config_passes_its_check():
    cfg = cfg_with(context_parallel_size=2, tensor_model_parallel_size=4, sequence_parallel=True)
    assert B.packing_knobs(cfg) == {"cp": 2, "tp": 4, "sp": True, "eval_cp": None, "seq_length": 4096}
    encoder = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", **B.packing_knobs(cfg))
    assert (encoder.packing.seq_length, encoder.layout.pad_multiple) == (4096, 8)
    B.check_bridge_config(cfg, encoder, allow_demo_tokenizer=True)
    cfg.model.tensor_model_parallel_size = 2
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, encoder, allow_demo_tokenizer=True)
    assert [e.knob for e in err.value.errors] == ["model.tensor_model_parallel_size", "task_encoder alignment"]
    assert str(err.value.errors[0]) == (
        "model.tensor_model_parallel_size: is 2 but the task encoder packs for tp=4. "
        "Fix: build the encoder with tp=2 (or set model.tensor_model_parallel_size=4)"
    )


def test_a_shared_rule_reads_the_same_on_both_roads():
    vlm, sft = cfg_with(), cfg_with(provider=sft_provider())
    for cfg in (vlm, sft):
        cfg.ddp.average_in_collective = True
    with pytest.raises(ConfigError) as on_vlm:
        B.check_bridge_config(vlm)
    with pytest.raises(ConfigError) as on_sft:
        B.check_bridge_sft_config(sft)
    assert (
        str(on_vlm.value)
        == str(on_sft.value)
        == (
            "ddp.average_in_collective: is True; gradients must be summed and divided by the global token count. "
            "Fix: set ddp.average_in_collective=False"
        )
    )
    assert [r.knob for r in B.RULES if r.roads == ("vlm", "gpt_sft")] == [
        "model.calculate_per_token_loss",
        "ddp.average_in_collective",
    ]


def test_the_sft_provider_topology_is_named_by_the_spec():
    cfg = cfg_with(provider=sft_provider(), context_parallel_size=2)
    with pytest.raises(ConfigError) as err:
        B.check_bridge_sft_config(cfg)
    assert str(err.value) == (
        "model.context_parallel_size: is 2 but the dataset packs for cp=1. "
        "Fix: set dataset.cp=2 (or set model.context_parallel_size=1)"
    )
    B.check_bridge_sft_config(cfg_with(provider=sft_provider(cp=2), context_parallel_size=2))


def test_the_sft_provider_takes_the_spec_knobs_and_refuses_bridge_names():
    with pytest.raises(ConfigError) as err:
        sft_provider(context_parallel_size=2)
    assert (err.value.knob, err.value.fix) == ("context_parallel_size", "use cp")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        provider = sft_provider(pad_seq_to_mult=4)
    assert (provider.cp, provider.tp, provider.sp) == (2, 1, False)
    assert [str(w.message).split(" (")[0] for w in said] == [
        "make_bridge_sft_dataset_provider: 'pad_seq_to_mult' is deprecated, use 'cp/tp/sp'"
    ]
    with pytest.raises(ConfigError) as err:  # validated by the spec when made, not when Bridge builds it
        sft_provider(cp=3)
    assert err.value.knob == "seq_length"
    assert provider.seed == PackingSpec().seed and provider.overlength == PackingSpec().overlength  # one default


def test_the_old_module_path_still_imports():
    from energon_pack.integrations import bridge_sft
    from energon_pack.integrations.bridge_sft import check_gpt_sft_config, make_bridge_sft_dataset_provider

    assert make_bridge_sft_dataset_provider is B.make_bridge_sft_dataset_provider
    assert check_gpt_sft_config is bridge_sft.check_gpt_sft_config is B.gpt_sft.check_gpt_sft_config
