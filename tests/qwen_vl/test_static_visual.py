"""Static-shape packs (``static_visual=True``): padded patch rows and fixed-length vision cu_seqlens change
no real token's logits or any gradient; Qwen2-VL / Qwen2.5-VL / Qwen3-VL, images and videos."""

import copy

import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from test_integration_hf import shards  # noqa: F401  (the module fixture: images, videos, text)

from _hf_helpers import NO_IMPLICIT_PREPARE, PRESETS, alone_forward, max_seg_diff, small_preset, split_pack, tiny_model
from energon_pack.errors import ConfigError
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import get_preset, load_demo_tokenizer
from energon_pack.qwen_vl.static_visual import STATIC_GRID_KEY, STATIC_PIXELS_KEY, pad_segments, static_segment_count
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

pytest.importorskip("transformers")
pytestmark = NO_IMPLICIT_PREPARE

BUDGET = 512
TOL = 1e-5


def _packs(root, preset, **kw):
    te = QwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset=preset,
        seq_length=192,
        cp=2,
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        max_segments=8,
        max_patches_per_pack=BUDGET,
        **kw,
    )
    ds = get_train_dataset(
        str(root),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    return list(get_loader(ds)), te


@pytest.fixture(scope="module", params=list(PRESETS))
def static_setup(request, shards):  # noqa: F811
    name = request.param
    preset = small_preset(name)
    dynamic, _ = _packs(shards, preset)
    static, te = _packs(shards, preset, static_visual=True)
    return name, load_demo_tokenizer(), dynamic, static, te


def test_static_packs_have_fixed_shapes_and_the_same_members(static_setup):
    name, tok, dynamic, static, te = static_setup
    assert [b["__keys__"] for b in dynamic] == [b["__keys__"] for b in static]
    model = tiny_model(name, tok)
    shapes = set()
    for b in static:
        assert b["pixel_values"] is None and b["pixel_values_videos"] is None
        kw = H.static_vision_kwargs(b, model)
        shapes.add(tuple((k, tuple(v.shape) if isinstance(v, torch.Tensor) else v) for k, v in sorted(kw.items())))
        assert b[STATIC_PIXELS_KEY].shape[0] == BUDGET
        assert tuple(b["cu_seqlens_q_padded"].shape) == (9,)
    assert len(shapes) == 1, shapes  # every tensor the tower sees has one shape, every int one value
    assert any(len(b[STATIC_GRID_KEY]) >= 2 for b in static)


def test_static_packed_logits_and_grads_equal_each_sample_alone(static_setup):
    name, tok, dynamic, static, te = static_setup
    ref = tiny_model(name, tok)
    packed = copy.deepcopy(ref)
    H.prepare_model(packed)
    saw_video = False
    for dyn, batch in zip(dynamic, static):
        segments = split_pack(dyn, tok.special.image_pad, tok.special.video_pad)
        saw_video |= dyn["video_grid_thw"] is not None
        packed.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out = H.packed_forward(packed, batch)
        loss, _ = H.packed_loss(out.logits, batch)
        loss.backward()
        alone = []
        for seg in segments:
            logits = alone_forward(ref, seg)
            H.packed_loss(logits, seg)[0].backward()
            alone.append(logits.detach())
        diff = max_seg_diff(out.logits.detach(), alone, segments)
        assert diff <= TOL, f"{name}: static packed vs alone logits differ by {diff}"
        grads = dict(packed.named_parameters())
        for pname, p in ref.named_parameters():
            g_ref = p.grad if p.grad is not None else torch.zeros_like(p)
            g = grads[pname].grad if grads[pname].grad is not None else torch.zeros_like(p)
            assert torch.isfinite(g).all()
            assert torch.allclose(g, g_ref, rtol=1e-5, atol=1e-5), f"{name}: grad of {pname} differs"
    assert saw_video


def test_pad_segments_are_fixed_length_and_chunked():
    cu = pad_segments(torch.tensor([0, 16, 48]), 128, 32, 2)
    assert cu.tolist()[:6] == [0, 16, 48, 80, 112, 128] and len(cu) == static_segment_count(128, 2) == 33
    assert (cu.diff() <= 32).all()


def test_static_visual_needs_a_patch_budget():
    with pytest.raises(ConfigError, match="static_visual"):
        QwenVLPackingTaskEncoder(tokenizer="demo", static_visual=True, seq_length=256)
    with pytest.raises(ConfigError, match="multiple of 4"):
        QwenVLPackingTaskEncoder(tokenizer="demo", static_visual=True, seq_length=256, max_patches_per_pack=510)


def test_static_budgets_are_checked_against_memory_and_type():
    """A patch budget of 2^20 would allocate 4.6 GiB of float32 rows per pack in every worker (a worker died with
    no word of why): refused with the estimate; the largest accepted budget still builds; True is not a frame count."""
    with pytest.raises(ConfigError) as err:
        QwenVLPackingTaskEncoder(tokenizer="demo", static_visual=True, seq_length=256, max_patches_per_pack=2**20)
    assert err.value.knob == "max_patches_per_pack"
    assert "4.6 GiB of pixel rows per pack (1,048,576 x 1176 x float32)" in str(err.value)
    assert "(228,261 patches)" in str(err.value)  # 1 GiB / (1176 x 4 bytes)
    QwenVLPackingTaskEncoder(tokenizer="demo", static_visual=True, seq_length=256, max_patches_per_pack=228_260)
    bf16 = get_preset("qwen2.5-vl", pixel_dtype="bfloat16")  # half the bytes: twice the budget fits
    QwenVLPackingTaskEncoder(
        tokenizer="demo", preset=bf16, static_visual=True, seq_length=256, max_patches_per_pack=456_520
    )
    for bad in (True, 2.0, 0):
        with pytest.raises(ConfigError) as err:
            QwenVLPackingTaskEncoder(
                tokenizer="demo", static_visual=True, seq_length=256, max_patches_per_pack=512, max_vision_frames=bad
            )
        assert err.value.knob == "max_vision_frames" and repr(bad) in str(err.value)


def test_max_segments_and_the_frame_budget_bind_the_packer(shards):  # noqa: F811
    """max_segments is a packer budget (a pack never exceeds the static cu_seqlens), and so is the frame budget."""
    packs, te = _packs(shards, small_preset("qwen2.5-vl"), static_visual=True, max_vision_frames=3)
    packs2, _ = _packs_with(shards, max_segments=2)
    for b in packs:
        assert sum(int(g[0]) for g in b[STATIC_GRID_KEY]) <= 3
    assert all(b["num_segments"] <= 2 for b in packs2)
    assert sorted(k for b in packs2 for k in b["__keys__"]) == sorted(k for b in packs for k in b["__keys__"])
    with pytest.raises(ConfigError, match="max_vision_frames"):
        QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=256, max_vision_frames=3)


def _packs_with(root, **kw):
    te = QwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset=small_preset("qwen2-vl"),
        seq_length=192,
        cp=2,
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        **kw,
    )
    ds = get_train_dataset(
        str(root),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    return list(get_loader(ds)), te


def test_recommended_budgets_keep_fill_within_half_a_point():
    import numpy as np

    from energon_pack.bench.visual_budget import fill_with_budget, recommend_patch_budget

    rng = np.random.default_rng(0)
    tokens = rng.integers(50, 1500, 3000)
    patches = np.where(rng.random(3000) < 0.7, tokens * 3, 0)
    frames = (patches > 0).astype(np.int64) * rng.integers(1, 3, 3000)
    costs = np.column_stack([tokens, patches, frames])
    rec = recommend_patch_budget(costs, 4096, multiple=64)
    assert rec["fill_delta_points"] <= 0.5 and rec["budget"] % 64 == 0
    static = fill_with_budget(costs, 4096, rec["budget"], segments=rec["max_segments"], frames=rec["max_vision_frames"])
    assert static["max_pack_patches"] <= rec["budget"] and static["max_pack_segments"] <= rec["max_segments"]
    assert static["max_pack_frames"] <= rec["max_vision_frames"] and rec["max_segments"] > 1
    smaller = fill_with_budget(costs, 4096, rec["budget"] // 2)
    assert smaller["fill"] < rec["fill_dynamic"] - 0.005  # the budget is not needlessly large


def test_bench_visual_budget_command(tmp_path):
    import json

    from energon_pack.cli import main
    from energon_pack.energon import make_demo_shards

    data = make_demo_shards(tmp_path / "data", samples=120, per_shard=40)
    assert (
        main(
            [
                "bench",
                "--data",
                str(data),
                "--visual-budget",
                "--seq-length",
                "2048",
                "--buffers",
                "8,16",
                "--tokenizer",
                "demo",
                "--out-dir",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    rec = json.loads((tmp_path / "out" / "visual_budget.json").read_text())
    assert rec["fill_delta_points"] <= 0.5 and rec["budget"] > 0 and rec["buffer"] == 16 and rec["max_segments"] >= 1


def test_place_visual_rows_equals_masked_scatter_without_a_data_dependent_backward():
    """The static hook's placement: HF's masked_scatter numbers (forward and gradients, padding rows
    get zero), and a backward graph with no op whose size depends on the data (CUDA-graph capturable)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 3, (2, 11), generator=g)
    visual = ids == 2
    n = int(visual.sum())
    embeds = torch.randn(2, 11, 4, generator=g, dtype=torch.float64, requires_grad=True)
    rows = torch.randn(n + 3, 4, generator=g, dtype=torch.float64, requires_grad=True)  # 3 padding rows
    weight = torch.randn(2, 11, 4, generator=g, dtype=torch.float64)

    ours = H.place_visual_rows(embeds, visual, rows)
    ours_grads = torch.autograd.grad((ours * weight).sum(), (embeds, rows))
    hf = embeds.masked_scatter(visual.unsqueeze(-1).expand_as(embeds), rows)
    hf_grads = torch.autograd.grad((hf * weight).sum(), (embeds, rows))
    assert torch.equal(ours, hf)
    assert all(torch.equal(a, b) for a, b in zip(ours_grads, hf_grads))
    assert torch.equal(ours_grads[1][n:], torch.zeros(3, 4, dtype=torch.float64))

    def step(fn):
        def f(e, r, w):
            return torch.autograd.grad((fn(e, r) * w).sum(), (e, r))

        graph = make_fx(f)(embeds.detach().requires_grad_(), rows.detach().requires_grad_(), weight)
        return {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}

    data_dependent = {
        "aten.masked_select.default",
        "aten.nonzero.default",
        "aten.masked_scatter_backward.default",
        "aten._local_scalar_dense.default",
    }
    assert not step(lambda e, r: H.place_visual_rows(e, visual, r)) & data_dependent
    assert step(lambda e, r: e.masked_scatter(visual.unsqueeze(-1).expand_as(e), r)) & data_dependent  # HF's has one
