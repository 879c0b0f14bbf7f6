"""energon_pack.integrations.bridge against Megatron-Bridge's own code (PyPI release, CPU light import).

Bridge (setup.sh installs megatron-bridge with --no-deps) is imported through tests/_bridge_light.py;
the tests that run Bridge's code fail rather than skip when it is installed, and skip with a reason
only when the wheel is absent.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import webdataset as wds
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from PIL import Image

from energon_pack.errors import ConfigError
from energon_pack.integrations import bridge as B
from energon_pack.integrations.bridge import mtp as M
from energon_pack.integrations.bridge import provider as bridge_provider
from energon_pack.integrations.bridge import rules
from energon_pack.qwen_vl import get_preset
from energon_pack.thd import PADDED_BOUNDARY_KEYS

sys.path.insert(0, str(Path(__file__).parents[1]))
from _bridge_light import PackedSeqParams, bridge_module, bridge_version, load_bridge, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
needs_bridge = pytest.mark.skipif(
    bridge_version() is None, reason="megatron-bridge wheel not installed (setup.sh installs it)"
)

# Bridge's dataset.yaml as its tutorial/example preparers write it
# (examples/models/qwen/qwen3_vl/prepare_mantis_energon.py, with the `videos` field of its ChatMLSample added).
BRIDGE_DATASET_YAML = """\
__module__: megatron.bridge.data.energon.task_encoder_utils
__class__: ChatMLWebdataset
field_map:
  imgs: jpgs
  conversation: json
  videos: videos
subflavors: {}
"""
N_MEDIA, N_TEXT = 6, 4
KEYS = sorted([f"m{i}" for i in range(N_MEDIA)] + [f"t{i}" for i in range(N_TEXT)])


def jpeg(w, h, seed):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def write_bridge_dataset(root, text=True):
    """A ChatML WebDataset laid out and prepared as Bridge does: json + pickled jpgs/videos members,
    Energon's preparation API with split regexes, and Bridge's ChatMLWebdataset dataset.yaml."""
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    with wds.ShardWriter(str(root / "train-shard-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(N_MEDIA):
            conv = [
                {"from": "human", "value": "<image>\n<video>\nWhat happens?"},
                {"from": "gpt", "value": f"clip {i}"},
            ]
            sink.write(
                {
                    "__key__": f"m{i}",
                    "json": json.dumps(conv).encode(),
                    "jpgs": pickle.dumps([jpeg(56 + 8 * i, 40, i)]),
                    "videos": pickle.dumps([[jpeg(64, 48, 100 * i + f) for f in range(3)]]),
                }
            )
        for i in range(N_TEXT if text else 0):
            conv = [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": f"{i} " * (3 + i)}]
            sink.write({"__key__": f"t{i}", "json": json.dumps(conv).encode()})
    shards = sorted(p.name for p in root.glob("*.tar"))
    BaseWebdatasetFactory.prepare_dataset(
        root, shards, split_parts_patterns=[("train", "train-shard-.*")], shuffle_seed=None, workers=1
    )
    (root / ".nv-meta" / "dataset.yaml").write_text(BRIDGE_DATASET_YAML)
    return root


@pytest.fixture(scope="module")
def bridge_dataset(tmp_path_factory):
    return write_bridge_dataset(tmp_path_factory.mktemp("bridge_ds"))


def stream(path, te, **kw):
    ds = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
        **kw,
    )
    return list(get_loader(ds))


def listing(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def packs25(bridge_dataset, tmp_path_factory):
    """Qwen2.5-VL packs of the Bridge dataset, read in place through the crude path."""
    load_bridge()  # so visual_inputs is Bridge's own GenericVisualInputs
    before = listing(bridge_dataset)
    kwargs = B.bridge_dataset_kwargs(bridge_dataset, config_dir=tmp_path_factory.mktemp("cfg"))
    te = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset="qwen2.5-vl",
        seq_length=1024,
        cp=2,
        tp=2,
        sp=True,
        pad_to_max_length=True,
        bridge_position_ids="mrope",
    )
    batches = stream(bridge_dataset, te, **kwargs)
    assert listing(bridge_dataset) == before  # nothing written into Bridge's dataset
    return te, batches


# ------------------------------------------------------------------------------ the batch form
def test_bridge_dataset_streams_every_sample_once_with_media(packs25):
    te, batches = packs25
    assert sorted(k for b in batches for k in b["__keys__"]) == KEYS
    vi = [b["visual_inputs"] for b in batches]
    n_images = sum(int(v.image_grid_thw.shape[0]) for v in vi if v.image_grid_thw is not None)
    n_videos = sum(int(v.video_grid_thw.shape[0]) for v in vi if v.video_grid_thw is not None)
    assert (n_images, n_videos) == (N_MEDIA, N_MEDIA)
    for b in batches:
        media = sum(k.startswith("m") for k in b["__keys__"])
        ids = b["input_ids"][0]
        v = b["visual_inputs"]
        if media:
            assert v.pixel_values.shape == (int(v.image_grid_thw.prod(1).sum()), 3 * 2 * 14 * 14)
            assert v.pixel_values_videos.shape == (int(v.video_grid_thw.prod(1).sum()), 3 * 2 * 14 * 14)
            assert torch.equal(v.video_grid_thw[:, 0], torch.full((media,), 2))
            assert v.second_per_grid_ts.tolist() == [1.0] * media
            assert int((ids == te.tokenizer.special.image_pad).sum()) == int(v.image_grid_thw.prod(1).sum()) // 4
        else:
            assert all(
                getattr(v, f) is None
                for f in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
            )


def test_batch_has_exactly_bridge_keys_shapes_dtypes(packs25):
    te, batches = packs25
    generic = bridge_module("training.utils.visual_inputs").GenericVisualInputs
    for b in batches:
        assert set(b) == set(B.BRIDGE_BATCH_KEYS) | set(B.METADATA_KEYS)
        T = 1024
        assert b["input_ids"].shape == (1, T) and b["input_ids"].dtype == torch.int64
        assert b["labels"].shape == (1, T) and b["labels"].dtype == torch.int64
        assert b["loss_mask"].shape == (1, T) and b["loss_mask"].dtype == torch.float32
        assert b["position_ids"].shape == (3, 1, T) and b["position_ids"].dtype == torch.int64
        assert b["attention_mask"] is None
        assert type(b["visual_inputs"]) is generic
        n = len(b["__keys__"])
        for k in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
            assert b[k].dtype == torch.int32 and b[k].shape == (n + 1,)
        assert b["cu_seqlens_q_padded"][-1] == T and b["total_tokens"] == T
        assert te.layout.pad_multiple == 4 and torch.all(b["cu_seqlens_q_padded"][:-1] % 4 == 0)  # lcm(2*CP, CP*TP) = 4
        for k in ("max_seqlen_q", "max_seqlen_kv"):
            assert b[k].dtype == torch.int32 and b[k].dim() == 0
        assert int(b["max_seqlen_q"]) == int(b["cu_seqlens_q_padded"].diff().max())
        assert torch.equal((b["labels"] != -100).float(), b["loss_mask"])


def test_auto_position_mode_and_flat_batches():
    te25 = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=256)
    te3 = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen3-vl", seq_length=256)
    assert (te25.bridge_position_ids, te3.bridge_position_ids) == ("flat", "mrope")
    with pytest.raises(ConfigError, match="bridge_position_ids"):
        B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", seq_length=256, bridge_position_ids="3d")


def test_fallback_visual_inputs_behaves_like_bridge():
    load_bridge()
    generic = bridge_module("training.utils.visual_inputs").GenericVisualInputs
    assert [f.name for f in dataclasses.fields(generic)] == [f.name for f in dataclasses.fields(B.VisualInputs)]
    cases = [
        dict(
            pixel_values=torch.randn(2, 3, 4, 5, 6),
            image_grid_thw=torch.ones(2, 3, 3, dtype=torch.long),
            pixel_values_videos=torch.randn(1, 2, 4, 5, 6),
            video_grid_thw=torch.ones(1, 2, 3, dtype=torch.long),
        ),
        dict(
            pixel_values=torch.randn(7, 1176),
            image_grid_thw=torch.ones(2, 3, dtype=torch.long),
            second_per_grid_ts=torch.ones(1),
        ),
        dict(),
    ]
    for case in cases:
        theirs, ours = generic(**case).normalized_for_model(), B.VisualInputs(**case).normalized_for_model()
        assert sorted(theirs) == sorted(ours)
        for k in theirs:
            assert theirs[k].shape == ours[k].shape and torch.equal(theirs[k], ours[k])
    assert B.bridge_visual_inputs_class() is generic


# ------------------------------------------------------------------------------ Bridge's step on our batches
@pytest.fixture
def cpu_cuda(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)


@needs_bridge
def test_bridge_get_batch_keeps_everything_on_converted_batches(packs25, cpu_cuda, monkeypatch):
    te, batches = packs25
    vlm_step = bridge_module("training.vlm_step")
    psu = bridge_module("training.utils.packed_seq_utils")
    monkeypatch.setattr(vlm_step, "is_pp_first_stage", lambda pp: True)
    monkeypatch.setattr(vlm_step, "is_pp_last_stage", lambda pp: True)
    cfg = SimpleNamespace(dataset=SimpleNamespace())
    for b in batches:
        tokens, labels, loss_mask, attn, pos, packed, visual = vlm_step.get_batch(
            iter([b]), cfg, pg_collection=SimpleNamespace(pp=None)
        )
        assert (
            tokens is b["input_ids"]
            and labels is b["labels"]
            and loss_mask is b["loss_mask"]
            and pos is b["position_ids"]
        )
        assert attn is None
        assert sorted(packed) == sorted(
            [
                "cu_seqlens_q",
                "cu_seqlens_kv",
                "cu_seqlens_q_padded",
                "cu_seqlens_kv_padded",
                "max_seqlen_q",
                "max_seqlen_kv",
            ]
        )
        for k, v in packed.items():
            assert torch.equal(v, b[k])
        for f in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
            ours = getattr(b["visual_inputs"], f)
            assert (ours is None and getattr(visual, f) is None) or torch.equal(getattr(visual, f), ours)
        params = psu.get_packed_seq_params(packed)
        assert (
            params.qkv_format == "thd"
            and params.max_seqlen_q == int(b["max_seqlen_q"])
            and isinstance(params.max_seqlen_q, int)
        )
        assert torch.equal(params.cu_seqlens_q_padded, b["cu_seqlens_q_padded"])


@needs_bridge
def test_unconverted_batch_loses_images_in_bridge_step(bridge_dataset, cpu_cuda, tmp_path):
    """The issue: our plain batch's flat pixel/grid keys are dropped by Bridge's allow-list."""
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    vlm_step = bridge_module("training.vlm_step")
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=1024)
    raw = next(
        b
        for b in stream(bridge_dataset, te, **B.bridge_dataset_kwargs(bridge_dataset, config_dir=tmp_path))
        if b["image_grid_thw"] is not None
    )
    kept = vlm_step.get_batch_from_iterator(iter([raw]), is_first_pp_stage=True, is_last_pp_stage=True)
    assert kept["image_grid_thw"] is None and kept["pixel_values"] is None and "visual_inputs" not in kept
    converted = vlm_step.get_batch_from_iterator(
        iter([B.to_bridge_batch(raw)]), is_first_pp_stage=True, is_last_pp_stage=True
    )
    assert torch.equal(converted["visual_inputs"].image_grid_thw, raw["image_grid_thw"])


def _real(b):
    """Real-token positions of a converted batch (the gaps are never attended)."""
    cu, cu_pad = b["cu_seqlens_q"].tolist(), b["cu_seqlens_q_padded"].tolist()
    return torch.cat([torch.arange(s, s + (cu[i + 1] - cu[i])) for i, s in enumerate(cu_pad[:-1])])


@needs_bridge
def test_qwen25_positions_equal_bridge_model_recomputation(packs25):
    """Run Bridge's Qwen25VLModel.forward (pre_process=False) and capture the M-RoPE positions it
    recomputes per segment and hands to the language model; ours equal them on every real token."""
    te, batches = packs25
    assert qwen25_positions_equal_bridge(te, batches) >= 1  # packs with images among them


def qwen25_positions_equal_bridge(te, batches) -> int:
    """Assert Bridge's Qwen25VLModel recomputes our positions on every real token of ``batches``
    (converted to Bridge's form); returns how many batches had images."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    mod = bridge_module("models.qwen_vl.modeling_qwen25_vl")
    captured = {}

    class Recorder(torch.nn.Module):
        shared_embedding_or_output_weight = None

        def forward(self, **kw):
            captured["position_ids"] = kw["position_ids"]
            return kw["position_ids"]

    sp = te.tokenizer.special
    config = SimpleNamespace(
        vision_config=Qwen2_5_VLVisionConfig(spatial_merge_size=2, tokens_per_second=2),
        image_token_id=sp.image_pad,
        video_token_id=sp.video_pad,
        vision_start_token_id=sp.vision_start,
        share_embeddings_and_output_weights=False,
        sequence_parallel=False,
        provide_language_model=lambda **kw: Recorder(),
    )
    model = mod.Qwen25VLModel(config, pre_process=False)
    checked = 0
    for b in batches:
        v = b["visual_inputs"]
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=b["cu_seqlens_q"],
            cu_seqlens_kv=b["cu_seqlens_kv"],
            cu_seqlens_q_padded=b["cu_seqlens_q_padded"],
            cu_seqlens_kv_padded=b["cu_seqlens_kv_padded"],
            max_seqlen_q=int(b["max_seqlen_q"]),
            max_seqlen_kv=int(b["max_seqlen_kv"]),
        )
        model(
            input_ids=b["input_ids"],
            position_ids=b["position_ids"],
            image_grid_thw=v.image_grid_thw,
            video_grid_thw=v.video_grid_thw,
            second_per_grid_ts=v.second_per_grid_ts,
            packed_seq_params=params,
        )
        theirs = captured.pop("position_ids")
        assert theirs.shape == b["position_ids"].shape == (3, 1, b["input_ids"].shape[1])
        real = _real(b)
        assert torch.equal(theirs[:, :, real], b["position_ids"][:, :, real])
        checked += int(v.image_grid_thw is not None)
    return checked


@needs_bridge
def test_qwen3_positions_equal_bridge_rope_index(bridge_dataset, tmp_path):
    """Bridge's Qwen3-VL per-segment get_rope_index (what the model computes when no 3-D positions
    are passed) equals the [3,1,T] positions we pass on every real token."""
    te = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen3-vl", seq_length=1024, cp=2)
    batches = stream(bridge_dataset, te, **B.bridge_dataset_kwargs(bridge_dataset, config_dir=tmp_path))
    assert sorted(k for b in batches for k in b["__keys__"]) == KEYS
    qwen3_positions_equal_bridge(te, batches)


def qwen3_positions_equal_bridge(te, batches) -> None:
    """Assert Bridge's Qwen3-VL get_rope_index gives our positions on every real token of ``batches``."""
    rope = bridge_module("models.qwen_vl.modelling_qwen3_vl.rope")
    sp = te.tokenizer.special
    for b in batches:
        v = b["visual_inputs"]
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=b["cu_seqlens_q"],
            cu_seqlens_kv=b["cu_seqlens_kv"],
            cu_seqlens_q_padded=b["cu_seqlens_q_padded"],
            cu_seqlens_kv_padded=b["cu_seqlens_kv_padded"],
        )
        theirs, _ = rope.get_rope_index(
            2,
            sp.image_pad,
            sp.video_pad,
            sp.vision_start,
            b["input_ids"],
            image_grid_thw=v.image_grid_thw,
            video_grid_thw=None if v.video_grid_thw is None else v.video_grid_thw.clone(),
            packed_seq_params=params,
        )
        real = _real(b)
        assert b["position_ids"].shape == (3, 1, b["input_ids"].shape[1])
        assert torch.equal(theirs[:, :, real], b["position_ids"][:, :, real])


# ------------------------------------------------------------------------------ Bridge's typed samples
@needs_bridge
def test_bridge_dataset_yaml_as_is_with_bridge_sample_type(tmp_path):
    """Energon loads dataset.yaml unchanged (Bridge's ChatMLWebdataset, its decoders on); our encoder
    takes Bridge's ChatMLSample and yields the same packs as the crude path (PNG round trip is exact).
    Media-only data: Bridge's typed loader requires every field_map member in every sample."""
    load_bridge()
    (tmp_path / "ds").mkdir()
    root = write_bridge_dataset(tmp_path / "ds", text=False)
    te = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset="qwen2.5-vl",
        seq_length=1024,
        cp=2,
        tp=2,
        sp=True,
        pad_to_max_length=True,
        bridge_position_ids="mrope",
    )
    typed = stream(root, te)
    crude = stream(root, te, **B.bridge_dataset_kwargs(root, config_dir=tmp_path / "cfg"))
    assert sorted(k for b in typed for k in b["__keys__"]) == [f"m{i}" for i in range(N_MEDIA)]
    by_keys = {tuple(b["__keys__"]): b for b in crude}
    assert sorted(by_keys) == sorted(tuple(b["__keys__"]) for b in typed)
    for b in typed:
        c = by_keys[tuple(b["__keys__"])]
        assert torch.equal(b["input_ids"], c["input_ids"]) and torch.equal(b["position_ids"], c["position_ids"])
        for f in ("pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw"):
            x, y = getattr(b["visual_inputs"], f), getattr(c["visual_inputs"], f)
            assert (x is None and y is None) or torch.equal(x, y)


def test_dataset_kwargs_for_crude_and_foreign_yaml(tmp_path):
    (tmp_path / ".nv-meta").mkdir()
    (tmp_path / ".nv-meta" / "dataset.yaml").write_text("__module__: megatron.energon\n__class__: CrudeWebdataset\n")
    assert B.bridge_dataset_kwargs(tmp_path) == {}
    (tmp_path / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CaptioningWebdataset\n"
    )
    with pytest.raises(ConfigError, match="CaptioningWebdataset"):
        B.bridge_dataset_kwargs(tmp_path)


# ------------------------------------------------------------------------------ config checks
def good_cfg():
    return SimpleNamespace(
        train=SimpleNamespace(micro_batch_size=1),
        validation=SimpleNamespace(eval_micro_batch_size=None),  # Megatron-LM's ValidationConfig default: train's MBS
        model=SimpleNamespace(
            calculate_per_token_loss=True,
            pipeline_model_parallel_size=1,
            mtp_num_layers=None,
            cuda_graph_impl="none",
            vision_cuda_graph_impl="none",
            overlap_moe_expert_parallel_comm=False,
            delay_wgrad_compute=False,
            context_parallel_size=2,
            tensor_model_parallel_size=4,
            sequence_parallel=True,
            seq_length=4096,
            expert_model_parallel_size=1,
        ),
        ddp=SimpleNamespace(average_in_collective=False),
        dist=SimpleNamespace(eval_context_parallel_size=None),
        comm_overlap=None,
    )


@pytest.fixture(scope="module")
def te_cp2():
    """A real (non-demo) tokenizer: the demo one is refused outside dry runs (tested below)."""
    return B.BridgeQwenVLPackingTaskEncoder(
        tokenizer=tiny_tokenizer(), preset="qwen2.5-vl", seq_length=4096, cp=2, tp=4, sp=True
    )


def test_check_bridge_config_accepts_correct_config(te_cp2):
    B.check_bridge_config(good_cfg(), te_cp2)


@pytest.mark.parametrize(
    "path, value, knob",
    [
        ("train.micro_batch_size", 2, "train.micro_batch_size"),
        ("validation.eval_micro_batch_size", 2, "validation.eval_micro_batch_size"),
        ("model.calculate_per_token_loss", False, "model.calculate_per_token_loss"),
        ("ddp.average_in_collective", True, "ddp.average_in_collective"),
        ("model.pipeline_model_parallel_size", 2, "model.pipeline_model_parallel_size"),
        ("model.mtp_num_layers", 1, "model.mtp_num_layers"),
        ("model.cuda_graph_impl", "local", "model.cuda_graph_impl"),
        ("model.vision_cuda_graph_impl", "transformer_engine", "model.vision_cuda_graph_impl"),
        ("model.overlap_moe_expert_parallel_comm", True, "model.overlap_moe_expert_parallel_comm"),
        ("model.delay_wgrad_compute", True, "model.delay_wgrad_compute"),
        ("comm_overlap", SimpleNamespace(delay_wgrad_compute=True), "comm_overlap.delay_wgrad_compute"),
        ("model.seq_length", 2048, "model.seq_length"),
        ("model.expert_model_parallel_size", 8, "task_encoder pad_to_max_length"),
    ],
)
def test_check_bridge_config_names_the_wrong_knob(te_cp2, path, value, knob):
    cfg = good_cfg()
    owner, _, attr = path.rpartition(".")
    setattr(rules.get(cfg, owner) if owner else cfg, attr, value)
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te_cp2)
    assert err.value.knob == knob


def _fake_mcore(version, roll):
    """Stand-in for what ``M._mcore_mtp_roll`` finds: a roll_tensor, Bridge-light's PackedSeqParams, a version."""
    import inspect

    packed = "packed_seq_params" in inspect.signature(roll).parameters
    return lambda: SimpleNamespace(roll=roll, params=PackedSeqParams, version=version, packed=packed)


def _roll_by(boundaries):
    """A packed MTP roll (Megatron-Core's semantics: each sequence on its own, its last position zeroed) by the
    params' ``cu_seqlens_q`` (what Megatron-Core 0.16 to 0.20 do) or by ``cu_seqlens_q_padded`` when present."""

    def roll_tensor(tensor, shifts=-1, dims=-1, cp_group=None, packed_seq_params=None):
        cu = getattr(packed_seq_params, boundaries, None)
        cu = packed_seq_params.cu_seqlens_q if cu is None else cu
        out = tensor.clone()
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            out[..., a:b] = torch.roll(tensor[..., a:b], shifts, dims)
            out[..., b - 1 : b] = 0
        return out, out.sum()

    return roll_tensor


def _mtp_cfg(cp=1, tp=1, sp=False):
    cfg = good_cfg()
    cfg.model.mtp_num_layers = 2
    cfg.model.context_parallel_size, cfg.model.tensor_model_parallel_size, cfg.model.sequence_parallel = cp, tp, sp
    return cfg


PADDED_MTP = (
    "model.mtp_num_layers: is 2 on packs aligned to 8 (model.context_parallel_size=2, "
    "model.tensor_model_parallel_size=4, model.sequence_parallel=True): {who} rolls the MTP labels and loss mask "
    "by the unpadded cu_seqlens_q over padded segments, so MTP targets land on the wrong tokens. Fix: train MTP "
    "with model.context_parallel_size=1 and model.sequence_parallel=False or model.tensor_model_parallel_size=1 "
    "(alignment 1), or set model.mtp_num_layers=None to train on packs"
)


def test_mtp_on_packs_is_allowed_where_megatron_core_masks_it_at_our_boundaries(monkeypatch, caplog):
    """Issue 45: MTP on packs as Bridge now allows it (PR #5990), where Megatron-Core's roll keeps MTP targets
    inside each packed sequence (>= 0.16) and rolls by the boundaries our segments have: alignment 1 always,
    padded packs (CP, or SP over TP) only with a roll that follows padded segments (probed)."""
    monkeypatch.setattr(M, "_mcore_mtp_roll", _fake_mcore("0.16.1", _roll_by("cu_seqlens_q")))
    with caplog.at_level("WARNING", logger="energon_pack.integrations.bridge"):
        B.check_bridge_config(_mtp_cfg())  # alignment 1: allowed, nothing assumed
        B.check_bridge_config(_mtp_cfg(tp=4))  # TP without SP does not pad segments
    assert caplog.records == []
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(_mtp_cfg(cp=2, tp=4, sp=True))
    assert str(err.value) == PADDED_MTP.format(who="Megatron-Core 0.16.1")
    te = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer=tiny_tokenizer(), preset="qwen2.5-vl", seq_length=4096, tp=4, sp=True
    )
    with pytest.raises(ConfigError) as err:  # the encoder's alignment (4) is the one that counts
        B.check_bridge_config(_mtp_cfg(tp=4, sp=True), te)
    assert "on packs aligned to 4 (model.tensor_model_parallel_size=4, model.sequence_parallel=True)" in str(err.value)
    monkeypatch.setattr(M, "_mcore_mtp_roll", _fake_mcore("0.21.0", _roll_by("cu_seqlens_q_padded")))
    B.check_bridge_config(_mtp_cfg(cp=2, tp=4, sp=True))  # a roll that follows padded segments: allowed


def test_mtp_on_packs_is_refused_where_megatron_core_rolls_across_boundaries(monkeypatch):
    def roll_tensor(tensor, shifts=-1, dims=-1, cp_group=None):  # Megatron-Core 0.15's signature
        return torch.roll(tensor, shifts, dims), None

    monkeypatch.setattr(M, "_mcore_mtp_roll", _fake_mcore("0.15.3", roll_tensor))
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(_mtp_cfg())
    assert str(err.value) == (
        "model.mtp_num_layers: is 2; Megatron-Core 0.15.3's MTP rolls labels across packed segment boundaries (its "
        "roll_tensor takes no packed_seq_params), so each segment's last tokens learn the next segment's. Fix: "
        "install Megatron-Core >= 0.16.0, or set model.mtp_num_layers=None to train on packs"
    )


def test_mtp_on_packs_without_megatron_core_here_is_allowed_at_alignment_1_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(M, "_mcore_mtp_roll", lambda: None)
    with caplog.at_level("WARNING", logger="energon_pack.integrations.bridge"):
        B.check_bridge_config(_mtp_cfg())
    assert [r.getMessage() for r in caplog.records] == [
        "MTP on packs: Megatron-Core is not importable here, so its masking at packed boundaries is unchecked; "
        "assumed the job runs Megatron-Core >= 0.16.0"
    ]
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(_mtp_cfg(cp=2, tp=4, sp=True))
    assert str(err.value) == PADDED_MTP.format(who="Megatron-Core (not importable here)")


def test_mtp_probe_tells_a_roll_by_padded_segments_from_one_by_unpadded():
    assert M._mtp_roll_follows_padded_segments(_fake_mcore("x", _roll_by("cu_seqlens_q_padded"))()) is True
    assert M._mtp_roll_follows_padded_segments(_fake_mcore("x", _roll_by("cu_seqlens_q"))()) is False
    assert M._mcore_mtp_roll() is None  # the main venv: no Megatron-Core (or only Bridge-light's stand-in)


def test_check_bridge_config_parallel_sizes_and_many_errors(te_cp2):
    cfg = good_cfg()
    cfg.model.context_parallel_size = 4
    cfg.model.sequence_parallel = False
    cfg.ddp.average_in_collective = True
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te_cp2)
    assert [e.knob for e in err.value.errors] == [
        "ddp.average_in_collective",
        "model.context_parallel_size",
        "model.sequence_parallel",
    ]
    assert "cp=4" in str(err.value) and "sp=False" in str(err.value)
    cfg = good_cfg()
    cfg.model.tensor_model_parallel_size = 8  # lcm(4, 16) = 16 != 8
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te_cp2)
    assert [e.knob for e in err.value.errors] == ["model.tensor_model_parallel_size", "task_encoder alignment"]
    B.check_bridge_config(good_cfg())  # without an encoder only the training knobs are checked


def test_eval_micro_batch_size_none_or_one_and_aggregated_with_train():
    te = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer=tiny_tokenizer(), preset="qwen2.5-vl", seq_length=4096, cp=2, tp=4, sp=True
    )
    for value in (None, 1):
        cfg = good_cfg()
        cfg.validation.eval_micro_batch_size = value
        B.check_bridge_config(cfg, te)
    del cfg.validation  # a config without Bridge's validation section: nothing to check there
    B.check_bridge_config(cfg, te)
    cfg = good_cfg()
    cfg.train.micro_batch_size, cfg.validation.eval_micro_batch_size = 4, 4
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te)
    assert [e.knob for e in err.value.errors] == ["train.micro_batch_size", "validation.eval_micro_batch_size"]
    assert err.value.knob == "train.micro_batch_size, validation.eval_micro_batch_size"
    assert (
        "validation.eval_micro_batch_size: is 4; validation packs are one THD row per micro-batch too. "
        "Fix: set validation.eval_micro_batch_size=1 (or None: Bridge then uses train.micro_batch_size)"
        in str(err.value)
    )


def test_demo_tokenizer_refused_unless_dry_run():
    te = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=4096, cp=2, tp=4, sp=True)
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(good_cfg(), te)
    assert err.value.knob == "task_encoder tokenizer" and not hasattr(err.value, "errors")
    assert "offline demo tokenizer" in err.value.problem and 'load_tokenizer("qwen2.5-vl")' in err.value.fix
    assert "allow_demo_tokenizer=True only for a dry run" in err.value.fix
    B.check_bridge_config(good_cfg(), te, allow_demo_tokenizer=True)
    cfg = good_cfg()
    cfg.model.image_token_id = 151655  # a dry run on demo ids is not held to the model's token ids
    B.check_bridge_config(cfg, te, allow_demo_tokenizer=True)
    cfg.ddp.average_in_collective = True  # in the one aggregated error with every other wrong knob
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te)
    assert [e.knob for e in err.value.errors] == ["ddp.average_in_collective", "task_encoder tokenizer"]


def test_model_token_ids_must_be_the_tokenizers(te_cp2):
    cfg = good_cfg()
    cfg.model.image_token_id, cfg.model.video_token_id, cfg.model.vision_start_token_id = 151655, 151656, 151652
    B.check_bridge_config(cfg, te_cp2)
    cfg.model.image_token_id = 151654
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te_cp2)
    assert err.value.knob == "model.image_token_id" and "is 151654 but the encoder's tokenizer" in str(err.value)


def test_provider_encoder_is_the_default_and_must_be_the_one_checked(te_cp2):
    cfg = good_cfg()
    cfg.dataset = SimpleNamespace(task_encoder=te_cp2)
    B.check_bridge_config(cfg)  # the provider's encoder is checked
    cfg.model.seq_length = 1024
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg)
    assert err.value.knob == "model.seq_length"
    cfg.model.seq_length = 4096
    other = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer=tiny_tokenizer(), preset="qwen2.5-vl", seq_length=4096, cp=2, tp=4, sp=True
    )
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, other)
    assert err.value.knob == "dataset.task_encoder"
    cfg.dataset = SimpleNamespace(task_encoder=SimpleNamespace(kind="bridge's declarative encoder config"))
    B.check_bridge_config(cfg, te_cp2)  # Bridge's own dataset configs are not ours: nothing to compare


@needs_bridge
def test_check_bridge_config_forward_step(te_cp2):
    vlm_step = bridge_module("training.vlm_step")
    B.check_bridge_config(good_cfg(), te_cp2, forward_step_func=vlm_step.forward_step)
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(good_cfg(), te_cp2, forward_step_func=vlm_step.get_batch)
    assert err.value.knob == "forward_step_func"


# ------------------------------------------------------------------------------ dataset provider
@needs_bridge
def test_provider_is_a_bridge_dataset_provider_and_builds_loaders(bridge_dataset, monkeypatch, tmp_path):
    base = bridge_module("data.base")
    monkeypatch.setenv("ENERGON_PACK_CACHE", str(tmp_path))
    monkeypatch.setattr(bridge_provider, "_CLASSES", {})
    te = B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=1024)
    provider = B.make_bridge_dataset_provider(
        bridge_dataset, te, packing_buffer_size=8, num_workers=0, shuffle_buffer_size=1
    )
    assert isinstance(provider, base.DatasetProvider) and provider.dataloader_type == "external"
    context = base.DatasetBuildContext(train_samples=10, valid_samples=0, test_samples=0)
    train, val, test = provider.build_datasets(context)
    assert val is None and test is None
    first = next(train)
    # alignment 1, dynamic width: no segment is padded, so the padded boundaries are left out (Bridge's rule)
    assert set(first) == (set(B.BRIDGE_BATCH_KEYS) - set(PADDED_BOUNDARY_KEYS)) | set(B.METADATA_KEYS)
    assert first["position_ids"].shape == (1, first["input_ids"].shape[1])  # auto: flat for Qwen2.5-VL


def test_loader_owned_dataset_kwargs_are_refused_by_name(te_cp2, tmp_path):
    """Bridge refuses builder-owned dataset_kwargs at validation; ours must too (at provider build, by the
    config check and at loader build when set later), never a raw TypeError from the datamodule."""
    with pytest.raises(ConfigError) as err:
        B.make_bridge_dataset_provider(tmp_path, te_cp2, dataset_kwargs={"batch_size": 4, "split_part": "val"})
    assert err.value.knob == "dataset_kwargs"
    assert "batch_size (always 1" in str(err.value) and "split_part (train / val" in str(err.value)
    provider = B.make_bridge_dataset_provider(tmp_path, te_cp2, dataset_kwargs={"subflavors": {"a": 1}})
    cfg = good_cfg()
    cfg.dataset = provider
    B.check_bridge_config(cfg)
    provider.dataset_kwargs = {"worker_config": None, "task_encoder": te_cp2, "subflavors": {}}
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg)
    assert err.value.knob == "dataset_kwargs" and "task_encoder (the provider's" in str(err.value)
    assert "worker_config (built by Bridge" in str(err.value) and "subflavors" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        provider.build_datasets(SimpleNamespace(train_samples=1, valid_samples=0))
    assert err.value.knob == "dataset_kwargs"
    provider.dataset_kwargs = ["batch_size"]
    with pytest.raises(ConfigError, match="pass a dict"):
        B.check_bridge_config(cfg)


# ------------------------------------------------------------------------------ the example
@pytest.mark.parametrize("tokenizer", [[], ["--tokenizer", "demo"]], ids=["as-written", "demo"])
def test_example_check_mode_runs(tmp_path, tokenizer):
    """Bridge's package __init__ needs Megatron-Core, so here the script takes the light route. As the
    README writes it (no --tokenizer: the real Qwen2.5-VL tokenizer) and on the demo tokenizer."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "bridge_recipe.py"),
            "--check",
            *tokenizer,
            "--data",
            str(tmp_path / "demo"),
            "--samples",
            "60",
            "--packs",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "check_bridge_config: ok" in out.stdout
    if bridge_version() is not None:
        assert "Bridge: light CPU import (tests/_bridge_light.py)" in out.stdout
    assert out.stdout.count("pack ") == 3
    assert ("through Bridge's get_batch: ok" in out.stdout) == (bridge_version() is not None)


def test_uint8_pixels_are_refused_for_bridge(packs25):
    """Bridge's step hands pixel_values to the vision model as they are: uint8 would train on 0..255.
    The encoder refuses it at construction (an error inside encode_batch would only skip batches)."""
    with pytest.raises(ConfigError) as err:
        B.BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset=get_preset("qwen2.5-vl", pixel_dtype="uint8"))
    assert err.value.knob == "pixel_dtype" and "bfloat16" in str(err.value)
    _, batches = packs25
    batch = next(b for b in batches if b["visual_inputs"].pixel_values is not None)
    raw = {k: v for k, v in batch.items() if k != "visual_inputs"}
    raw.update(
        pixel_values=batch["visual_inputs"].pixel_values.to(torch.uint8),
        input_ids=batch["input_ids"],
        mrope_position_ids=None,
        image_grid_thw=batch["visual_inputs"].image_grid_thw,
    )
    with pytest.raises(ConfigError, match="pixel_dtype"):
        B.to_bridge_batch(raw)


# ------------------------------------------------------------------------------ CUDA graphs on static packs
@pytest.fixture(scope="module")
def te_static():
    return B.BridgeQwenVLPackingTaskEncoder(
        tokenizer=tiny_tokenizer(),
        preset="qwen2.5-vl",
        seq_length=4096,
        cp=2,
        tp=4,
        sp=True,
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        max_segments=64,
        max_patches_per_pack=8192,
    )


# NVIDIA's packed-path settings (Bridge ConfigContainer.validate, offline packing): per-layer TE graphs of
# attention and MLP, TE graphs with no scope, the Megatron-Core whole-layer graph
STATIC_GRAPH_SETTINGS = [
    dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "mlp"]),
    dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=None),
    dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=["mlp"]),
    dict(enable_cuda_graph=True),
]


@pytest.mark.parametrize("settings", STATIC_GRAPH_SETTINGS)
def test_cuda_graphs_accepted_on_static_packs_and_refused_on_dynamic_ones(te_static, te_cp2, settings):
    cfg = good_cfg()
    for k, v in settings.items():
        setattr(cfg.model, k, v)
    B.check_bridge_config(cfg, te_static)
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, te_cp2)
    assert "cuda_graph" in err.value.knob


def test_cuda_graph_checks_name_what_is_not_static(te_cp2):
    width_only = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer=tiny_tokenizer(),
        preset="qwen2.5-vl",
        seq_length=4096,
        cp=2,
        tp=4,
        sp=True,
        pad_to_max_length=True,
        max_patches_per_pack=8192,
    )
    cfg = good_cfg()
    cfg.model.cuda_graph_impl, cfg.model.cuda_graph_scope = "transformer_engine", ["attn"]
    with pytest.raises(ConfigError, match="pad_cu_seqlens"):
        B.check_bridge_config(cfg, width_only)
    cfg.model.cuda_graph_scope = ["mlp"]  # no packed attention in the graph: a static width is enough
    B.check_bridge_config(cfg, width_only)
    cfg.model.cuda_graph_impl, cfg.model.cuda_graph_scope = "full_iteration", None
    with pytest.raises(ConfigError, match="full iteration"):
        B.check_bridge_config(cfg, width_only)
    cfg = good_cfg()
    cfg.model.vision_cuda_graph_impl, cfg.model.max_vision_cuda_graph_seq_length = "transformer_engine", 16384
    with pytest.raises(ConfigError, match="attend to each other"):  # Bridge's graphed tower attends across images
        B.check_bridge_config(cfg, width_only)


def test_bridge_step_runs_on_static_packs(bridge_dataset, cpu_cuda, monkeypatch, tmp_path):
    """Bridge's own get_batch on fixed-width packs with static cu_seqlens: one shape for every pack."""
    load_bridge()
    vlm_step = bridge_module("training.vlm_step")
    psu = bridge_module("training.utils.packed_seq_utils")
    monkeypatch.setattr(vlm_step, "is_pp_first_stage", lambda pp: True)
    monkeypatch.setattr(vlm_step, "is_pp_last_stage", lambda pp: True)
    te = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset="qwen2.5-vl",
        seq_length=1024,
        cp=2,
        tp=2,
        sp=True,
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        max_segments=8,
        max_patches_per_pack=4096,
    )
    batches = stream(bridge_dataset, te, **B.bridge_dataset_kwargs(bridge_dataset, config_dir=tmp_path))
    shapes = set()
    for b in batches:
        tokens, labels, loss_mask, attn, pos, packed, visual = vlm_step.get_batch(
            iter([b]), SimpleNamespace(dataset=SimpleNamespace()), pg_collection=SimpleNamespace(pp=None)
        )
        params = psu.get_packed_seq_params(packed)
        shapes.add((tuple(tokens.shape), tuple(params.cu_seqlens_q_padded.shape), params.max_seqlen_q))
        assert visual.pixel_values is not None
    assert len(batches) >= 2 and shapes == {((1, 1024), (9,), 1024)}
    static = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset="qwen2.5-vl",
        seq_length=1024,
        cp=2,
        tp=2,
        sp=True,
        max_patches_per_pack=4096,
        static_visual=True,
    )
    cfg = good_cfg()
    cfg.model.tensor_model_parallel_size = 2
    with pytest.raises(ConfigError) as err:
        B.check_bridge_config(cfg, static, allow_demo_tokenizer=True)
    assert "task_encoder static_visual" in err.value.knob


# ------------------------------------------------------------------------------ padded boundaries
def _row(lengths, **layout):
    from energon_pack.thd import ThdLayout, ThdSegment, build_thd_batch

    segs = [
        ThdSegment(input_ids=torch.arange(n) + 1, labels=torch.arange(n) + 2, loss_mask=torch.ones(n)) for n in lengths
    ]
    return build_thd_batch(segs, ThdLayout(**layout))


def test_padded_boundaries_only_when_they_differ():
    """Bridge's packing emits cu_seqlens_*_padded only when a physical span differs from its length (so TE keeps
    its unpadded path); always on the static pad_cu_seqlens path; the GPT step's batch follows the same rule."""
    from energon_pack.integrations.bridge import to_gpt_batch

    dense = _row([5, 7], seq_length=64)  # alignment 1, dynamic width: nothing padded
    out = B.to_bridge_batch(dense)
    assert "cu_seqlens_q_padded" not in out and "cu_seqlens_kv_padded" not in out
    assert out["cu_seqlens_q"].tolist() == [0, 5, 12]
    gpt = to_gpt_batch(dense)
    assert "cu_seqlens_q_padded" not in gpt and gpt["cu_seqlens"].tolist() == [[0, 5, 12]]
    aligned = B.to_bridge_batch(_row([5, 7], seq_length=64, pad_multiple=4))
    assert aligned["cu_seqlens_q_padded"].tolist() == [0, 8, 16] and aligned["cu_seqlens_q"].tolist() == [0, 5, 12]
    tail = to_gpt_batch(_row([5, 7], seq_length=16, pad_to_max_length=True))  # the last span absorbs the tail
    assert tail["cu_seqlens_q_padded"].tolist() == [0, 5, 16] and tail["cu_seqlens_q"].tolist() == [0, 5, 12]
    assert "cu_seqlens_q_padded" not in to_gpt_batch(_row([5, 7], seq_length=12, pad_to_max_length=True))  # full
    static = _row([5, 7], seq_length=12, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=3)
    kept = B.to_bridge_batch(static, static_cu=True)
    assert torch.equal(kept["cu_seqlens_q_padded"], static["cu_seqlens_q_padded"])
    assert "cu_seqlens_q_padded" in to_gpt_batch(static, static_cu=True)
