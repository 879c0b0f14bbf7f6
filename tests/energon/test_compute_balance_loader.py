"""``balance="compute"`` through the real Energon loader on the demo shards with worker processes: every sample
delivered once in packs within the width, packs whose step cost spreads less than tokens-only packs', the
same packs again and after a resume, and a state saved under the other balance refused by name."""

import numpy as np
import pytest
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from test_resume_robust import roundtrip

from energon_pack.bench.dp_sim import pack_step_cost as pack_cost
from energon_pack.energon.fingerprint import ResumeConfigError
from energon_pack.errors import ConfigError
from energon_pack.packing import FITTED
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import batch_difference, close

PRESET = get_preset("qwen2.5-vl", max_pixels=400 * 28 * 28)
WIDTH = 4096


def encoder(balance, **kw):
    return QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=WIDTH, balance=balance, **kw)


def loader(path, balance, workers=2, repeat=False):
    ds = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=encoder(balance),
        packing_buffer_size=48,
        repeat=repeat,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


@pytest.fixture(scope="module")
def streams(demo_shards):
    model = encoder("compute").step_cost_model
    out = {}
    for balance in ("tokens", "compute"):
        batches = list(loader(str(demo_shards), balance))
        out[balance] = (batches, np.asarray([pack_cost(b, model) for b in batches]))
    return out


def test_every_sample_once_within_the_width(streams):
    tokens_keys = sorted(k for b in streams["tokens"][0] for k in b["__keys__"])
    compute_keys = [k for b in streams["compute"][0] for k in b["__keys__"]]
    assert sorted(compute_keys) == tokens_keys and len(set(compute_keys)) == len(compute_keys) > 500
    assert all(int(b["cu_seqlens_q"][-1]) <= WIDTH for b in streams["compute"][0])


def test_packs_cost_more_alike_than_tokens_only(streams):
    def cv(costs):
        body = costs[:-4]  # the end of the finite stream (each worker's last packs) is not balanced
        return body.std() / body.mean()

    assert cv(streams["compute"][1]) < cv(streams["tokens"][1]) / 1.5


def test_same_packs_after_a_resume(demo_shards):
    reference = loader(str(demo_shards), "compute", repeat=True)
    it = iter(reference)
    [next(it) for _ in range(4)]
    state = roundtrip(reference.save_state_rank())
    expected = [next(it) for _ in range(5)]
    close(reference)
    restored = loader(str(demo_shards), "compute", repeat=True)
    restored.restore_state_rank(state)
    it = iter(restored)
    got = [next(it) for _ in range(5)]
    close(restored)
    assert all(batch_difference(a, b) is None for a, b in zip(got, expected))
    other = loader(str(demo_shards), "tokens", repeat=True)
    with pytest.raises(ResumeConfigError, match="balance"):
        other.restore_state_rank(state)
    close(other)


def test_balance_knobs_checked():
    with pytest.raises(ConfigError) as caught:
        encoder("tokens-and-more")
    assert caught.value.knob == "balance"
    with pytest.raises(ConfigError) as caught:
        encoder("compute", packing_mode="rounds")
    assert caught.value.knob == "balance"
    with pytest.raises(ConfigError) as caught:
        encoder("compute", cost_model="qwen9-vl")
    assert caught.value.knob == "cost_model"
    assert encoder("compute").step_cost_model.source == "flops:qwen2.5-vl-7b"
    assert encoder("compute", cost_model="qwen2.5-vl-3b").step_cost_model.source == "flops:qwen2.5-vl-3b"
    assert encoder("compute").make_packer(16).resume_saved_tuning  # the encoders expose no tuning knob
    fitted = encoder("compute", cost_model="qwen2.5-vl-3b@h200-eager").step_cost_model
    assert fitted is FITTED["qwen2.5-vl-3b@h200-eager"] and fitted.source == "fit:step_cost_h200_fit_eager"
