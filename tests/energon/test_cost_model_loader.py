"""The real Energon loader with ``cost_model=<transformers config>``: packs, its stats name the resolved model, and a
restore under another cost model is a ResumeConfigError naming ``cost_model``."""

import pytest
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from test_resume_robust import roundtrip
from transformers import Qwen2_5_VLConfig

from energon_pack.energon.fingerprint import ResumeConfigError
from energon_pack.packing import StepCostModel
from energon_pack.packing.step_cost import cost_model_name
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import close

PRESET = get_preset("qwen2.5-vl", max_pixels=400 * 28 * 28)
#: Qwen2.5-VL-3B's published config.json values
CONFIG_3B = Qwen2_5_VLConfig(
    text_config=dict(hidden_size=2048, num_hidden_layers=36, intermediate_size=11008, num_attention_heads=16,
                     num_key_value_heads=2, vocab_size=151936),
    vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, out_hidden_size=2048, patch_size=14,
                       window_size=112, fullatt_block_indexes=[7, 15, 23, 31]),
)  # fmt: skip


def loader(path, cost_model):
    encoder = QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=4096, cost_model=cost_model)
    ds = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=encoder,
        packing_buffer_size=16,
        repeat=True,
    )
    return encoder, get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def test_hf_config_prices_packs_named_in_stats_and_resume(demo_shards):
    encoder, first = loader(str(demo_shards), CONFIG_3B)
    name = cost_model_name(StepCostModel.from_shape("qwen2.5-vl-3b"))
    assert encoder.packing.cost_model == StepCostModel.from_shape("qwen2.5-vl-3b")
    it = iter(first)
    batches = [next(it) for _ in range(3)]
    assert [b["packing_stats"]["cost_model"] for b in batches] == [name] * 3
    assert all(int(b["cu_seqlens_q"][-1]) <= 4096 for b in batches)
    state = roundtrip(first.save_state_rank())
    close(first)
    _, same = loader(str(demo_shards), "qwen2.5-vl-3b")  # the same model by name resumes
    same.restore_state_rank(state)
    close(same)
    _, other = loader(str(demo_shards), None)  # the preset's default, Qwen2.5-VL-7B
    with pytest.raises(ResumeConfigError) as caught:
        other.restore_state_rank(state)
    close(other)
    assert caught.value.knob == "cost_model"
    assert f"under the step-cost model {name}, this loader prices flops:qwen2.5-vl-7b#" in str(caught.value)
