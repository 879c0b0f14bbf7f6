"""energon_pack.integrations.bridge_sft against Megatron-Bridge's own GPT-step code (PyPI wheel, CPU light import).

Bridge's ``gpt_step.get_batch``, ``get_packed_seq_params``, ``masked_next_token_loss`` (its real file:
the light route stubs ``training.losses``), its samplers and data loader builder, and its offline
packed-SFT collate (``GPTSFTPackedDataset.collate_fn``) run on our GPT-SFT packs. Megatron-Core's
``get_batch_on_this_cp_rank`` (CP 1: the batch unchanged) and the pipeline-stage predicates are the
only replaced functions; ``modelopt`` and HF ``datasets`` (imported at module level, unused here) are
stub packages.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from energon_pack.errors import ConfigError
from energon_pack.integrations import bridge as S
from energon_pack.integrations.bridge import rules
from energon_pack.sft import TokenBudgetBatchSampler

sys.path.insert(0, str(Path(__file__).parents[1]))
from _bridge_light import (  # noqa: E402
    RecipeStandIn,
    _StubFinder,
    bridge_module,
    bridge_version,
    load_bridge,
    tiny_tokenizer,
)

ROOT = Path(__file__).resolve().parents[2]
needs_bridge = pytest.mark.skipif(
    bridge_version() is None, reason="megatron-bridge wheel not installed (setup.sh installs it)"
)
WIDTH = 128


class _ExtraStubs(_StubFinder):
    """``modelopt`` and (when not installed) HF ``datasets``: imported at module level by Bridge's GPT
    step / SFT dataset modules, unused by what runs here."""

    def __init__(self) -> None:
        self.roots = {"modelopt"} | ({"datasets"} if importlib.util.find_spec("datasets") is None else set())

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None


#: names ``data/datasets/gpt_sft.py`` imports from Bridge's ``datasets.utils`` (the light route seeds two)
_UTILS_NAMES = (
    "_chat_preprocess",
    "_get_samples_mapping",
    "_JSONLMemMapDataset",
    "_OnlineSampleMapping",
    "_preprocess",
    "_tokenize",
)
_SCOPED = ("modelopt", "datasets", "megatron.bridge.data.datasets.gpt_sft", "megatron.bridge.data.packing.gpt_sft")


@pytest.fixture(scope="module")
def bridge():
    """Bridge's GPT-step, packed-seq, loss, sampler and packed-SFT modules through the light import.

    The stand-ins needed to import them are scoped to the import: afterwards the finder, the
    placeholder names and the modules imported with them are gone, so other tests import Bridge's
    SFT modules afresh with whatever they provide."""
    root = load_bridge()
    utils = sys.modules["megatron.bridge.data.datasets.utils"]
    added = [name for name in _UTILS_NAMES if not hasattr(utils, name)]
    before, finder = set(sys.modules), _ExtraStubs()
    sys.meta_path.insert(0, finder)
    try:
        for name in added:
            setattr(utils, name, None)
        gpt_step = bridge_module("training.gpt_step")
        packed = bridge_module("data.packing.gpt_sft").GPTSFTPackedDataset
    finally:
        sys.meta_path.remove(finder)
        for name in added:
            delattr(utils, name)
        # the real HF datasets (installed with TRL) stays imported: a second import of it registers its pyarrow
        # extension types twice; only the stubs go
        scoped = [p for p in _SCOPED if p != "datasets" or p in finder.roots]
        for name in set(sys.modules) - before:
            if any(name == p or name.startswith(p + ".") for p in scoped):
                del sys.modules[name]
    spec = importlib.util.spec_from_file_location("bridge_losses_file", root / "training" / "losses.py")
    losses = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(losses)
    return SimpleNamespace(
        gpt_step=gpt_step,
        psu=bridge_module("training.utils.packed_seq_utils"),
        losses=losses,
        samplers=bridge_module("data.samplers"),
        base=bridge_module("data.base"),
        packed=packed,
    )


@pytest.fixture
def gpt_step(bridge, monkeypatch):
    """Bridge's GPT step on CPU: one pipeline stage, CP 1 (Megatron-Core returns the batch as is)."""
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(bridge.gpt_step, "is_pp_first_stage", lambda pp: True)
    monkeypatch.setattr(bridge.gpt_step, "is_pp_last_stage", lambda pp: True)
    monkeypatch.setattr(bridge.gpt_step, "get_batch_on_this_cp_rank", lambda batch, **kw: batch)
    return bridge.gpt_step


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    pc = [{"prompt": f"Q{i}: " + "what " * (i % 9), "completion": "yes " * (1 + i % 6)} for i in range(48)]
    chat = [
        {
            "messages": [
                {"role": "user", "content": f"Say {i}" + " please" * (i % 4)},
                {"role": "assistant", "content": f"{i} " * (2 + i % 5)},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": "ok " * (1 + i % 3)},
            ]
        }
        for i in range(32)
    ]
    return {
        "prompt_completion": write_jsonl(root / "pc.jsonl", pc),
        "chat": write_jsonl(root / "chat.jsonl", chat),
        "cache": root / "cache",
    }


def provider(data, fmt="prompt_completion", **kw):
    kw.setdefault("cache_dir", str(data["cache"]))
    return S.make_bridge_sft_dataset_provider(data[fmt], tiny_tokenizer(), seq_length=WIDTH, format=fmt, **kw)


def train_dataset(bridge, prov, samples=64):
    train, valid, test = prov.build_datasets(
        bridge.base.DatasetBuildContext(train_samples=samples, valid_samples=0, test_samples=0)
    )
    assert valid is None and test is None
    return train


def loader(bridge, ds, *, consumed=0, kind="single", mbs=1, rank=0, dp=1):
    """Bridge's own data loader builder over our pack dataset (what Bridge's setup calls)."""
    return bridge.samplers.build_pretraining_data_loader(
        ds,
        consumed,
        kind,
        mbs,
        0,
        True,
        collate_fn=ds.collate_fn,
        pin_memory=False,
        data_parallel_rank=rank,
        data_parallel_size=dp,
        global_batch_size=mbs * dp * 2,
        seed=1234,
    )


def step_view(gpt_step, batch):
    cfg = SimpleNamespace(model=SimpleNamespace(), dataset=SimpleNamespace())
    pg = SimpleNamespace(pp=None, cp=SimpleNamespace(size=lambda: 1))
    return gpt_step.get_batch(iter([batch]), cfg, pg_collection=pg)


# ------------------------------------------------------------------------------ item 1: Bridge's GPT step
@needs_bridge
@pytest.mark.parametrize("fmt", ["prompt_completion", "chat"])
@pytest.mark.parametrize("mbs", [1, 2])
def test_bridge_gpt_step_and_loss_see_our_batch_exactly(bridge, gpt_step, data, fmt, mbs):
    ds = train_dataset(bridge, provider(data, fmt, cp=2))
    batches = list(loader(bridge, ds, mbs=mbs))
    assert batches and len(batches) == len(ds) // mbs
    gen = torch.Generator().manual_seed(0)
    for b in batches:
        assert b["tokens"].dtype == torch.int64 and b["loss_mask"].dtype == torch.float32
        assert b["cu_seqlens_q"].dtype == torch.int32 and b["tokens"].shape[0] == 1
        tokens, labels, loss_mask, attn, pos, packed = step_view(gpt_step, b)
        assert (
            tokens is b["tokens"] and labels is b["labels"] and loss_mask is b["loss_mask"] and pos is b["position_ids"]
        )
        assert attn is None
        cu_phys = physical(b)
        padded = ["cu_seqlens_q_padded", "cu_seqlens_kv_padded"] if "cu_seqlens_q_padded" in b else []
        assert ("cu_seqlens_q_padded" in b) == (not torch.equal(cu_phys, b["cu_seqlens_q"]))
        assert sorted(packed) == sorted(["cu_seqlens_q", "cu_seqlens_kv", *padded, "max_seqlen_q", "max_seqlen_kv"])
        params = bridge.psu.get_packed_seq_params(packed)
        assert params.qkv_format == "thd" and params.max_seqlen_q == int(b["max_seqlen_q"]) == params.max_seqlen_kv
        assert torch.equal(params.cu_seqlens_q, b["cu_seqlens_q"])
        assert params.cu_seqlens_q_padded is None if not padded else torch.equal(params.cu_seqlens_q_padded, cu_phys)
        assert int(cu_phys[-1]) == b["tokens"].shape[1] and set(cu_phys.diff().tolist()) <= set(range(0, 10**6, 4))
        assert torch.equal(bridge.gpt_step._cu_seqlens_for_cp_partition(b), cu_phys)  # CP slicing: physical
        losses = torch.rand(b["tokens"].shape, generator=gen)
        loss, num_tokens, report = bridge.losses.masked_next_token_loss(loss_mask, losses, check_for_nan_in_loss=False)
        assert int(num_tokens) == b["supervised_tokens"] == int((b["labels"] != -100).sum()) > 0
        assert torch.equal(loss, torch.sum(losses.view(-1) * b["loss_mask"].view(-1)))
        assert b["num_segments"] == len(b["cu_seqlens_q"]) - 1
        # Bridge <= 0.5 reads only the legacy names: the same parameters from Bridge's legacy branch
        legacy = {k: v for k, v in b.items() if not k.startswith(("cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_"))}
        *_, legacy_packed = step_view(gpt_step, legacy)
        unpadded = [] if padded else ["cu_seqlens_unpadded", "cu_seqlens_unpadded_argmin"]  # unpadded path
        assert sorted(legacy_packed) == sorted(set(S.LEGACY_KEYS) - set(unpadded))
        old = bridge.psu.get_packed_seq_params(legacy_packed)
        assert torch.equal(old.cu_seqlens_q, b["cu_seqlens_q"])
        assert old.cu_seqlens_q_padded is None if not padded else torch.equal(old.cu_seqlens_q_padded, cu_phys)
        assert old.max_seqlen_q == params.max_seqlen_q
        assert torch.equal(bridge.gpt_step._cu_seqlens_for_cp_partition(legacy), cu_phys)


def physical(b: dict) -> torch.Tensor:
    """The physical (padded) boundaries: absent from the batch when equal to the logical ones (Bridge's rule)."""
    return b.get("cu_seqlens_q_padded", b["cu_seqlens_q"])


class _TinyGPT(torch.nn.Module):
    """Embedding + head; returns per-token cross entropy [1, T] as Megatron's GPTModel does with labels."""

    def __init__(self, vocab=152000):
        super().__init__()
        self.emb, self.calls = torch.nn.Embedding(vocab, 8), []
        self.head = torch.nn.Linear(8, vocab)
        torch.manual_seed(0)

    def forward(self, **kwargs):
        input_ids, labels = kwargs["input_ids"], kwargs["labels"]
        self.calls.append((kwargs.get("packed_seq_params"), kwargs))
        logits = self.head(self.emb(input_ids[0]))
        return torch.nn.functional.cross_entropy(logits, labels[0].clamp(min=0), reduction="none")[None]


@needs_bridge
def test_bridge_forward_step_loss_equals_ours(bridge, gpt_step, data, monkeypatch):
    """Bridge's whole ``forward_step`` (batch, packed params, model call, its loss function) on our packs:
    the loss and token count it returns equal the cross entropy over our labels != -100."""
    pg = SimpleNamespace(pp=None, cp=SimpleNamespace(size=lambda: 1))
    monkeypatch.setattr(
        gpt_step, "get_model_config", lambda model: SimpleNamespace(mtp_num_layers=None, seq_length=WIDTH)
    )
    monkeypatch.setattr(gpt_step, "get_pg_collection", lambda model: pg)
    monkeypatch.setattr(gpt_step, "get_model_chunk_vp_stage", lambda model: None)
    monkeypatch.setattr(
        gpt_step, "accumulate_flops_metadata", lambda *a, **k: None
    )  # Bridge's FLOPs counter: stubbed module
    monkeypatch.setattr(gpt_step, "masked_next_token_loss", bridge.losses.masked_next_token_loss)  # Bridge's real file

    class Timer:
        def __call__(self, *a, **k):
            return self

        start = stop = __enter__ = __exit__ = lambda self, *a: None

    state = SimpleNamespace(
        timers=Timer(),
        straggler_timer=Timer(),
        cfg=SimpleNamespace(
            model=SimpleNamespace(),
            dataset=SimpleNamespace(),
            rerun_state_machine=SimpleNamespace(check_for_nan_in_loss=False, check_for_spiky_loss=False),
        ),
    )
    model = _TinyGPT()
    ds = train_dataset(bridge, provider(data, "chat", tp=2, sp=True))
    for b in list(loader(bridge, ds))[:4]:
        with torch.no_grad():
            output, loss_fn = gpt_step.forward_step(state, iter([b]), model)
            loss, num_tokens, _ = loss_fn(output)
            logits = model.head(model.emb(b["tokens"][0]))
            ours = torch.nn.functional.cross_entropy(logits, b["labels"][0], ignore_index=-100, reduction="sum")
        assert int(num_tokens) == b["supervised_tokens"] and torch.allclose(loss, ours, rtol=1e-5)
        params, kwargs = model.calls[-1]
        # no loss_mask reaches the model (Bridge #6103): an MTP loss there would cover prompts and padding,
        # which is why check_bridge_sft_config refuses model.mtp_num_layers
        assert sorted(kwargs) == ["attention_mask", "input_ids", "labels", "packed_seq_params", "position_ids"]
        assert params.qkv_format == "thd" and torch.equal(params.cu_seqlens_q, b["cu_seqlens_q"])
        kv = params.cu_seqlens_kv if params.cu_seqlens_kv_padded is None else params.cu_seqlens_kv_padded
        assert torch.equal(kv, physical(b)) and params.max_seqlen_kv == int(b["max_seqlen_q"])


@needs_bridge
@pytest.mark.parametrize("mbs", [1, 2])
def test_static_shapes_for_cuda_graphs(bridge, gpt_step, data, mbs):
    """pad_to_max_length + pad_cu_seqlens + max_segments: every batch has one shape, Bridge's params too."""
    ds = train_dataset(bridge, provider(data, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=6))
    shapes = set()
    for b in loader(bridge, ds, mbs=mbs):
        *_, loss_mask, _, _, packed = step_view(gpt_step, b)
        params = bridge.psu.get_packed_seq_params(packed)
        shapes.add(
            (
                tuple(b["tokens"].shape),
                tuple(params.cu_seqlens_q.shape),
                tuple(params.cu_seqlens_q_padded.shape),
                params.max_seqlen_q,
            )
        )
        assert int(loss_mask.sum()) == b["supervised_tokens"]
    assert shapes == {((1, WIDTH * mbs), (6 * mbs + 1,), (6 * mbs + 1,), WIDTH * mbs)}


@needs_bridge
@pytest.mark.parametrize("fmt", ["prompt_completion", "chat"])
def test_supervised_pairs_equal_bridge_offline_packed_collate(bridge, data, fmt):
    """Bridge's packed SFT collate drops each segment's last token where we keep it with label -100:
    the same samples packed as Bridge's offline packer stores them (loss_mask = target[1:] + [False],
    Bridge's ``fill_packing_strategy``) give the same supervised (input, label) pairs and count."""
    ds = train_dataset(bridge, provider(data, fmt))
    theirs = object.__new__(bridge.packed)
    theirs.__dict__.update(
        answer_only_loss=True,
        tokenizer=SimpleNamespace(eos_id=-1),
        pad_to_max_length=False,
        max_seq_length=WIDTH,
        pad_seq_length_to_mult=16,
        _pad_seq_to_mult=1,
        pad_cu_seqlens=False,
        return_cu_seqlen=True,
        ceil_to_power_2=False,
    )
    for i in range(len(ds)):
        samples = ds[i]
        ours = ds.collate_fn([samples])
        ids, mask, starts = [], [], []
        for s in samples:
            starts.append(len(ids))
            ids += s.input_ids.tolist()
            mask += s.target_mask[1:].tolist() + [False]
        out = theirs.collate_fn([{"input_ids": ids, "seq_boundaries": starts + [len(ids)], "loss_mask": mask}])
        sel_t, sel_o = out["loss_mask"][0].bool(), ours["loss_mask"][0].bool()
        assert int(out["loss_mask"].sum()) == ours["supervised_tokens"]
        assert torch.equal(out["tokens"][0][sel_t], ours["tokens"][0][sel_o])
        assert torch.equal(out["labels"][0][sel_t], ours["labels"][0][sel_o])
        assert (out["cu_seqlens_q"][0].diff()[: len(samples)] + 1).tolist() == ours["cu_seqlens_q"].diff().tolist()


@needs_bridge
@pytest.mark.parametrize("kind, mbs", [("single", 1), ("cyclic", 1), ("single", 2)])
def test_exact_resume_through_bridges_consumed_samples(bridge, data, kind, mbs):
    """Bridge restarts its sampler at ``consumed_train_samples``: a rebuilt provider on every DP rank
    continues with exactly the batches of the uninterrupted run."""
    dp, steps_done = 2, 3
    gbs = mbs * dp * 2
    for rank in range(dp):
        dl = loader(
            bridge, train_dataset(bridge, provider(data, dataloader_type=kind)), kind=kind, mbs=mbs, rank=rank, dp=dp
        )
        full = list(dl) + (list(dl) if kind == "cyclic" else [])  # cyclic: Bridge's cyclic_iter starts epoch 2
        consumed = steps_done * gbs + (len(dl.dataset) // (mbs * dp) * mbs * dp if kind == "cyclic" else 0)
        resumed = list(
            loader(
                bridge,
                train_dataset(bridge, provider(data, dataloader_type=kind)),
                consumed=consumed,
                kind=kind,
                mbs=mbs,
                rank=rank,
                dp=dp,
            )
        )
        skip = consumed // dp // mbs
        assert len(resumed) == len(full) - skip > 0
        for a, b in zip(full[skip:], resumed):
            for key in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens_q"):
                assert torch.equal(a[key], b[key])
            assert torch.equal(physical(a), physical(b))
            assert a["__keys__"] == b["__keys__"]


@needs_bridge
def test_worker_processes_give_the_same_batches(bridge, data):
    ds = train_dataset(bridge, provider(data), samples=12)
    inline = list(loader(bridge, ds, mbs=2))
    workers = list(
        bridge.samplers.build_pretraining_data_loader(
            ds, 0, "single", 2, 2, True, collate_fn=ds.collate_fn, pin_memory=False, persistent_workers=False
        )
    )
    assert len(inline) == len(workers) > 0
    for a, b in zip(inline, workers):
        assert all(torch.equal(a[k], b[k]) for k in ("tokens", "labels", "loss_mask")) and torch.equal(
            physical(a), physical(b)
        )


@needs_bridge
def test_ranks_share_each_epochs_packs_once_and_epochs_differ(bridge, data):
    ds = train_dataset(bridge, provider(data), samples=10**3)
    assert ds.epochs > 1 and len(ds) >= 10**3
    per_epoch = [sorted(i for j in range(ds._first[e], ds._first[e + 1]) for i in ds.pack_indices(j)) for e in range(2)]
    usable = sorted(int(i) for i in (ds.dataset.lengths > 0).nonzero()[0])
    assert per_epoch[0] == per_epoch[1] == usable
    assert ds.pack_indices(0) != ds.pack_indices(ds._first[1]) or ds.pack_indices(1) != ds.pack_indices(
        ds._first[1] + 1
    )
    dealt = [
        i
        for rank in range(2)
        for batch in bridge.samplers.MegatronPretrainingSampler(
            total_samples=len(ds), consumed_samples=0, micro_batch_size=1, data_parallel_rank=rank, data_parallel_size=2
        )
        for i in batch
    ]
    assert sorted(dealt) == list(range(len(ds) - len(ds) % 2))  # Bridge deals each pack to one rank once
    pad = ds.collate_fn([ds[-1]])
    assert pad["supervised_tokens"] == 0 and pad["padding_segments"] == 1


@needs_bridge
def test_provider_is_a_bridge_dataset_provider(bridge, data):
    prov = provider(data, valid_path=str(data["prompt_completion"]))
    assert isinstance(prov, bridge.base.DatasetProvider) and prov.dataloader_type == "single"
    prov.num_workers = 0
    prov.finalize()  # Bridge's DataloaderConfig.finalize
    assert prov.persistent_workers is False
    train, valid, _ = prov.build_datasets(
        bridge.base.DatasetBuildContext(train_samples=5, valid_samples=3, test_samples=0)
    )
    assert len(train) >= 5 and len(valid) >= 3


@needs_bridge
def test_provider_passes_compute_balance_to_its_sampler(bridge, data):
    """balance="compute" reaches the sampler: its packs are the compute-balanced plan (not the tokens-only one),
    every usable line once per epoch, and the mode is in the sampler's resume record."""
    tokens = train_dataset(bridge, provider(data, balance="tokens"), samples=20)
    compute = train_dataset(bridge, provider(data, balance="compute", cost_model="qwen2-vl-2b"), samples=20)
    assert compute.sampler.balance == "compute" and tokens.sampler.balance == "tokens"
    assert train_dataset(bridge, provider(data), samples=20).sampler.balance == "compute"  # the default
    assert compute.sampler.state_dict()["config"]["balance"] == "compute"
    ds = compute.dataset
    expected = TokenBudgetBatchSampler(ds, WIDTH, balance="compute", cost_model="qwen2-vl-2b")  # one seed default
    first = compute._first[1]
    assert [compute.pack_indices(j) for j in range(first)] == [list(p) for p in expected.plan(0)]
    assert [tokens.pack_indices(j) for j in range(tokens._first[1])] != [compute.pack_indices(j) for j in range(first)]
    usable = sorted(int(i) for i in (ds.lengths > 0).nonzero()[0])
    assert sorted(i for j in range(first) for i in compute.pack_indices(j)) == usable


# ------------------------------------------------------------------------------ item 3: the configuration check
GOOD = dict(
    route="in_batch",
    micro_batch_size=1,
    global_batch_size=8,
    data_parallel_size=4,
    model_seq_length=4096,
    dataset_seq_length=4096,
)


def check(**kw):
    with pytest.raises(ConfigError) as err:
        S.check_gpt_sft_config(**{**GOOD, **kw})
    return err.value


def test_good_configs_pass():
    S.check_gpt_sft_config(**GOOD)
    S.check_gpt_sft_config(**{**GOOD, "micro_batch_size": 2})  # in-batch: MBS > 1 allowed
    S.check_gpt_sft_config(**{**GOOD, "context_parallel_size": 4, "pad_seq_to_mult": 16})  # a multiple of lcm = 8
    S.check_gpt_sft_config(
        **{
            **GOOD,
            "route": "offline",
            "packed_sequence_size": 4096,
            "context_parallel_size": 2,
            "tensor_model_parallel_size": 4,
            "sequence_parallel": True,
            "pad_seq_to_mult": 8,
            "pad_to_max_length": True,
            "pad_cu_seqlens": True,
            "cuda_graphs": True,
            "packing_metadata": [
                {
                    "max_samples_per_bin": 9,
                    **S.pack_topology_record(
                        packed_sequence_size=4096,
                        context_parallel_size=2,
                        tensor_model_parallel_size=4,
                        sequence_parallel=True,
                    ),
                }
            ],
        }
    )


def test_rule_offline_packs_need_micro_batch_size_1():
    assert str(check(route="offline", micro_batch_size=2)) == (
        "train.micro_batch_size: is 2; an offline pack is one micro-batch. "
        "Fix: set train.micro_batch_size=1 and global_batch_size=4 (in packs)"
    )


@pytest.mark.parametrize("gbs", [6, 2])
def test_rule_global_batch_size_multiple_of_dp(gbs):
    assert str(check(global_batch_size=gbs)) == (
        f"train.global_batch_size: is {gbs}; it must be a positive multiple of micro_batch_size x data_parallel_size "
        "= 1 x 4. Fix: set train.global_batch_size to a multiple of 4"
    )


def test_two_wrong_knobs_are_named_in_one_error():
    """A config with two mistakes is told both at once (one round of fixes), each still readable alone."""
    err = check(global_batch_size=6, model_seq_length=8192)
    assert [e.knob for e in err.errors] == ["train.global_batch_size", "model.seq_length"]
    assert err.knob == "train.global_batch_size, model.seq_length"
    assert str(err) == (
        "train.global_batch_size, model.seq_length: 2 settings are wrong:\n  "
        + "\n  ".join(str(e) for e in err.errors)
        + ". Fix: change each setting as listed"
    )
    assert str(err.errors[1]) == str(check(model_seq_length=8192))


def test_rule_model_and_dataset_seq_length_equal():
    assert str(check(model_seq_length=8192)) == (
        "model.seq_length: is 8192 but dataset.seq_length is 4096. Fix: set both to the pack width (4096)"
    )


def test_rule_packed_sequence_size_equals_dataset_seq_length():
    assert str(check(route="offline", packed_sequence_size=2048)) == (
        "packed_sequence_size: is 2048 but dataset.seq_length is 4096. "
        "Fix: pack with packed_sequence_size=4096 into a fresh output root"
    )


def test_rule_pad_seq_to_mult_is_the_lcm():
    assert str(
        check(context_parallel_size=2, tensor_model_parallel_size=4, sequence_parallel=True, pad_seq_to_mult=4)
    ) == (
        "pad_seq_to_mult: is 4; CP=2, TP=4, SP=True need a multiple of "
        "lcm(2*CP if CP > 1, CP*TP if SP and TP > 1) = 8. "
        "Fix: set pad_seq_to_mult=8 and re-pack into a fresh output root"
    )


def test_rule_width_divisible_by_the_alignment():
    assert str(check(model_seq_length=4100, dataset_seq_length=4100, context_parallel_size=4)) == (
        "dataset.seq_length: 4100 is not divisible by the alignment 8. Fix: use a multiple of 8"
    )


def test_rule_pad_cu_seqlens_needs_fixed_width():
    assert str(check(pad_cu_seqlens=True, max_segments=16)) == (
        "pad_to_max_length: is False; pad_cu_seqlens needs a fixed width. Fix: set pad_to_max_length=True"
    )


def test_rule_cuda_graphs_need_pad_cu_seqlens():
    assert str(check(cuda_graphs=True, pad_to_max_length=True, max_segments=16)) == (
        "pad_cu_seqlens: is False; CUDA graphs need static cu_seqlens shapes. Fix: set pad_cu_seqlens=True"
    )


def test_rule_static_cu_seqlens_need_metadata_or_max_segments():
    assert str(check(route="offline", pad_cu_seqlens=True, pad_to_max_length=True)) == (
        "packing_metadata: is missing; static cu_seqlens are sized from a packing-metadata JSON. "
        "Fix: write the packing-metadata JSON beside the packs"
    )
    assert str(check(pad_cu_seqlens=True, pad_to_max_length=True)) == (
        "max_segments: is missing; static cu_seqlens are sized from max_segments. Fix: set max_segments"
    )


def test_rule_topology_changed_since_packing():
    recorded = S.pack_topology_record(packed_sequence_size=4096, tensor_model_parallel_size=4, sequence_parallel=True)
    assert str(
        check(route="offline", packing_metadata=[{"max_samples_per_bin": 3}, recorded], context_parallel_size=4)
    ) == (
        "packing_metadata: the packs were built for another configuration (pad_seq_to_mult 4 -> 8, "
        "context_parallel_size "
        "1 -> 4, tensor_model_parallel_size 4 -> 1, sequence_parallel True -> False). "
        "Fix: re-pack for the current settings into a fresh output root"
    )


def test_offline_route_reads_pack_offline_metadata(data, tmp_path):
    """The metadata ``pack-offline`` writes (Bridge's list, our entry inside) drives the topology rule."""
    pytest.importorskip("pyarrow")
    from energon_pack.sft.pack_offline import pack_offline

    summary = pack_offline(
        data["prompt_completion"],
        tmp_path / "packs",
        seq_length=WIDTH,
        tokenizer=tiny_tokenizer(),
        tp=4,
        sp=True,
        workers=1,
        cache_dir=data["cache"],
    )
    meta = json.loads(Path(summary.metadata_path).read_text())
    kw = dict(
        route="offline",
        micro_batch_size=1,
        global_batch_size=8,
        data_parallel_size=4,
        model_seq_length=WIDTH,
        dataset_seq_length=WIDTH,
        packed_sequence_size=WIDTH,
        tensor_model_parallel_size=4,
        sequence_parallel=True,
        pad_seq_to_mult=4,
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        cuda_graphs=True,
        packing_metadata=meta,
    )
    S.check_gpt_sft_config(**kw)
    with pytest.raises(ConfigError) as err:
        S.check_gpt_sft_config(
            **{
                **kw,
                "tensor_model_parallel_size": 2,
                "model_seq_length": 2 * WIDTH,
                "dataset_seq_length": 2 * WIDTH,
                "packed_sequence_size": 2 * WIDTH,
            }
        )
    assert str(err.value) == (
        "packing_metadata: the packs were built for another configuration "
        f"(packed_sequence_size {WIDTH} -> {2 * WIDTH}, "
        "tensor_model_parallel_size 4 -> 2). Fix: re-pack for the current settings into a fresh output root"
    )


def test_batch_sizes_must_be_positive_and_the_provider_ours():
    assert str(check(data_parallel_size=0)) == (
        "data_parallel_size: must be an int >= 1, got 0. Fix: set data_parallel_size to a positive integer"
    )
    with pytest.raises(TypeError, match="not make_bridge_sft_dataset_provider's provider"):
        S.check_bridge_sft_config(SimpleNamespace(dataset=SimpleNamespace(seq_length=4096)))


def test_every_wrong_knob_in_one_error():
    err = check(route="offline", micro_batch_size=2, global_batch_size=6, model_seq_length=8192, cuda_graphs=True)
    assert [e.knob for e in err.errors] == [
        "train.micro_batch_size",
        "train.global_batch_size",
        "model.seq_length",
        "pad_to_max_length",
        "pad_cu_seqlens",
        "packing_metadata",
    ]
    assert err.knob == ", ".join(e.knob for e in err.errors) and str(err).count("Fix:") == 7


# ------------------------------------------------------------------------------ a Bridge config
def sft_recipe_cfg(data, **provider_kw):
    """Bridge's Qwen3-8B SFT recipe (literal settings replayed, tests/_bridge_light.RecipeStandIn) with our provider."""
    cfg = RecipeStandIn().build("megatron.bridge.recipes.qwen.h100.qwen3", "qwen3_8b_sft_4gpu_h100_bf16_config")
    cfg.dataset = S.make_bridge_sft_dataset_provider(
        data["prompt_completion"], tiny_tokenizer(), seq_length=2048, tp=4, **provider_kw
    )
    return cfg


@needs_bridge
def test_bridge_recipe_with_our_provider(data, bridge):
    cfg = sft_recipe_cfg(data)
    assert cfg.model.tensor_model_parallel_size == 4 and cfg.train.global_batch_size == 32
    with pytest.raises(ConfigError) as err:
        S.check_bridge_sft_config(cfg, data_parallel_size=2, forward_step_func=bridge.gpt_step.forward_step)
    assert err.value.knob == "model.calculate_per_token_loss"  # the recipe's only knob our packs need changed
    cfg.model.calculate_per_token_loss = True
    S.check_bridge_sft_config(cfg, data_parallel_size=2, forward_step_func=bridge.gpt_step.forward_step)


@needs_bridge
@pytest.mark.parametrize(
    "path, value, knob",
    [
        ("dataset.dataloader_type", "batch", "dataset.dataloader_type"),
        ("ddp.average_in_collective", True, "ddp.average_in_collective"),
        ("dataset.enable_in_batch_packing", True, "dataset.enable_in_batch_packing"),
        ("model.pipeline_model_parallel_size", 2, "dataset.enable_in_batch_packing"),
        ("model.context_parallel_size", 2, "model.context_parallel_size"),
        ("model.seq_length", 4096, "model.seq_length"),
        ("model.cuda_graph_impl", "transformer_engine", "pad_to_max_length, pad_cu_seqlens, max_segments"),
        ("train.global_batch_size", 3, "train.global_batch_size"),
        ("model.mtp_num_layers", 1, "model.mtp_num_layers"),
    ],
)
def test_bridge_config_names_the_wrong_knob(data, path, value, knob):
    cfg = sft_recipe_cfg(data)
    cfg.model.calculate_per_token_loss = True
    owner, _, attr = path.rpartition(".")
    setattr(rules.get(cfg, owner), attr, value)
    with pytest.raises(ConfigError) as err:
        S.check_bridge_sft_config(cfg, data_parallel_size=2)
    assert err.value.knob == knob


@needs_bridge
def test_bridge_config_forward_step_and_micro_batches(data, bridge):
    cfg = sft_recipe_cfg(data, enable_in_batch_packing=True)
    cfg.model.calculate_per_token_loss = True
    cfg.train.micro_batch_size = 2  # in-batch: two packs a row; Bridge's own rule then wants the flag set
    S.check_bridge_sft_config(cfg, data_parallel_size=2)
    with pytest.raises(ConfigError) as err:
        S.check_bridge_sft_config(cfg, data_parallel_size=2, forward_step_func=bridge.losses.masked_next_token_loss)
    assert err.value.knob == "forward_step_func"


# ------------------------------------------------------------------------------ the docs' block, as written
def readme_block() -> str:
    """The python block under the Bridge guide's "GPT-SFT JSONL with Bridge's GPT step" heading, as written."""
    from _docs import doc_block

    return doc_block("docs/guides/megatron_bridge.md", "GPT-SFT JSONL with Bridge's GPT step")


@pytest.fixture
def readme_world(bridge, data, tmp_path, monkeypatch):
    """The block's world: ``sft.jsonl`` in cwd, the recipe stand-in, a small tokenizer for the hub one,
    finetune recorded."""
    import transformers

    monkeypatch.chdir(tmp_path)
    shutil.copy(data["chat"], tmp_path / "sft.jsonl")
    calls = []
    recipe = types.ModuleType("megatron.bridge.recipes.qwen.qwen3")
    recipe.qwen3_8b_sft_config = lambda: RecipeStandIn().build(
        "megatron.bridge.recipes.qwen.h100.qwen3", "qwen3_8b_sft_4gpu_h100_bf16_config"
    )
    finetune = types.ModuleType("megatron.bridge.training.finetune")
    finetune.finetune = lambda cfg, forward_step_func: calls.append((cfg, forward_step_func))
    monkeypatch.setitem(sys.modules, recipe.__name__, recipe)
    monkeypatch.setitem(sys.modules, finetune.__name__, finetune)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda name, **kw: tiny_tokenizer())
    return calls


@needs_bridge
def test_readme_block_runs_as_written_and_feeds_bridges_step(readme_world, bridge, gpt_step):
    exec(compile(readme_block(), "README.md", "exec"), {})
    ((cfg, step),) = readme_world
    assert step is bridge.gpt_step.forward_step and cfg.dataset.format == "chat"
    ds = train_dataset(bridge, cfg.dataset, samples=4)
    batch = next(iter(loader(bridge, ds)))
    tokens, labels, loss_mask, _, _, packed = step_view(gpt_step, batch)
    assert tokens.shape[1] == int(physical(batch)[-1]) <= 2048 and int(loss_mask.sum()) > 0
    assert torch.equal(bridge.psu.get_packed_seq_params(packed).cu_seqlens_q, batch["cu_seqlens_q"])


@needs_bridge
def test_readme_block_each_cfg_line_is_needed(readme_world):
    block = readme_block()
    line = next(x for x in block.splitlines() if x.startswith("cfg.model.calculate_per_token_loss"))
    with pytest.raises(ConfigError) as err:
        exec(compile(block.replace(line + "\n", ""), "README.md", "exec"), {})
    assert err.value.knob == "model.calculate_per_token_loss" and not readme_world
    with pytest.raises(ConfigError) as err:
        exec(
            compile(block.replace("tp=4", "tp=1"), "README.md", "exec"),
            {},
        )
    assert err.value.knob == "model.tensor_model_parallel_size"
