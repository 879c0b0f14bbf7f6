"""HF transformers integration: packed Qwen-VL rows through HF models equal each sample run alone.

Packs come from the real Energon loader over WebDataset shards written here (images, videos,
text-only samples; CP=2 so every segment is aligned to 4 tokens and gaps trail the segments).
Tiny random-init Qwen2-VL / Qwen2.5-VL / Qwen3-VL models (fp32, eval, seeded, no downloads) run
each pack once through ``hf_forward_kwargs`` + our varlen attention and each member sample
alone through HF's own path (HF computes M-RoPE itself, stock sdpa attention).
"""

import copy
import io
import json
import pickle

import numpy as np
import pytest
import torch
import webdataset as wds
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from PIL import Image

from _hf_helpers import (
    NO_IMPLICIT_PREPARE,
    PRESETS,
    alone_forward,
    max_seg_diff,
    small_preset,
    split_pack,
    tiny_model,
    vision_varlen_in_one_call,
)
from energon_pack.energon import prepare_webdataset
from energon_pack.errors import ConfigError
from energon_pack.integrations import hf as H
from energon_pack.integrations.hf import batch as hf_batch
from energon_pack.integrations.hf import model as hf_model
from energon_pack.integrations.hf import version as hf_version
from energon_pack.qwen_vl import get_preset, load_demo_tokenizer
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

transformers = pytest.importorskip("transformers")
pytestmark = NO_IMPLICIT_PREPARE

TOL = 1e-5
MAX_DIFF: dict[str, dict[str, float]] = {}  # printed at the end (pytest -s)


def _jpeg(w, h, seed):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _turns(user, answer):
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """8 samples: text-only, one/two images (``json`` + ``0.jpg``...), videos (pickled ``videos``), image + video,
    video + image."""
    root = tmp_path_factory.mktemp("hf_shards")
    samples = [
        ("t0", _turns("what is a pack?", "many samples in one row."), [], []),
        ("i1", _turns("<image>\ndescribe the image.", "a noisy square."), [_jpeg(60, 50, 1)], []),
        ("v2", _turns("<video>\nwhat happens?", "the frames change."), [], [[_jpeg(64, 48, 20 + f) for f in range(3)]]),
        (
            "iv3",
            _turns("<image>\n<video>\ncompare them.", "both are noise."),
            [_jpeg(48, 72, 3)],
            [[_jpeg(56, 56, 30 + f) for f in range(4)]],
        ),
        ("i4", _turns("<image>\n<image>\ntwo images?", "yes, two."), [_jpeg(40, 40, 4), _jpeg(90, 40, 5)], []),
        (
            "t5",
            [
                {"role": "user", "content": "count to three."},
                {"role": "assistant", "content": "one two three."},
                {"role": "user", "content": "again?"},
                {"role": "assistant", "content": "one two three!"},
            ],
            [],
            [],
        ),
        ("v6", _turns("<video>\nhow long?", "two steps."), [], [[_jpeg(40, 60, 60 + f) for f in range(2)]]),
        (
            "vi7",
            _turns("<video>\n<image>\nwhich came first?", "the clip."),
            [_jpeg(44, 52, 7)],
            [[_jpeg(48, 40, 70 + f) for f in range(2)]],
        ),
    ]
    with wds.ShardWriter(str(root / "hf-%06d.tar"), maxcount=100, verbose=0) as sink:
        for key, conv, images, videos in samples:
            fields = {"__key__": key, "json": json.dumps(conv).encode()}
            fields.update({f"{i}.jpg": img for i, img in enumerate(images)})
            if videos:
                fields["videos"] = pickle.dumps(videos)
            sink.write(fields)
    prepare_webdataset(root)
    return root


def load_packs(root, preset, *, cp=2, seq_length=192):
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=seq_length, cp=cp, pad_to_max_length=True)
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
def setup(request, shards):
    name = request.param
    tok = load_demo_tokenizer()
    packs, te = load_packs(shards, small_preset(name))
    ref = tiny_model(name, tok)
    packed = copy.deepcopy(ref)
    assert H.prepare_model(packed) is packed and packed.config._attn_implementation == H.VARLEN_ATTENTION
    H.prepare_model(ref, attention=None, static_visual=False)  # HF's own sdpa, the vision tower guards only
    return name, tok, packs, te, ref, packed


def test_packs_cover_images_videos_text_and_gaps(setup):
    name, tok, packs, te, *_ = setup
    assert te.layout.pad_multiple == 4
    assert sorted(k for b in packs for k in b["__keys__"]) == ["i1", "i4", "iv3", "t0", "t5", "v2", "v6", "vi7"]
    big = max(packs, key=lambda b: b["num_segments"])
    ids = big["input_ids"][0]
    for b in packs:
        print(
            f"\n[{name}] pack {b['__keys__']} real lengths {b['cu_seqlens_q'].diff().tolist()} "
            f"spans {b['cu_seqlens_q_padded'].diff().tolist()}"
        )
    assert big["num_segments"] >= 3
    assert int((ids == tok.special.image_pad).sum()) > 0 and int((ids == tok.special.video_pad).sum()) > 0
    assert any(k.startswith("t") for k in big["__keys__"])
    # alignment gaps between segments (not only the fixed-width tail)
    assert (big["cu_seqlens_q_padded"][1:-1] != big["cu_seqlens_q"][1:-1]).any()


def test_packed_logits_loss_and_grads_equal_each_sample_alone(setup):
    name, tok, packs, te, ref, packed = setup
    max_logit = max_grad = max_grad_rel = 0.0
    for batch in packs:
        segments = split_pack(batch, tok.special.image_pad, tok.special.video_pad)
        packed.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out = H.packed_forward(packed, batch)
        loss_pack, count = H.packed_loss(out.logits, batch)
        loss_pack.backward()
        alone, loss_alone, count_alone = [], 0.0, 0.0
        for seg in segments:
            logits = alone_forward(ref, seg)
            loss, c = H.packed_loss(logits, seg)
            loss.backward()
            alone.append(logits.detach())
            loss_alone, count_alone = loss_alone + loss.detach(), count_alone + c
        diff = max_seg_diff(out.logits.detach(), alone, segments)
        assert diff <= TOL, f"{name}: packed vs alone logits differ by {diff}"
        max_logit = max(max_logit, diff)
        assert count == count_alone == batch["supervised_tokens"] > 0
        assert torch.allclose(loss_pack.detach(), loss_alone, rtol=1e-6, atol=1e-5), (loss_pack, loss_alone)
        grads_pack = dict(packed.named_parameters())
        n_compared = 0
        for pname, p in ref.named_parameters():
            g_ref, g_pack = p.grad, grads_pack[pname].grad
            if g_ref is None and g_pack is None:
                continue
            g_ref = torch.zeros_like(p) if g_ref is None else g_ref
            g_pack = torch.zeros_like(p) if g_pack is None else g_pack
            d = float((g_ref - g_pack).abs().max())
            max_grad = max(max_grad, d)
            max_grad_rel = max(max_grad_rel, d / max(float(g_ref.abs().max()), 1e-12))
            assert torch.allclose(g_pack, g_ref, rtol=1e-5, atol=1e-5), f"{name}: grad of {pname} differs by {d}"
            n_compared += 1
        assert n_compared > 20
    MAX_DIFF.setdefault(name, {}).update(logits=max_logit, grads=max_grad, grads_rel=max_grad_rel)
    print(
        f"\n[{name}] packs={len(packs)} max |logit diff| {max_logit:.2e}  max |grad diff| {max_grad:.2e} "
        f"(relative to the largest |grad| of its tensor {max_grad_rel:.2e})"
    )


def test_stock_sdpa_with_our_kwargs_equals_alone_and_the_checks_bite(setup):
    """HF's own sdpa reads packing from row 0 of the (4,1,T) positions; break each ingredient and it leaks."""
    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["num_segments"])
    segments = split_pack(batch, tok.special.image_pad, tok.special.video_pad)
    with torch.no_grad():
        alone = [alone_forward(ref, s) for s in segments]
        good = max_seg_diff(ref(**H.hf_forward_kwargs(batch, model=ref)).logits, alone, segments)
        assert good <= TOL

        # (a) a segment boundary shifted by one token in cu_seqlens -> our varlen attention leaks
        kw = H.hf_forward_kwargs(batch, model=packed)
        cu = kw["cu_seq_lens_q"].clone()
        cu[1] += 1
        kw["cu_seq_lens_q"] = kw["cu_seq_lens_k"] = cu
        shifted = max_seg_diff(packed(**kw).logits, alone, segments)

        # (b) text positions continuing across segments (row 0 not restarting)
        kw = H.hf_forward_kwargs(batch, model=ref)
        kw["position_ids"] = kw["position_ids"].clone()
        kw["position_ids"][0] = torch.arange(kw["position_ids"].shape[-1])
        continued_sdpa = max_seg_diff(ref(**kw).logits, alone, segments)
        for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            kw.pop(k)  # without cu_seqlens our varlen attention also takes segments from row 0
        continued_varlen = max_seg_diff(packed(**kw).logits, alone, segments)

        # (d) our M-RoPE rows replaced by the text positions: the equality above also checks our M-RoPE
        kw = H.hf_forward_kwargs(batch, model=packed)
        kw["position_ids"] = kw["position_ids"][:1].expand(4, -1, -1)
        no_mrope = max_seg_diff(packed(**kw).logits, alone, segments)

        # (c) a cache: HF skips packed-sequence detection, sdpa attends across segments
        kw = H.hf_forward_kwargs(batch, model=ref)
        kw["use_cache"] = True
        cached = max_seg_diff(ref(**kw).logits, alone, segments)
    MAX_DIFF.setdefault(name, {}).update(
        sdpa_packed=good,
        shifted_cu=shifted,
        row0_continued_sdpa=continued_sdpa,
        row0_continued_varlen=continued_varlen,
        use_cache=cached,
        no_mrope=no_mrope,
    )
    print(
        f"\n[{name}] stock sdpa packed {good:.2e}; broken: cu+1 {shifted:.2e}, row0 continued sdpa "
        f"{continued_sdpa:.2e} / varlen {continued_varlen:.2e}, use_cache=True {cached:.2e}, "
        f"text-only rope {no_mrope:.2e}"
    )
    for what, d in (
        ("shifted cu_seqlens", shifted),
        ("row 0 continued (sdpa)", continued_sdpa),
        ("row 0 continued (varlen)", continued_varlen),
        ("use_cache=True", cached),
        ("M-RoPE rows replaced by text positions", no_mrope),
    ):
        assert d > 100 * TOL, f"{name}: {what} should break the comparison, max diff {d}"
    with pytest.raises(ConfigError, match="use_cache"):
        H.packed_forward(packed, batch, use_cache=True)
    with pytest.raises(ConfigError, match="use_cache"):
        H.hf_forward_kwargs(batch, use_cache=True)
    with pytest.raises(ConfigError, match="labels"):
        H.packed_forward(packed, batch, labels=batch["labels"])
    with pytest.raises(ConfigError, match="attention_mask"):
        H.packed_forward(packed, batch, attention_mask=torch.ones_like(batch["input_ids"]))


def test_vision_towers_take_the_varlen_path(setup):
    """Our attention sees the vision cu_seqlens (non-causal) and the LLM's padded cu_seqlens (causal); a pack's
    images and videos go through the tower together (one_vision_call)."""
    from transformers import AttentionInterface

    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["num_segments"])
    calls = []

    def spy(module, query, key, value, attention_mask, **kw):
        calls.append(
            (
                type(module).__name__,
                kw.get("is_causal", module.is_causal),
                query.shape[2],
                kw.get("cu_seq_lens_q") is not None,
            )
        )
        return H.varlen_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register(H.VARLEN_ATTENTION, spy)
    try:
        with torch.no_grad():
            H.packed_forward(packed, batch)
    finally:
        H.register_varlen_attention()
    vision = [c for c in calls if "Vision" in c[0]]
    text = [c for c in calls if "Vision" not in c[0]]
    T = batch["input_ids"].shape[1]
    assert len(text) == 2 and all(c[1] is True and c[2] == T and c[3] for c in text)
    n_img_patches = int(batch["image_grid_thw"].prod(1).sum())
    n_vid_patches = int(batch["video_grid_thw"].prod(1).sum())
    if vision_varlen_in_one_call(packed.config.model_type):
        # 2 blocks, one tower call: every image and video of the pack in one attention call per block
        assert [c[2] for c in vision] == [n_img_patches + n_vid_patches] * 2
        assert all(c[1] is False and c[3] for c in vision)
    else:  # the tower hands cu_seqlens to flash_attention_2 only: one call per image / frame group / window
        assert len(vision) > 2 * 2 and all(c[1] is False and not c[3] for c in vision)
        assert sum(c[2] for c in vision) == 2 * (n_img_patches + n_vid_patches)  # 2 blocks, every patch once


def test_varlen_attention_per_segment_equals_the_block_diagonal_mask_values_and_grads():
    """The fallback (CPU / fp32) runs SDPA per cu segment; it equals one SDPA under the dense block-diagonal
    mask it replaced (and each segment alone), outputs and input gradients, GQA and an empty segment included."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 5, 12, 16], dtype=torch.int32)  # includes an empty segment
    segment = torch.repeat_interleave(torch.arange(4), (cu[1:] - cu[:-1]).long())

    class M(torch.nn.Module):
        is_causal = True

    for causal in (True, False):
        q, k, v = (torch.randn(1, h, 16, 8, requires_grad=True) for h in (4, 2, 2))
        out, _ = H.varlen_attention_forward(
            M().eval(), q, k, v, None, scaling=0.3, is_causal=causal, cu_seq_lens_q=cu, cu_seq_lens_k=cu
        )
        assert out.shape == (1, 16, 4, 8)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), (q, k, v))
        mask = segment[:, None] == segment[None, :]
        if causal:
            mask = mask & torch.ones(16, 16, dtype=torch.bool).tril()
        dense = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=0.3
        ).transpose(1, 2)
        dense_grads = torch.autograd.grad((dense * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), (q, k, v))
        assert (out - dense).abs().max() <= 1e-6
        for g, g_dense in zip(grads, dense_grads):
            assert (g - g_dense).abs().max() <= 1e-5
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            if e == s:
                continue
            ref = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, s:e],
                k[:, :, s:e].repeat_interleave(2, 1),
                v[:, :, s:e].repeat_interleave(2, 1),
                is_causal=causal,
                scale=0.3,
            ).transpose(1, 2)
            assert torch.allclose(out[:, s:e], ref, atol=1e-6)
    # without cu_seqlens the segments come from the restarting positions, else the row is one segment
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    by_positions, _ = H.varlen_attention_forward(M(), q, k, v, None, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]))
    by_cu, _ = H.varlen_attention_forward(M(), q, k, v, None, cu_seq_lens_q=torch.tensor([0, 3, 6], dtype=torch.int32))
    whole, _ = H.varlen_attention_forward(M(), q, k, v, None)
    assert torch.equal(by_positions, by_cu) and not torch.allclose(whole[:, 3:], by_cu[:, 3:])
    assert torch.allclose(
        whole, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    )
    assert H.register_varlen_attention() == H.register_varlen_attention() == H.VARLEN_ATTENTION


def _loss_case(seed, tokens=37, width=8, vocab=29, bias=False):
    torch.manual_seed(seed)
    hidden = torch.randn(1, tokens, width, requires_grad=True)
    head = torch.nn.Linear(width, vocab, bias=bias)
    labels = torch.randint(0, vocab, (1, tokens))
    labels[0, ::4] = -100
    loss_mask = (labels != -100).float() * torch.rand(1, tokens).round()  # some supervised tokens weigh 0
    loss_mask[0, 1] = 0.5  # loss_mask is a weight
    labels[0, 3] = -100  # an ignored label under a non-zero mask is still ignored
    return hidden, head, {"labels": labels, "loss_mask": loss_mask}


@pytest.mark.parametrize("bias", [False, True])
def test_chunked_loss_from_hidden_equals_packed_loss_on_full_logits_values_and_grads(bias):
    hidden, head, batch = _loss_case(0, bias=bias)
    params = [hidden, *head.parameters()]
    full, full_count = H.packed_loss(head(hidden), batch)
    full_grads = torch.autograd.grad(full, params)
    for chunk in (1, 3, 16, 1000):
        loss, count = H.packed_loss_from_hidden(hidden, head, batch, chunk_tokens=chunk)
        grads = torch.autograd.grad(loss, params)
        assert count == full_count and float(count) == float(batch["loss_mask"][0][batch["labels"][0] != -100].sum())
        assert torch.allclose(loss, full, rtol=1e-6, atol=1e-6), (chunk, float(loss), float(full))
        for g, g_full in zip(grads, full_grads):
            assert torch.allclose(g, g_full, rtol=1e-5, atol=1e-6), (chunk, float((g - g_full).abs().max()))
    if not bias:  # the head as its weight tensor, and the normalised form
        mean, _ = H.packed_loss_from_hidden(hidden, head.weight, batch, num_supervised_tokens=7)
        assert torch.allclose(mean, full / 7, rtol=1e-6)


def test_chunked_loss_keeps_one_chunk_of_logits_and_handles_an_unsupervised_row():
    hidden, head, batch = _loss_case(1, tokens=64, vocab=1000, bias=True)
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = H.packed_loss_from_hidden(hidden, head, batch, chunk_tokens=4)
    loss.backward()
    assert max(sizes) < 64 * 1000  # nothing of the row's logits is kept for the backward (chunks are recomputed)
    full = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: full.append(t.numel()) or t, lambda t: t):
        H.packed_loss(head(hidden), batch)
    assert max(full) >= 64 * 1000  # while the full-logits loss keeps them
    none = {"labels": batch["labels"], "loss_mask": torch.zeros_like(batch["loss_mask"])}
    loss, count = H.packed_loss_from_hidden(hidden, head, none)
    grads = torch.autograd.grad(loss, [hidden, head.weight, head.bias])
    assert float(loss.detach()) == 0.0 and float(count) == 0.0 and all(float(g.abs().sum()) == 0.0 for g in grads)
    with pytest.raises(ConfigError, match="hidden"):
        H.packed_loss_from_hidden(hidden[:, :-1], head, batch)
    with pytest.raises(ConfigError, match="chunk_tokens"):
        H.packed_loss_from_hidden(hidden, head, batch, chunk_tokens=0)


def test_hidden_states_path_equals_the_full_logits_path_on_real_packs(setup):
    """packed_hidden_states + packed_loss_from_hidden give packed_forward + packed_loss's loss and every gradient,
    on every supported release (4.57's output_hidden_states would not: see packed_hidden_states), and the LM head
    is back to normal afterwards."""
    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["supervised_tokens"])
    packed.zero_grad(set_to_none=True)
    out = H.packed_forward(packed, batch)
    loss, count = H.packed_loss(out.logits, batch)
    loss.backward()
    want = {n: p.grad.clone() for n, p in packed.named_parameters() if p.grad is not None}
    packed.zero_grad(set_to_none=True)
    hidden = H.packed_hidden_states(packed, batch)
    assert hidden.shape == (1, batch["input_ids"].shape[1], packed.config.text_config.hidden_size)
    assert "forward" not in packed.lm_head.__dict__  # the head is restored
    assert torch.allclose(packed.lm_head(hidden), out.logits, atol=1e-6)
    chunked, chunked_count = H.packed_loss_from_hidden(hidden, packed, batch, chunk_tokens=5)
    chunked.backward()
    assert chunked_count == count == batch["supervised_tokens"]
    assert torch.allclose(chunked, loss, rtol=1e-6, atol=1e-5), (float(chunked), float(loss))
    got = {n: p.grad for n, p in packed.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and len(got) > 20
    for n, g in got.items():
        assert torch.allclose(g, want[n], rtol=1e-5, atol=1e-5), (
            f"{name}: grad of {n}: {float((g - want[n]).abs().max())}"
        )
    packed.zero_grad(set_to_none=True)
    with pytest.raises(ConfigError, match="model"):
        H.packed_hidden_states(torch.nn.Linear(2, 2), batch)


def test_misuse_raises_config_error(shards):
    packs, _ = load_packs(shards, small_preset("qwen2.5-vl"))
    batch = dict(max(packs, key=lambda b: b["num_segments"]))
    with pytest.raises(ConfigError, match="micro_batch_size"):
        H.hf_forward_kwargs({**batch, "input_ids": batch["input_ids"].repeat(2, 1)})
    with pytest.raises(ConfigError, match="mrope_position_ids"):
        H.hf_forward_kwargs({**batch, "mrope_position_ids": None})
    with pytest.raises(ConfigError, match="mrope_position_ids"):
        H.hf_forward_kwargs({**batch, "mrope_position_ids": batch["mrope_position_ids"].repeat(1, 2, 1)})
    # text-only batches (no visual tensors): M-RoPE of text = text position on all three axes
    text = {
        **batch,
        "mrope_position_ids": None,
        **{k: None for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")},
    }
    kw = H.hf_forward_kwargs(text)
    assert kw["position_ids"].shape == (4, 1, batch["input_ids"].shape[1])
    assert torch.equal(kw["position_ids"][1], batch["position_ids"]) and torch.equal(
        kw["position_ids"][3], batch["position_ids"]
    )
    kw = H.hf_forward_kwargs(batch)
    assert kw["attention_mask"] is None and kw["use_cache"] is False and "labels" not in kw
    assert torch.equal(kw["cu_seq_lens_q"], batch["cu_seqlens_q_padded"]) and kw["max_length_q"] == int(
        batch["max_seqlen_q"]
    )
    assert torch.equal(kw["position_ids"][0], batch["position_ids"]) and torch.equal(
        kw["position_ids"][1:], batch["mrope_position_ids"]
    )


def test_packed_loss_and_normalisation():
    torch.manual_seed(0)
    logits = torch.randn(1, 6, 11)
    batch = {"labels": torch.tensor([[3, -100, 5, 7, -100, -100]]), "loss_mask": torch.tensor([[1.0, 0, 1, 1, 0, 0]])}
    loss, count = H.packed_loss(logits, batch)
    expected = sum(
        torch.nn.functional.cross_entropy(logits[0, i], torch.tensor(t)) for i, t in ((0, 3), (2, 5), (3, 7))
    )
    assert count == 3 and torch.allclose(loss, expected)  # no shift: labels[i] is the target at i
    mean, _ = H.packed_loss(logits, batch, num_supervised_tokens=6)
    assert torch.allclose(mean, expected / 6)
    assert not torch.distributed.is_initialized()
    assert float(H.global_token_count(count)) == 3.0
    assert torch.allclose(H.normalize_by_global_tokens(loss, count), expected / 3)


def test_report_max_differences():
    """Runs last in this file: print the per-version numbers (pytest -s)."""
    for name, d in sorted(MAX_DIFF.items()):
        print(f"\n[{name}] " + ", ".join(f"{k}={v:.2e}" for k, v in d.items()))


def test_packed_forward_through_a_ddp_wrapper_configures_from_the_wrapped_model(setup, tmp_path):
    """DDP/FSDP expose the model as ``.module``; the wrapper has no ``config`` of its own."""
    import torch.distributed as dist

    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["num_segments"])
    # a file rendezvous, not a fixed TCP port: runs of this file in parallel (tests/project/test_compat_matrix.py)
    # never collide
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(packed)
        assert not hasattr(ddp, "config")
        with torch.no_grad():
            wrapped = H.packed_forward(ddp, batch).logits
            direct = H.packed_forward(packed, batch).logits
        assert torch.equal(wrapped, direct), name
    finally:
        dist.destroy_process_group()


def test_precomputed_vision_kwargs_equal_hf_and_skip_the_tower_syncs(setup, monkeypatch):
    """hf_forward_kwargs computes the vision towers' positions / cu_seqlens / max_seqlen (and Qwen2.5-VL's
    window index) on the CPU; the towers use them (no grid_thw.tolist()/.item() per forward) and the
    logits are bit-identical to HF computing them itself. q and k share one cu_seqlens tensor."""
    import importlib

    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["num_segments"])
    kw = H.hf_forward_kwargs(batch, model=packed, device="cpu", one_vision_call=False)  # HF's call per kind
    assert kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"]
    model_type = packed.config.model_type
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    keys = H.vision_precompute_keys(model_type)
    precomputed = {k for k in kw if k.startswith(("image_", "video_")) and not k.endswith("_grid_thw")}
    assert precomputed == {f"{p}_{k}" for p in ("image", "video") for k in keys}
    # the function through which the installed release's tower takes its cu_seqlens (and max_seqlen)
    reader = next((f for f in ("get_vision_attention_seqlens", "get_vision_cu_seqlens") if hasattr(modeling, f)), None)
    if reader is None or not hasattr(modeling, "accepts_precomputed_kwargs"):
        assert keys == frozenset(), f"{name}: this release's towers take no precomputed tensors"
    else:
        assert {"position_ids", "cu_seqlens"} <= keys
        assert ("max_seqlen" in keys) == (reader == "get_vision_attention_seqlens")
        assert ("window_index" in keys) == (name == "qwen2.5-vl")
        for prefix in ("image", "video"):
            assert kw[f"{prefix}_cu_seqlens"].dtype == torch.int32 and int(kw[f"{prefix}_cu_seqlens"][0]) == 0
            if "max_seqlen" in keys:
                assert isinstance(kw[f"{prefix}_max_seqlen"], int)
        seen = []
        real = getattr(modeling, reader)

        def spy(*a, kwargs=None, **k):
            seen.append(sorted(kwargs or {}))
            return real(*a, kwargs=kwargs, **k)

        monkeypatch.setattr(modeling, reader, spy)
        with torch.no_grad():
            fast = packed(**kw).logits
            assert seen and all("cu_seqlens" in s and ("max_seqlen" in s) == ("max_seqlen" in keys) for s in seen), seen
            seen.clear()
            monkeypatch.setattr(hf_batch, "vision_precompute_keys", lambda model_type: frozenset())
            kw_plain = H.hf_forward_kwargs(batch, model=packed, one_vision_call=False)
            assert not any(k.startswith(("image_cu", "video_cu")) for k in kw_plain)
            plain = packed(**kw_plain).logits
            assert seen and not any("cu_seqlens" in s for s in seen)
        assert torch.equal(fast, plain), name
    # the check of the row's segments runs once per batch, on the CPU
    bad = dict(batch, cu_seqlens_kv_padded=batch["cu_seqlens_kv_padded"].clone())
    bad["cu_seqlens_kv_padded"][-1] -= 1
    with pytest.raises(ConfigError, match="cu_seqlens_kv_padded"):
        H.hf_forward_kwargs(bad, model=packed)


def test_images_and_videos_go_through_the_tower_in_one_call_with_the_same_numbers(setup):
    """one_vision_call (the default): a pack with images and videos reaches the model as one stream of media in
    token order (video tokens relabelled as image tokens, the rows gathered in token order), so the vision tower
    runs once instead of once per kind, with HF's logits and gradients of the call per kind, under our varlen
    attention and HF's own sdpa. The batch is not changed; a pack of one kind is passed as it is."""
    from energon_pack.qwen_vl.media_order import media_row_spans

    name, tok, packs, te, ref, packed = setup
    image_pad, video_pad = tok.special.image_pad, tok.special.video_pad
    merge = packed.config.vision_config.spatial_merge_size

    def kinds(b):
        spans = media_row_spans(b["input_ids"], b["image_grid_thw"], b["video_grid_thw"], image_pad, video_pad, merge)
        return [kind for kind, *_ in spans]

    both = [b for b in packs if b.get("image_grid_thw") is not None and b.get("video_grid_thw") is not None]
    interleaved = [b for b in both if kinds(b) != sorted(kinds(b))]  # a video before an image (vi7's pack)
    assert interleaved, f"{name}: no pack interleaves images and videos: {[kinds(b) for b in both]}"
    batch = interleaved[0]
    order = kinds(batch)
    ids_before = batch["input_ids"].clone()
    kw = H.hf_forward_kwargs(batch, model=packed)
    assert torch.equal(batch["input_ids"], ids_before) and int((batch["input_ids"] == video_pad).sum()) > 0
    assert "pixel_values_videos" not in kw and "video_grid_thw" not in kw
    assert not any(k.startswith("video_") for k in kw) and "second_per_grid_ts" not in kw
    assert int((kw["input_ids"] == video_pad).sum()) == 0
    visual = (kw["input_ids"] == image_pad).sum()
    assert int(visual) == int((ids_before == image_pad).sum() + (ids_before == video_pad).sum())
    assert kw["image_grid_thw"].shape[0] == len(order) and kw["pixel_values"].shape[0] == int(
        kw["image_grid_thw"].prod(-1).sum()
    )
    one_kind = dict(batch, pixel_values_videos=None, video_grid_thw=None)
    assert hf_batch.one_vision_stream(one_kind, packed.config) is None

    for model in (packed, ref):  # our varlen attention; HF's own sdpa
        tower = getattr(getattr(model, "model", model), "visual", None) or model.visual
        results = {}
        for one in (True, False):
            calls: list[int] = []
            handle = tower.register_forward_hook(lambda *a, seen=calls: seen.append(1))
            model.zero_grad(set_to_none=True)
            try:
                out = model(**H.hf_forward_kwargs(batch, model=model, one_vision_call=one))
            finally:
                handle.remove()
            H.packed_loss(out.logits, batch)[0].backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results[one] = (out.logits.detach(), grads, len(calls))
        (logits1, grads1, calls1), (logits2, grads2, calls2) = results[True], results[False]
        assert (calls1, calls2) == (1, 2), name
        # the tower's matmuls see rows batched one way or the other: fp32 rounding of a few ulps (2.1e-6 on an
        # AMD EPYC, under 1e-6 elsewhere); a wrong row order or a missed image would differ by O(0.1)
        assert torch.allclose(logits1, logits2, rtol=0, atol=1e-5), float((logits1 - logits2).abs().max())
        assert grads1.keys() == grads2.keys() and any("visual" in n for n in grads1)
        for n in grads1:
            # a weight's gradient sums over every row: one call or two sum in another order (fp32 rounding)
            assert torch.allclose(grads1[n], grads2[n], rtol=1e-5, atol=1e-5), (name, n)
    packed.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)


def test_uint8_pixels_are_normalised_with_the_preset_or_refused(setup, shards):
    """pixel_dtype="uint8" (a quarter of the bytes through the loader) gives the float32 logits when
    hf_forward_kwargs gets the preset; without it, raw 0..255 values are refused, never fed to the tower."""
    name, tok, packs, te, ref, packed = setup
    u8_packs, u8_te = load_packs(shards, get_preset(te.preset, pixel_dtype="uint8"))
    assert [b["__keys__"] for b in u8_packs] == [b["__keys__"] for b in packs]
    for b32, b8 in zip(packs, u8_packs):
        if b8["pixel_values"] is None and b8["pixel_values_videos"] is None:
            continue
        assert all(b8[k].dtype == torch.uint8 for k in ("pixel_values", "pixel_values_videos") if b8[k] is not None)
        with pytest.raises(ConfigError) as err:
            H.packed_forward(packed, b8)
        assert err.value.knob == "pixel_dtype"
        with torch.no_grad():
            got = H.packed_forward(packed, b8, preset=u8_te.preset).logits
            want = H.packed_forward(packed, b32).logits
        assert torch.equal(got, want), name


def test_releases_outside_the_supported_range_get_a_config_error_from_every_entry_point(setup, monkeypatch):
    """Below 4.57 our entry points refuse with a ConfigError naming the version and the range, before
    transformers could fail inside with a TypeError; a release newer than the newest tested one warns."""
    import importlib.metadata

    name, tok, packs, te, ref, packed = setup
    batch = packs[0]
    real_version = importlib.metadata.version

    def installed(release):
        monkeypatch.setattr(
            importlib.metadata, "version", lambda d: release if d == "transformers" else real_version(d)
        )
        monkeypatch.setattr(hf_version, "_VERSION_CHECKED", None)

    for release in ("4.56.2", "4.46.0"):
        installed(release)
        for call in (
            lambda: H.hf_forward_kwargs(batch, model=packed),
            lambda: H.packed_forward(packed, batch),
            lambda: H.use_varlen_attention(copy.deepcopy(ref)),
            H.register_varlen_attention,
            lambda: H.prepare_model(copy.deepcopy(ref)),
        ):
            with pytest.raises(ConfigError) as err:
                call()
            assert err.value.knob == "transformers"
            assert release in str(err.value) and H.SUPPORTED_TRANSFORMERS in str(err.value)
    for release in ("4.57.1", "5.0.0rc1", "5.24.3"):
        installed(release)
        assert H.check_transformers_version() == release
    installed("5.99.0")
    with pytest.warns(UserWarning, match="newer than the newest release"):
        assert H.check_transformers_version() == "5.99.0"


def test_the_declared_transformers_range_is_the_checked_one():
    """pyproject's hf and test extras declare SUPPORTED_TRANSFORMERS, and the installed release is inside it."""
    import re
    from pathlib import Path

    from packaging.specifiers import SpecifierSet

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    declared = re.findall(r'"transformers([^"]*)"', text)
    assert declared and set(declared) == {H.SUPPORTED_TRANSFORMERS}, declared
    assert transformers.__version__ in SpecifierSet(H.SUPPORTED_TRANSFORMERS)


def test_guard_drops_the_text_varlen_kwargs_before_a_vision_tower():
    """Releases whose VL forward hands its **kwargs to the vision towers would pass cu_seq_lens_q twice to the
    vision attention; the guard's pre-hook removes the four text varlen kwargs and nothing else."""
    seen = {}

    class Tower(torch.nn.Module):
        def forward(self, x, grid_thw=None, **kwargs):
            seen.update(kwargs)
            return x

    class VL(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = Tower()

    model = VL()
    H.guard_vision_towers(model)
    H.guard_vision_towers(model)  # idempotent: one hook
    assert len(model.visual._forward_pre_hooks) == 1
    model.visual(
        torch.zeros(1),
        grid_thw=1,
        cu_seq_lens_q=1,
        cu_seq_lens_k=1,
        max_length_q=1,
        max_length_k=1,
        cu_seqlens=2,
        max_seqlen=3,
    )
    assert seen == {"cu_seqlens": 2, "max_seqlen": 3}


# ------------------------------------------------------------------ the batch's preset against the model
#: (rope_style, tokens_per_second, patch_size) of each version's preset; temporal patch and merge are 2 in all
RECORDS = {"qwen2-vl": ("qwen2", 1.0, 14), "qwen2.5-vl": ("qwen2.5", 2.0, 14), "qwen3-vl": ("qwen3", 1.0, 16)}


def _record(name):
    rope_style, tps, patch = RECORDS[name]
    return {
        "name": name,
        "rope_style": rope_style,
        "tokens_per_second": tps,
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }


@pytest.fixture(scope="module")
def every_version(shards):
    """Per version: the packs its preset builds through the real loader, and a tiny model of that version."""
    tok = load_demo_tokenizer()
    models = {name: H.prepare_model(tiny_model(name, tok), attention=None, static_visual=False) for name in PRESETS}
    return {name: (load_packs(shards, small_preset(name))[0], models[name]) for name in PRESETS}


def _forwards_run(model):
    """A list that records every forward of ``model`` (its top module) from now on, and the hook's handle."""
    calls = []
    return calls, model.register_forward_pre_hook(lambda module, args: calls.append(type(module).__name__))


def test_batches_record_the_preset_that_built_them_through_worker_processes_and_pinning(setup, shards):
    from torch.utils.data._utils.pin_memory import pin_memory

    name, tok, packs, te, *_ = setup
    assert all(b["vision_preset"] == _record(name) for b in packs)
    te = QwenVLPackingTaskEncoder(
        tokenizer="demo", preset=small_preset(name), seq_length=192, cp=2, pad_to_max_length=True
    )
    ds = get_train_dataset(
        str(shards),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    in_worker = [b["vision_preset"] for b in get_loader(ds)]
    assert len(in_worker) == len(packs) and all(r == _record(name) for r in in_worker)
    assert pin_memory({"vision_preset": in_worker[0]}) == {"vision_preset": _record(name)}


@pytest.mark.parametrize("built", list(PRESETS))
@pytest.mark.parametrize("model_version", list(PRESETS))
def test_a_batch_of_another_version_is_refused_before_the_forward(every_version, built, model_version):
    """Each (preset, model) pair of different versions: a ConfigError naming both sides and the fix, and no
    forward runs; the matching pair runs (its parity is test_packed_logits_loss_and_grads_equal_each_sample_alone)."""
    packs, _ = every_version[built]
    model = every_version[model_version][1]
    batch = max(packs, key=lambda b: b["num_segments"])
    calls, hook = _forwards_run(model)
    try:
        if built == model_version:
            with torch.no_grad():
                H.packed_forward(model, batch)
            assert calls == [type(model).__name__]
            return
        for call in (lambda: H.packed_forward(model, batch), lambda: H.hf_forward_kwargs(batch, model=model)):
            with pytest.raises(ConfigError) as err:
                call()
            assert err.value.knob == "preset"
            model_type = PRESETS[model_version]
            assert err.value.problem.startswith(f"the batch's preset {built!r} (M-RoPE {RECORDS[built][0]}")
            assert (
                f"is not the {model_type} model's ({model_version!r}: M-RoPE {RECORDS[model_version][0]}"
                in err.value.problem
            )
            assert err.value.fix == f"build the task encoder with preset={model_version!r}, the model's version"
        assert calls == []
    finally:
        hook.remove()


def test_a_preset_of_other_sizes_than_a_custom_config_names_the_sizes(setup):
    """Same version, other patch / merge sizes in the model's vision_config: the sizes to override in the preset."""
    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["num_segments"])
    patch = RECORDS[name][2]
    config = copy.deepcopy(ref.config)
    config.vision_config.patch_size = patch + 2
    config.vision_config.spatial_merge_size = 4
    with pytest.raises(ConfigError) as err:
        H.hf_forward_kwargs(batch, model=config)
    assert err.value.knob == "preset"
    assert f"patch {patch}, temporal patch 2, merge 2) does not match" in err.value.problem
    assert err.value.problem.endswith(f"patch {patch + 2}, temporal patch 2, merge 4)")
    assert (
        err.value.fix
        == f"build the task encoder with get_preset({name!r}, patch_size={patch + 2}, merge_size=4) to match it"
    )
    # the record matching the custom config passes the preset check (and then the pixel rows, still 14/16 wide, fail)
    custom = dict(batch, vision_preset={**batch["vision_preset"], "patch_size": patch + 2, "merge_size": 4})
    with pytest.raises(ConfigError) as err:
        H.hf_forward_kwargs(custom, model=config)
    assert err.value.knob == "pixel_values"
    # a uint8 normaliser preset of another version is refused the same way
    other = "qwen3-vl" if name != "qwen3-vl" else "qwen2-vl"
    with pytest.raises(ConfigError) as err:
        H.hf_forward_kwargs(batch, model=packed, preset=get_preset(other))
    assert err.value.knob == "preset" and err.value.problem.startswith(f"the preset= argument's preset {other!r}")


def test_a_hand_built_batch_of_another_patch_size_gets_the_sentence_not_a_tower_error(setup):
    """Without a preset record, pixel rows of another width (e.g. Qwen3-VL's 16 vs 14), grids that do not cover
    the rows or are not divisible by the merge size are refused before the forward; unchecked, the tower fails."""
    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["num_segments"])
    hand = {k: v for k, v in batch.items() if k != "vision_preset"}
    patch = RECORDS[name][2]
    other = 30 - patch  # 14 <-> 16
    width, other_width = 3 * 2 * patch * patch, 3 * 2 * other * other
    assert batch["pixel_values"].shape[1] == width
    wrong = dict(hand, pixel_values=torch.zeros(batch["pixel_values"].shape[0], other_width))
    calls, hook = _forwards_run(packed)
    try:
        with pytest.raises(ConfigError) as err:
            H.packed_forward(packed, wrong)
        assert calls == []
    finally:
        hook.remove()
    assert err.value.knob == "pixel_values"
    assert err.value.problem == (
        f"rows of shape ({other_width},) do not fit the {PRESETS[name]} vision tower, which takes "
        f"rows of in_channels * temporal_patch_size * patch_size^2 = 3 * 2 * {patch}^2 = {width}"
    )
    assert err.value.fix == (
        f"build the batch with preset={name!r}, or with patch sizes overridden to match the model's vision_config"
    )
    # the same rows past the check fail inside the vision tower, with no sentence
    kw = H.hf_forward_kwargs(hand, model=packed)
    kw["pixel_values"] = wrong["pixel_values"]
    with pytest.raises(Exception) as deep, torch.no_grad():
        packed(**kw)
    assert not isinstance(deep.value, ConfigError)
    rows = batch["pixel_values_videos"].shape[0]
    with pytest.raises(ConfigError) as err:
        H.hf_forward_kwargs(dict(hand, pixel_values_videos=batch["pixel_values_videos"][:-1]), model=packed)
    assert err.value.knob == "video_grid_thw" and err.value.problem == (
        f"covers {rows} patches but pixel_values_videos has {rows - 1} rows"
    )
    grid = batch["image_grid_thw"].clone()
    t, h, w = grid[0].tolist()
    grid[0] = torch.tensor([t * h, 1, w])  # the same patches, a height of 1: not a whole merge block
    with pytest.raises(ConfigError) as err:
        H.hf_forward_kwargs(dict(hand, image_grid_thw=grid), model=packed)
    assert err.value.knob == "image_grid_thw"
    assert err.value.problem == f"grid {[t * h, 1, w]} is not divisible by the model's spatial_merge_size 2"
    # the hand-built batch of the right width still runs, with the logits of the recorded one
    with torch.no_grad():
        assert torch.equal(H.packed_forward(packed, hand).logits, H.packed_forward(packed, batch).logits)


# ------------------------------------------------------------------ prepare_model: the one place that installs
def _installed(model):
    """What is installed on ``model``: forward pre-hooks per module, the attention of every config, the record."""
    from transformers import PreTrainedModel

    hooks = {name: len(m._forward_pre_hooks) for name, m in model.named_modules() if m._forward_pre_hooks}
    attention = sorted({m.config._attn_implementation for m in model.modules() if isinstance(m, PreTrainedModel)})
    return hooks, attention, getattr(model, hf_model.PREPARED_ATTR, None)


@pytest.mark.parametrize("name", list(PRESETS))
def test_prepare_model_installs_what_it_says_once(name):
    """The varlen attention on the model and every sub-model, one guard per vision tower, the static-visual
    hooks (and Qwen3-VL's deepstack hook on the text model); a second call installs nothing more."""
    model = tiny_model(name, load_demo_tokenizer())
    assert _installed(model) == ({}, ["sdpa"], None)
    assert H.prepare_model(model) is model
    hooks, attention, record = _installed(model)
    text_hooked = {"model.language_model": 1} if name == "qwen3-vl" else {}
    assert hooks == {"": 1, "model.visual": 1, **text_hooked}
    assert attention == [H.VARLEN_ATTENTION] and record.static_visual and record.explicit
    H.prepare_model(model)
    assert _installed(model) == (hooks, attention, record)  # idempotent
    # the attention kept (None), no static-visual hooks; a DDP-like wrapper prepares its .module and is returned
    plain = tiny_model(name, load_demo_tokenizer())
    wrapper = torch.nn.Module()
    wrapper.module = plain
    assert H.prepare_model(wrapper, attention=None, static_visual=False) is wrapper
    assert _installed(plain)[:2] == ({"model.visual": 1}, ["sdpa"])
    assert not hasattr(wrapper, hf_model.PREPARED_ATTR)
    with pytest.raises(ConfigError) as err:
        H.prepare_model(plain.config)
    assert err.value.knob == "model"


def test_forward_kwargs_install_nothing_on_a_prepared_model_and_warn_once_on_an_unprepared_one(setup):
    """hf_forward_kwargs / packed_forward only read a prepared model (no warning, nothing installed). An
    unprepared one is prepared once, with a DeprecationWarning at the caller's line naming prepare_model, the
    model's attention kept: the logits of the same model prepared explicitly with attention=None."""
    import warnings

    name, tok, packs, te, ref, packed = setup
    batch = max(packs, key=lambda b: b["num_segments"])
    before = _installed(packed)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        kw = H.hf_forward_kwargs(batch, model=packed)
        with torch.no_grad():
            H.packed_forward(packed, batch)
        H.hf_forward_kwargs(batch, model=packed.config)  # a config: nothing to install
    assert not [w for w in seen if issubclass(w.category, DeprecationWarning)]
    assert _installed(packed) == before and "energon_static_visual" not in kw

    for call in (lambda m: H.hf_forward_kwargs(batch, model=m), lambda m: H.packed_forward(m, batch)):
        fresh = tiny_model(name, tok)
        explicit = H.prepare_model(copy.deepcopy(fresh), attention=None, static_visual=False)
        with pytest.warns(DeprecationWarning, match=r"prepare_model\(model\)") as record:
            with torch.no_grad():
                call(fresh)
        deprecations = [w for w in record if issubclass(w.category, DeprecationWarning)]
        assert len(deprecations) == 1 and deprecations[0].filename == __file__  # the caller's line
        hooks, attention, state = _installed(fresh)
        assert (hooks, attention) == _installed(explicit)[:2] == ({"model.visual": 1}, ["sdpa"])
        assert not state.explicit and not state.static_visual
        with warnings.catch_warnings(record=True) as again:
            warnings.simplefilter("always")
            with torch.no_grad():
                got = fresh(**H.hf_forward_kwargs(batch, model=fresh)).logits
                want = explicit(**H.hf_forward_kwargs(batch, model=explicit)).logits
        assert not [w for w in again if issubclass(w.category, DeprecationWarning)]  # once per model
        assert torch.equal(got, want), name


def test_a_static_batch_needs_the_static_hooks():
    """A model prepared explicitly without the static-visual hooks refuses a static-visual batch (ConfigError); one
    prepared by the deprecated path gets them then, with the warning again."""
    model = tiny_model("qwen2-vl", load_demo_tokenizer())
    with pytest.warns(DeprecationWarning, match="the vision tower guards on a model"):
        hf_model.ensure_prepared(model, static_visual=False, stacklevel=1)
    assert not _installed(model)[2].static_visual
    with pytest.warns(DeprecationWarning, match="static-visual hooks"):
        hf_model.ensure_prepared(model, static_visual=True, stacklevel=1)
    assert _installed(model)[0] == {"": 1, "model.visual": 1}
    explicit = H.prepare_model(tiny_model("qwen2-vl", load_demo_tokenizer()), static_visual=False)
    hf_model.ensure_prepared(explicit, static_visual=False, stacklevel=1)
    with pytest.raises(ConfigError) as err:
        hf_model.ensure_prepared(explicit, static_visual=True, stacklevel=1)
    assert err.value.knob == "static_visual" and "prepare_model(model)" in err.value.fix
