"""Bridge 0.3.1 with real Megatron-Core on our GPT-SFT provider: its ``ConfigContainer.validate()``
on finetune configs, and its data loader, GPT-step batch, packed-seq params and loss on our packs.

Runs in the compatibility environment ``megatron-bridge-0.3.1`` (``scripts/compat_envs.py``;
``tests/project/test_compat_matrix.py`` runs it): Megatron-Core 0.16.1 from PyPI (real, CPU) and
Megatron-Bridge 0.3.1, the newest Bridge release that installs on Python < 3.12 and the last whose
training config needs only Megatron-Core (0.4+ also imports Megatron-LM's ``megatron.training``,
which is on no package index). Only GPU libraries imported at module level and never run by
``validate`` are stand-ins: Transformer Engine, triton, and HF ``datasets`` when absent. Everything
else, the config dataclasses, their ``finalize``/``__post_init__`` and ``validate``, is Bridge's
and Megatron-Core's own code. In the main environment (Megatron-Core absent) the module is skipped.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from energon_pack.errors import ConfigError
from energon_pack.integrations import bridge as S

sys.path.insert(0, str(Path(__file__).parents[1]))

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron.core") is None,
    reason="needs Megatron-Core: runs in .venv-compat/megatron-bridge-0.3.1 (tests/project/test_compat_matrix.py)",
)

WIDTH = 512


class _DeepStub(type):
    """A stand-in class whose every attribute is another stand-in class (``te.pytorch.ops.Sequential``)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _DeepStub(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(cls, name, value)
        return value


class _GpuLibraryStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import-time stand-ins for libraries Bridge's modules import at module level and nothing here runs."""

    def __init__(self, prefixes: set[str]) -> None:
        self.prefixes = prefixes

    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in self.prefixes):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "2.9.0"  # Megatron-Core asks Transformer Engine's version at import
        module.__getattr__ = lambda name: getattr(_DeepStub(spec.name, (), {}), name)
        return module

    def exec_module(self, module):
        pass


@pytest.fixture(scope="module")
def bridge():
    """Bridge's config classes, its ``DatasetProvider`` and ``GPTModelProvider`` (real), imported once."""
    # GPU libraries, and TensorBoard's writer (Bridge's training state imports it; not installed here)
    prefixes = {"transformer_engine", "triton", "modelopt", "torch.utils.tensorboard"} | (
        {"datasets"} if importlib.util.find_spec("datasets") is None else set()
    )
    finder = _GpuLibraryStubs(prefixes)
    sys.meta_path.insert(0, finder)
    try:
        import transformers  # noqa: F401  (before the stand-ins can shadow anything it probes)
        from megatron.bridge.data import samplers
        from megatron.bridge.models import GPTModelProvider
        from megatron.bridge.training import config, gpt_step, losses
        from megatron.bridge.training.tokenizers.config import TokenizerConfig
    finally:
        sys.meta_path.remove(finder)
    return types.SimpleNamespace(
        config=config,
        GPTModelProvider=GPTModelProvider,
        TokenizerConfig=TokenizerConfig,
        gpt_step=gpt_step,
        losses=losses,
        samplers=samplers,
    )


@pytest.fixture()
def world(monkeypatch):
    """Bridge's world size outside torch.distributed is ``WORLD_SIZE`` (as torchrun sets it)."""

    def set_world(n: int) -> None:
        monkeypatch.setenv("WORLD_SIZE", str(n))

    set_world(1)
    return set_world


def finetune_config(
    bridge,
    *,
    mbs=2,
    gbs=8,
    seq_length=WIDTH,
    dataset_seq_length=WIDTH,
    tp=1,
    cp=1,
    sp=False,
    per_token_loss=True,
    dataset_kw=None,
    model_kw=None,
):
    """A Bridge finetune ``ConfigContainer`` as a user writes it, with our provider as ``dataset``."""
    c = bridge.config
    model = bridge.GPTModelProvider(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=seq_length,
        vocab_size=1024,
        tensor_model_parallel_size=tp,
        context_parallel_size=cp,
        sequence_parallel=sp,
        calculate_per_token_loss=per_token_loss,
        **(model_kw or {}),
    )
    dataset_kw = {
        "cp": cp,
        "tp": tp,
        "sp": sp,
        "enable_in_batch_packing": mbs > 1,
        "num_workers": 0,
        **(dataset_kw or {}),
    }
    dataset = S.make_bridge_sft_dataset_provider("train.jsonl", object(), seq_length=dataset_seq_length, **dataset_kw)
    return c.ConfigContainer(
        train=c.TrainingConfig(micro_batch_size=mbs, global_batch_size=gbs, train_iters=10),
        model=model,
        optimizer=c.OptimizerConfig(optimizer="adam", lr=1e-4, use_distributed_optimizer=False),
        scheduler=c.SchedulerConfig(),
        dataset=dataset,
        logger=c.LoggerConfig(),
        tokenizer=bridge.TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1024),
        checkpoint=c.CheckpointConfig(),
        rng=c.RNGConfig(),
        ddp=c.DistributedDataParallelConfig(),
    )


@pytest.mark.parametrize(
    "mbs,gbs,world_size,tp,cp,sp", [(2, 8, 4, 1, 1, False), (1, 8, 8, 2, 2, True), (4, 16, 2, 1, 2, False)]
)
def test_a_correct_config_passes_bridge_validate_and_our_check(bridge, world, mbs, gbs, world_size, tp, cp, sp):
    world(world_size)
    cfg = finetune_config(bridge, mbs=mbs, gbs=gbs, tp=tp, cp=cp, sp=sp)
    assert isinstance(cfg.dataset, bridge.config.DatasetProvider)  # Bridge dispatches on it
    cfg.validate()
    assert cfg.data_parallel_size == world_size // (tp * cp)
    S.check_bridge_sft_config(cfg)
    assert cfg.dataset.pack_sequences_in_batch is (mbs > 1)  # Bridge 0.3's name for enable_in_batch_packing


def test_bridge_validate_itself_refuses_in_batch_packing_at_micro_batch_1(bridge, world):
    cfg = finetune_config(bridge, mbs=1, gbs=8, dataset_kw={"enable_in_batch_packing": True})
    with pytest.raises(ValueError, match="micro_batch_size should be greater than 1"):
        cfg.validate()
    with pytest.raises(ConfigError, match=r"dataset\.enable_in_batch_packing"):
        S.check_bridge_sft_config(cfg, data_parallel_size=1)


#: mistakes Bridge's validate() lets through (the run would start), each named by our check
MISTAKES = [
    ("model.calculate_per_token_loss", dict(per_token_loss=False)),
    ("model.seq_length", dict(seq_length=1024)),
    ("train.global_batch_size", dict(mbs=2, gbs=6)),
    ("model.context_parallel_size", dict(cp=2, dataset_kw={"cp": 1})),
    ("dataset.dataloader_type", dict(dataset_kw={"dataloader_type": "batch"})),
]


@pytest.mark.parametrize("knob,change", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_bridge_validate_lets_through_is_named_by_our_check(bridge, world, knob, change):
    world(4)
    cfg = finetune_config(bridge, **change)
    cfg.validate()  # Bridge accepts it
    with pytest.raises(ConfigError) as err:
        S.check_bridge_sft_config(cfg)
    assert [e.knob for e in getattr(err.value, "errors", [err.value])] == [knob]


@pytest.mark.parametrize(
    "dataset_kw, fix",
    [
        (dict(pad_cu_seqlens=True, max_segments=64), "set pad_to_max_length=True (or pad_cu_seqlens=False)"),
        (
            dict(pad_cu_seqlens=True, pad_to_max_length=True),
            "set max_segments (cu arrays get max_segments + 1 entries)",
        ),
    ],
)
def test_static_shape_mistakes_bridge_validate_lets_through_are_refused_when_the_provider_is_made(
    bridge, world, dataset_kw, fix
):
    with pytest.raises(ConfigError) as err:  # the packing spec validates the provider's knobs at once
        finetune_config(bridge, dataset_kw=dataset_kw)
    assert (err.value.knob, err.value.fix) == ("pad_cu_seqlens", fix)


def test_every_mistake_at_once_is_one_error_naming_each_knob(bridge, world):
    world(4)
    cfg = finetune_config(
        bridge, mbs=2, gbs=6, seq_length=1024, per_token_loss=False, dataset_kw={"dataloader_type": "batch"}
    )
    cfg.validate()
    with pytest.raises(ConfigError) as err:
        S.check_bridge_sft_config(cfg)
    assert sorted(e.knob for e in err.value.errors) == sorted(
        ["dataset.dataloader_type", "model.calculate_per_token_loss", "model.seq_length", "train.global_batch_size"]
    )


def test_bridge_builds_our_datasets_through_its_build_context(bridge, world, tmp_path):
    """Bridge's ``DatasetBuildContext`` (the sample counts it computes from the train config) into our provider."""
    from _bridge_light import tiny_tokenizer

    rows = [{"prompt": f"question {i} " * (i % 7 + 1), "completion": f"answer {i}"} for i in range(40)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = finetune_config(bridge, mbs=2, gbs=4)
    cfg.dataset.path, cfg.dataset.tokenizer, cfg.dataset.cache_dir = str(path), tiny_tokenizer(), str(tmp_path / "c")
    cfg.validate()
    S.check_bridge_sft_config(cfg)
    context = bridge.config.DatasetBuildContext(
        train_samples=cfg.train.train_iters * cfg.train.global_batch_size, valid_samples=0, test_samples=0
    )
    train, valid, test = cfg.dataset.build_datasets(context)
    assert valid is None and test is None
    assert len(train) >= context.train_samples  # every pack Bridge's sampler may ask for exists
    seen = sorted(i for k in range(len(train)) for i in train.pack_indices(k))
    assert seen == sorted(list(range(40)) * train.epochs)  # whole epochs: every line once per epoch


# ------------------------------------------------------------------------------ Bridge 0.3.1's GPT step
@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-process gloo world: Megatron-Core's pipeline and CP predicates read real process groups."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg')}/init", rank=0, world_size=1)
    yield types.SimpleNamespace(pp=dist.group.WORLD, cp=dist.group.WORLD)
    dist.destroy_process_group()


@pytest.mark.parametrize("fmt", ["prompt_completion", "chat"])
@pytest.mark.parametrize("mbs", [1, 2])
def test_bridge_0_3_gpt_step_reads_our_packs(bridge, world, process_group, monkeypatch, tmp_path, fmt, mbs):
    """Bridge 0.3.1's loader builder, ``get_batch`` (its pre-0.6 names: ``cu_seqlens`` + argmins,
    Megatron-Core's own ``get_batch_on_this_cp_rank``), ``get_packed_seq_params`` (Megatron-Core's
    ``PackedSeqParams``) and ``masked_next_token_loss`` (Megatron-Core's rerun state machine) on our
    packs: the tensors are ours, the cu_seqlens ours, the loss our supervised-token sum."""
    import torch

    from _bridge_light import tiny_tokenizer

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)  # the step moves device keys to the GPU
    if fmt == "chat":
        rows = [
            {
                "messages": [
                    {"role": "user", "content": f"Say {i}" + " please" * (i % 4)},
                    {"role": "assistant", "content": f"{i} " * (2 + i % 5)},
                ]
            }
            for i in range(24)
        ]
    else:
        rows = [{"prompt": f"Q{i}: " + "what " * (i % 9), "completion": "yes " * (1 + i % 6)} for i in range(24)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = finetune_config(
        bridge,
        mbs=max(mbs, 2),
        gbs=4,
        seq_length=128,
        dataset_seq_length=128,
        cp=1,
        dataset_kw={"enable_in_batch_packing": mbs > 1},
    )
    cfg.dataset.path, cfg.dataset.tokenizer, cfg.dataset.format = str(path), tiny_tokenizer(), fmt
    cfg.dataset.cache_dir = str(tmp_path / "cache")
    train, _, _ = cfg.dataset.build_datasets(
        bridge.config.DatasetBuildContext(train_samples=16, valid_samples=0, test_samples=0)
    )
    loader = bridge.samplers.build_pretraining_data_loader(
        train,
        0,
        "single",
        mbs,
        0,
        True,
        collate_fn=train.collate_fn,
        pin_memory=False,
        data_parallel_rank=0,
        data_parallel_size=1,
        global_batch_size=mbs * 2,
    )
    seen = 0
    for b in loader:
        tokens, labels, loss_mask, attention, positions, cu, cu_argmin, max_seqlen, cu_unpadded, cu_unpadded_argmin = (
            bridge.gpt_step.get_batch(iter([b]), cfg, pg_collection=process_group)
        )
        assert tokens is b["tokens"] and labels is b["labels"] and loss_mask is b["loss_mask"] and attention is None
        assert positions is b["position_ids"] and tokens.shape[0] == 1
        physical = b.get("cu_seqlens_q_padded", b["cu_seqlens_q"])  # left out when equal (Bridge's rule)
        assert int(physical[-1]) == tokens.shape[1] <= 128 * mbs
        params = bridge.gpt_step.get_packed_seq_params(
            {
                "cu_seqlens": cu,
                "cu_seqlens_argmin": cu_argmin,
                "max_seqlen": max_seqlen,
                "cu_seqlens_unpadded": cu_unpadded,
                "cu_seqlens_unpadded_argmin": cu_unpadded_argmin,
            }
        )
        assert type(params).__module__ == "megatron.core.packed_seq_params" and params.qkv_format == "thd"
        assert torch.equal(params.cu_seqlens_q, b["cu_seqlens_q"])
        padded = not torch.equal(physical, b["cu_seqlens_q"])
        assert (cu_unpadded is not None) == padded  # absent when nothing is padded: TE's unpadded kernel
        assert params.cu_seqlens_q_padded is None if not padded else torch.equal(params.cu_seqlens_q_padded, physical)
        assert params.max_seqlen_q == int(b["max_seqlen_q"])
        losses = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(seen))
        loss, num_tokens, _ = bridge.losses.masked_next_token_loss(loss_mask, losses)
        assert int(num_tokens) == b["supervised_tokens"] == int((labels != -100).sum()) > 0
        assert torch.equal(loss, torch.sum(losses.view(-1) * (labels.view(-1) != -100).float()))
        seen += 1
    assert seen == len(train) // mbs
