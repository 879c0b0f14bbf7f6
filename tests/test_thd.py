"""THD batch builder: golden batches checked key by key, every error path, properties, attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.errors import ConfigError
from energon_pack.thd import (
    IGNORE_INDEX,
    VISUAL_KEYS,
    ThdLayout,
    ThdSegment,
    aligned_length,
    alignment_multiple,
    build_thd_batch,
    shifted_labels_and_loss_mask,
    thd_attention_mask,
)

F_, T_ = False, True
X = IGNORE_INDEX

CONTRACT_KEYS = {
    "input_ids", "labels", "loss_mask", "position_ids", "mrope_position_ids",
    "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
    "max_seqlen_q", "max_seqlen_kv", "padding_mask", *VISUAL_KEYS,
    "real_tokens", "supervised_tokens", "total_tokens", "num_segments", "__keys__",
}  # fmt: skip


def seg(ids, target, **kw) -> ThdSegment:
    return ThdSegment.from_target_mask(torch.tensor(ids), torch.tensor(target), **kw)


def row(values, dtype) -> torch.Tensor:
    return torch.tensor([values], dtype=dtype)


def assert_batch(batch: dict, *, ids, labels, loss, pos, pad, cu, cu_padded, max_seqlen, real, supervised, keys,
                 mrope=None, visual=None) -> None:  # fmt: skip
    """Every contract key, with exact values, dtypes and shapes."""
    assert set(batch) == CONTRACT_KEYS
    n = len(keys)
    T = len(ids)
    expected = {
        "input_ids": row(ids, torch.int64),
        "labels": row(labels, torch.int64),
        "loss_mask": row(loss, torch.float32),
        "position_ids": row(pos, torch.int64),
        "padding_mask": row(pad, torch.bool),
        "cu_seqlens_q": torch.tensor(cu, dtype=torch.int32),
        "cu_seqlens_kv": torch.tensor(cu, dtype=torch.int32),
        "cu_seqlens_q_padded": torch.tensor(cu_padded, dtype=torch.int32),
        "cu_seqlens_kv_padded": torch.tensor(cu_padded, dtype=torch.int32),
        "max_seqlen_q": torch.tensor(max_seqlen, dtype=torch.int32),
        "max_seqlen_kv": torch.tensor(max_seqlen, dtype=torch.int32),
        "mrope_position_ids": None if mrope is None else torch.tensor(mrope, dtype=torch.int64).unsqueeze(1),
        **{k: (visual or {}).get(k) for k in VISUAL_KEYS},
    }
    for key, want in expected.items():
        got = batch[key]
        if want is None:
            assert got is None, key
            continue
        assert got.dtype == want.dtype, key
        assert got.shape == want.shape, (key, got.shape, want.shape)
        assert torch.equal(got, want), (key, got, want)
    assert batch["max_seqlen_q"].dim() == 0
    assert batch["cu_seqlens_q"] is batch["cu_seqlens_kv"]
    assert batch["cu_seqlens_q_padded"] is batch["cu_seqlens_kv_padded"]
    stats = {k: batch[k] for k in ("real_tokens", "supervised_tokens", "total_tokens", "num_segments")}
    assert stats == {"real_tokens": real, "supervised_tokens": supervised, "total_tokens": T, "num_segments": n}
    assert all(type(v) is int for v in stats.values())
    assert batch["__keys__"] == keys


# --------------------------------------------------------------------------- golden batches


def test_golden_bridge_worked_example_m4_width12_lengths_5_and_4():
    segments = [
        seg([101, 102, 103, 104, 105], [0, 0, 1, 1, 1], key="five"),
        seg([201, 202, 203, 204], [0, 1, 1, 1], key="four"),
    ]
    batch = build_thd_batch(segments, ThdLayout(seq_length=12, pad_multiple=4, pad_to_max_length=True))
    assert_batch(
        batch,
        ids=[101, 102, 103, 104, 105, 0, 0, 0, 201, 202, 203, 204],
        labels=[X, 103, 104, 105, X, X, X, X, 202, 203, 204, X],
        loss=[0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0],
        pos=[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3],
        pad=[F_] * 5 + [T_] * 3 + [F_] * 4,
        cu=[0, 5, 9],
        cu_padded=[0, 8, 12],
        max_seqlen=8,
        real=9,
        supervised=6,
        keys=["five", "four"],
    )


def test_golden_direct_text_example_m4_lengths_3_and_4():
    segments = [seg([11, 21, 22], [0, 1, 1], key="a"), seg([11, 12, 21, 22], [0, 0, 1, 1], key="b")]
    batch = build_thd_batch(segments, ThdLayout(seq_length=16, pad_multiple=4))
    assert_batch(
        batch,
        ids=[11, 21, 22, 0, 11, 12, 21, 22],
        labels=[21, 22, X, X, X, 21, 22, X],
        loss=[1, 1, 0, 0, 0, 1, 1, 0],
        pos=[0, 1, 2, 3, 0, 1, 2, 3],
        pad=[F_, F_, F_, T_, F_, F_, F_, F_],
        cu=[0, 3, 7],
        cu_padded=[0, 4, 8],
        max_seqlen=4,
        real=7,
        supervised=4,
        keys=["a", "b"],
    )


def test_golden_unaligned_text_has_no_gaps():
    segments = [seg([11, 21, 22], [0, 1, 1]), seg([11, 12, 21, 22], [0, 0, 1, 1])]
    batch = build_thd_batch(segments, ThdLayout(seq_length=16))
    assert_batch(
        batch,
        ids=[11, 21, 22, 11, 12, 21, 22],
        labels=[21, 22, X, X, 21, 22, X],
        loss=[1, 1, 0, 0, 1, 1, 0],
        pos=[0, 1, 2, 0, 1, 2, 3],
        pad=[F_] * 7,
        cu=[0, 3, 7],
        cu_padded=[0, 3, 7],
        max_seqlen=4,
        real=7,
        supervised=4,
        keys=[None, None],
    )


def test_golden_single_sample_fixed_width_tail_absorbed():
    batch = build_thd_batch(
        [seg([5, 6, 7, 8], [1, 1, 1, 1], key="only")], ThdLayout(seq_length=12, pad_to_max_length=True)
    )
    assert_batch(
        batch,
        ids=[5, 6, 7, 8] + [0] * 8,
        labels=[6, 7, 8] + [X] * 9,
        loss=[1, 1, 1] + [0] * 9,
        pos=list(range(12)),
        pad=[F_] * 4 + [T_] * 8,
        cu=[0, 4],
        cu_padded=[0, 12],
        max_seqlen=12,
        real=4,
        supervised=3,
        keys=["only"],
    )


def test_golden_pad_cu_seqlens_static_shape():
    layout = ThdLayout(seq_length=16, pad_multiple=4, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=4)
    segments = [seg([1, 2, 3], [1, 1, 1]), seg([4, 5, 6, 7, 8, 9], [0, 0, 0, 1, 1, 1])]
    batch = build_thd_batch(segments, layout)
    assert_batch(
        batch,
        ids=[1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 0, 0, 0, 0, 0, 0],
        labels=[2, 3, X, X, X, X, 7, 8, 9] + [X] * 7,
        loss=[1, 1, 0, 0, 0, 0, 1, 1, 1] + [0] * 7,
        pos=[0, 1, 2, 3] + list(range(12)),
        pad=[F_, F_, F_, T_] + [F_] * 6 + [T_] * 6,
        cu=[0, 3, 9, 9, 9],
        cu_padded=[0, 4, 16, 16, 16],
        max_seqlen=16,  # pinned to the width (the largest span is 12)
        real=9,
        supervised=5,
        keys=[None, None],
    )


def test_golden_mrope_positions_gaps_continue_text_positions():
    image_like = [[0, 1, 1], [0, 1, 2], [0, 3, 1]]  # max over the 3 axes is 3
    segments = [
        seg([1, 2, 3], [0, 1, 1], mrope_position_ids=torch.tensor(image_like)),
        seg([4, 5], [0, 1], mrope_position_ids=torch.tensor([[0, 1]] * 3)),
    ]
    batch = build_thd_batch(segments, ThdLayout(seq_length=8, pad_multiple=4))
    assert_batch(
        batch,
        ids=[1, 2, 3, 0, 4, 5, 0, 0],
        labels=[2, 3, X, X, 5, X, X, X],
        loss=[1, 1, 0, 0, 1, 0, 0, 0],
        pos=[0, 1, 2, 3, 0, 1, 2, 3],
        pad=[F_, F_, F_, T_, F_, F_, T_, T_],
        cu=[0, 3, 5],
        cu_padded=[0, 4, 8],
        max_seqlen=4,
        real=5,
        supervised=3,
        keys=[None, None],
        mrope=[[0, 1, 1, 4, 0, 1, 2, 3], [0, 1, 2, 4, 0, 1, 2, 3], [0, 3, 1, 4, 0, 1, 2, 3]],
    )


def test_golden_visual_tensors_concatenated_in_segment_order():
    img_a = {"pixel_values": torch.full((4, 6), 1.0), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    img_b = {"pixel_values": torch.full((8, 6), 2.0), "image_grid_thw": torch.tensor([[1, 2, 4]])}
    vid_c = {
        "pixel_values_videos": torch.full((2, 6), 3.0),
        "video_grid_thw": torch.tensor([[2, 1, 1]]),
        "second_per_grid_ts": torch.tensor([0.5]),
    }
    segments = [
        seg([1, 2], [0, 1], visual=img_a, key="a"),
        seg([3, 4], [0, 1], key="text"),  # no media in between
        seg([5, 6], [0, 1], visual=img_b, key="b"),
        seg([7, 8], [0, 1], visual=vid_c, key="c"),
    ]
    batch = build_thd_batch(segments, ThdLayout(seq_length=8))
    assert_batch(
        batch,
        ids=[1, 2, 3, 4, 5, 6, 7, 8],
        labels=[2, X, 4, X, 6, X, 8, X],
        loss=[1, 0, 1, 0, 1, 0, 1, 0],
        pos=[0, 1, 0, 1, 0, 1, 0, 1],
        pad=[F_] * 8,
        cu=[0, 2, 4, 6, 8],
        cu_padded=[0, 2, 4, 6, 8],
        max_seqlen=2,
        real=8,
        supervised=4,
        keys=["a", "text", "b", "c"],
        visual={
            "pixel_values": torch.cat([torch.full((4, 6), 1.0), torch.full((8, 6), 2.0)]),
            "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 4]]),
            "pixel_values_videos": torch.full((2, 6), 3.0),
            "video_grid_thw": torch.tensor([[2, 1, 1]]),
            "second_per_grid_ts": torch.tensor([0.5]),
        },
    )


def test_golden_custom_pad_token_id_fills_gaps_and_tail():
    segments = [seg([1, 2, 3], [1, 1, 1]), seg([4], [1])]
    layout = ThdLayout(seq_length=8, pad_multiple=2, pad_to_max_length=True, pad_token_id=151643)
    batch = build_thd_batch(segments, layout)
    P = 151643
    assert_batch(
        batch,
        ids=[1, 2, 3, P, 4, P, P, P],
        labels=[2, 3, X, X, X, X, X, X],
        loss=[1, 1, 0, 0, 0, 0, 0, 0],
        pos=[0, 1, 2, 3, 0, 1, 2, 3],
        pad=[F_, F_, F_, T_, F_, T_, T_, T_],
        cu=[0, 3, 4],
        cu_padded=[0, 4, 8],
        max_seqlen=4,
        real=4,
        supervised=2,
        keys=[None, None],
    )


def test_custom_ignore_index_used_in_gaps_and_boundaries():
    segments = [seg([1, 2, 3], [1, 1, 1], ignore_index=-1)]
    batch = build_thd_batch(segments, ThdLayout(seq_length=4, pad_to_max_length=True, ignore_index=-1))
    assert batch["labels"].tolist() == [[2, 3, -1, -1]]
    assert batch["loss_mask"].tolist() == [[1.0, 1.0, 0.0, 0.0]]


def test_builder_enforces_boundary_and_mask_consistency_on_caller_labels():
    # Caller labels predict across the boundary and disagree with the mask: the builder fixes both.
    bad = ThdSegment(
        input_ids=torch.tensor([1, 2, 3, 4]),
        labels=torch.tensor([2, X, 4, 99]),  # last label crosses the boundary
        loss_mask=torch.tensor([0.0, 1.0, 1.0, 1.0]),  # 1 on an ignored label, 0 on a real one
    )
    batch = build_thd_batch([bad], ThdLayout(seq_length=4))
    assert batch["labels"].tolist() == [[X, X, 4, X]]
    assert batch["loss_mask"].tolist() == [[0.0, 0.0, 1.0, 0.0]]
    assert batch["supervised_tokens"] == 1
    assert bad.labels.tolist() == [2, X, 4, 99]  # the caller's tensors are not mutated


def test_segment_normalises_dtypes():
    s = ThdSegment(
        input_ids=torch.tensor([1, 2], dtype=torch.int32),
        labels=torch.tensor([2, X], dtype=torch.int32),
        loss_mask=torch.tensor([1, 0], dtype=torch.int64),
        mrope_position_ids=torch.zeros((3, 2), dtype=torch.int32),
    )
    assert (s.input_ids.dtype, s.labels.dtype, s.loss_mask.dtype, s.mrope_position_ids.dtype) == (
        torch.int64, torch.int64, torch.float32, torch.int64,
    )  # fmt: skip
    assert len(s) == 2


def test_shifted_labels_and_loss_mask():
    labels, mask = shifted_labels_and_loss_mask(torch.tensor([10, 11, 12, 13]), torch.tensor([0, 1, 0, 1]))
    assert labels.tolist() == [11, X, 13, X]
    assert mask.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert mask.dtype == torch.float32


def test_segment_span_is_aligned_length():
    layout = ThdLayout(seq_length=16, pad_multiple=4)
    assert [layout.segment_span(n) for n in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 12]
    assert [aligned_length(n, 3) for n in (1, 3, 4)] == [3, 3, 6]


# --------------------------------------------------------------------------- alignment rule


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"cp": 1, "tp": 1, "sp": False}, 1),
        ({"cp": 1, "tp": 4, "sp": False}, 1),
        ({"cp": 1, "tp": 4, "sp": True}, 4),
        ({"cp": 2, "tp": 4, "sp": True}, 8),
        ({"cp": 2}, 4),
        ({"cp": 2, "eval_cp": 4}, 8),
        ({"cp": 2, "tp": 2, "sp": True, "eval_cp": 4}, 8),
        ({"cp": 3, "tp": 2, "sp": True}, 6),
    ],
)
def test_alignment_multiple_table(kwargs, expected):
    assert alignment_multiple(**kwargs) == expected


@pytest.mark.parametrize("knob", ["cp", "tp", "eval_cp"])
def test_alignment_multiple_rejects_sizes_below_one(knob):
    with pytest.raises(ConfigError, match=knob) as info:
        alignment_multiple(**{knob: 0})
    assert info.value.knob == knob


# --------------------------------------------------------------------------- error paths


@pytest.mark.parametrize(
    ("kwargs", "knob", "words"),
    [
        ({"seq_length": 0}, "seq_length", "seq_length"),
        ({"seq_length": -4}, "seq_length", "seq_length"),
        ({"seq_length": 8, "pad_multiple": 0}, "pad_multiple", "alignment_multiple"),
        ({"seq_length": 10, "pad_multiple": 4}, "seq_length", "multiple of 4"),
        ({"seq_length": 8, "pad_cu_seqlens": True, "max_segments": 4}, "pad_cu_seqlens", "pad_to_max_length=True"),
        ({"seq_length": 8, "pad_to_max_length": True, "pad_cu_seqlens": True}, "pad_cu_seqlens", "max_segments"),
        ({"seq_length": 8, "pad_token_id": -1}, "pad_token_id", "tokenizer's pad id"),
        ({"seq_length": 8, "max_segments": 0}, "max_segments", ">= 1"),
    ],
)
def test_layout_config_errors_name_knob_and_fix(kwargs, knob, words):
    with pytest.raises(ConfigError) as info:
        ThdLayout(**kwargs)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert info.value.knob == knob
    assert message.startswith(f"{knob}:") and "Fix:" in message
    assert words in message


def test_old_name_width_still_works_and_warns():
    with pytest.warns(DeprecationWarning, match="ThdLayout: 'width' is deprecated, use 'seq_length'"):
        old = ThdLayout(width=16, pad_multiple=4)
    assert old == ThdLayout(seq_length=16, pad_multiple=4) == ThdLayout(16, 4)
    with pytest.warns(DeprecationWarning, match=r"ThdLayout\.width: 'width' is deprecated"):
        assert old.width == 16
    with pytest.warns(DeprecationWarning):
        with pytest.raises(ConfigError, match="^seq_length: 10 is not divisible by pad_multiple 4"):
            ThdLayout(width=10, pad_multiple=4)  # the old name reports the new knob
    with pytest.raises(TypeError, match="not both"):
        ThdLayout(seq_length=16, width=16)


def test_empty_segment_list_raises():
    with pytest.raises(ValueError, match="empty segment list"):
        build_thd_batch([], ThdLayout(seq_length=8))


def test_empty_segment_raises():
    with pytest.raises(ValueError, match="empty segment"):
        ThdSegment(torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), torch.tensor([]))


def test_overflow_raises_with_aligned_total_and_width():
    segments = [seg([1] * 5, [1] * 5), seg([2] * 5, [1] * 5)]  # aligned 8 + 8 = 16 > 12
    with pytest.raises(ValueError, match="Packed sequence length 16 exceeds width 12"):
        build_thd_batch(segments, ThdLayout(seq_length=12, pad_multiple=4))
    with pytest.raises(ValueError, match="Packed sequence length 16 exceeds width 12"):
        build_thd_batch(segments, ThdLayout(seq_length=12, pad_multiple=4, pad_to_max_length=True))


def test_too_many_segments_raises():
    layout = ThdLayout(seq_length=8, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=2)
    with pytest.raises(ValueError, match="3 segments exceed max_segments=2"):
        build_thd_batch([seg([1], [1])] * 3, layout)
    with pytest.raises(ValueError, match="max_segments=1"):
        build_thd_batch([seg([1], [1])] * 2, ThdLayout(seq_length=8, max_segments=1))


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("labels", {"labels": torch.tensor([1, 2])}),
        ("loss_mask", {"loss_mask": torch.ones(4)}),
        ("mrope_position_ids", {"mrope_position_ids": torch.zeros((3, 2), dtype=torch.int64)}),
        ("mrope_position_ids", {"mrope_position_ids": torch.zeros((2, 3), dtype=torch.int64)}),
    ],
)
def test_mismatched_tensor_lengths_raise(field, kwargs):
    base = {"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([2, 3, X]), "loss_mask": torch.ones(3)}
    with pytest.raises(ValueError, match=field):
        ThdSegment(**{**base, **kwargs})


def test_target_mask_length_mismatch_raises():
    with pytest.raises(ValueError, match="same length"):
        seg([1, 2, 3], [1, 1])


@pytest.mark.parametrize("field", ["input_ids", "labels", "mrope_position_ids"])
def test_float_ids_rejected(field):
    base = {
        "input_ids": torch.tensor([1, 2]),
        "labels": torch.tensor([2, X]),
        "loss_mask": torch.ones(2),
        "mrope_position_ids": torch.zeros((3, 2), dtype=torch.int64),
    }
    base[field] = base[field].float()
    with pytest.raises(ValueError, match=f"{field} must be an integer tensor"):
        ThdSegment(**base)


def test_two_dimensional_input_ids_rejected():
    with pytest.raises(ValueError, match="input_ids must be a 1-D tensor"):
        ThdSegment(torch.ones((1, 3), dtype=torch.int64), torch.ones(3, dtype=torch.int64), torch.ones(3))


def test_unknown_visual_key_rejected():
    with pytest.raises(ValueError, match="unknown visual keys \\['pixels'\\]"):
        seg([1, 2], [1, 1], visual={"pixels": torch.zeros(1, 3)})


def test_mixing_mrope_and_plain_segments_raises():
    with_mrope = seg([1, 2], [1, 1], mrope_position_ids=torch.zeros((3, 2), dtype=torch.int64))
    with pytest.raises(ValueError, match="mrope_position_ids must be given for all segments or none"):
        build_thd_batch([with_mrope, seg([3, 4], [1, 1])], ThdLayout(seq_length=8))


@pytest.mark.parametrize("length", [0, -1])
def test_segment_span_rejects_empty(length):
    with pytest.raises(ValueError, match="segment length"):
        ThdLayout(seq_length=8).segment_span(length)


def test_attention_mask_rejects_bad_cu_seqlens():
    with pytest.raises(ValueError, match="same length"):
        thd_attention_mask(torch.tensor([0, 4, 8]), torch.tensor([0, 3]), 8)
    with pytest.raises(ValueError, match="beyond the row length 6"):
        thd_attention_mask(torch.tensor([0, 4, 8]), torch.tensor([0, 3, 5]), 6)
    with pytest.raises(ValueError, match="do not fit"):
        thd_attention_mask(torch.tensor([0, 2, 8]), torch.tensor([0, 3, 5]), 8)


# --------------------------------------------------------------------------- properties


@st.composite
def packs(draw):
    """A random valid (segments, layout) pair: lengths, multiple, fixed width, static cu_seqlens, M-RoPE."""
    multiple = draw(st.sampled_from([1, 2, 3, 4, 8]))
    lengths = draw(st.lists(st.integers(1, 20), min_size=1, max_size=6))
    fixed = draw(st.booleans())
    static = fixed and draw(st.booleans())
    with_mrope = draw(st.booleans())
    packed = sum(aligned_length(n, multiple) for n in lengths)
    seq_length = packed + multiple * draw(st.integers(0, 3))
    max_segments = len(lengths) + draw(st.integers(0, 3)) if static or draw(st.booleans()) else None
    layout = ThdLayout(
        seq_length=seq_length,
        pad_multiple=multiple,
        pad_to_max_length=fixed,
        pad_cu_seqlens=static,
        max_segments=max_segments,
        pad_token_id=draw(st.integers(0, 5)),
    )
    segments = []
    for i, n in enumerate(lengths):
        ids = draw(st.lists(st.integers(6, 1000), min_size=n, max_size=n))
        target = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        mrope = None
        if with_mrope:
            steps = draw(st.lists(st.lists(st.integers(0, 2), min_size=n, max_size=n), min_size=3, max_size=3))
            mrope = torch.tensor(steps).cumsum(dim=1)
        segments.append(seg(ids, target, mrope_position_ids=mrope, key=f"s{i}"))
    return segments, layout


@settings(max_examples=150, deadline=None)
@given(packs())
def test_batch_invariants(pack):
    segments, layout = pack
    batch = build_thd_batch(segments, layout)
    n, m = len(segments), layout.pad_multiple
    lengths = [len(s) for s in segments]
    T = batch["total_tokens"]
    cu, cu_padded = batch["cu_seqlens_q"].tolist(), batch["cu_seqlens_q_padded"].tolist()
    ids, labels, loss = batch["input_ids"][0], batch["labels"][0], batch["loss_mask"][0]
    pos, pad = batch["position_ids"][0], batch["padding_mask"][0]

    assert set(batch) == CONTRACT_KEYS
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert batch[key].shape == (1, T), key
    # Width: exact under fixed width, else the sum of aligned spans.
    assert T == (layout.seq_length if layout.pad_to_max_length else sum(aligned_length(x, m) for x in lengths))
    assert T <= layout.seq_length
    # cu_seqlens: static length, monotone from 0, logical ends at the real total, physical at T.
    assert len(cu) == len(cu_padded) == (layout.max_segments + 1 if layout.pad_cu_seqlens else n + 1)
    assert cu[0] == cu_padded[0] == 0
    assert [b - a for a, b in zip(cu, cu[1:])] == lengths + [0] * (len(cu) - n - 1)
    assert cu[-1] == batch["real_tokens"] == sum(lengths)
    assert cu_padded[-1] == T and cu_padded[n:] == [T] * (len(cu) - n)
    assert all(b % m == 0 for b in cu_padded)
    assert all(aligned_length(x, m) == b - a for x, a, b in zip(lengths[:-1], cu_padded, cu_padded[1:]))
    spans = [b - a for a, b in zip(cu_padded[:n], cu_padded[1 : n + 1])]
    assert batch["max_seqlen_q"].item() == (layout.seq_length if layout.pad_cu_seqlens else max(spans))
    # Real ranges and gaps.
    real = torch.zeros(T, dtype=torch.bool)
    for s, start, length in zip(segments, cu_padded, lengths):
        real[start : start + length] = True
        assert torch.equal(ids[start : start + length], s.input_ids)
        assert labels[start + length - 1] == X and loss[start + length - 1] == 0  # no cross-boundary label
        assert torch.equal(labels[start : start + length], s.labels)  # from_target_mask is already consistent
        assert torch.equal(loss[start : start + length], s.loss_mask)
    assert torch.equal(pad, ~real)
    assert int(pad.sum()) == T - batch["real_tokens"]
    assert torch.all(ids[pad] == layout.pad_token_id)
    assert torch.all(labels[pad] == X) and torch.all(loss[pad] == 0)
    assert torch.equal(loss == 1, labels != X) and torch.all((loss == 0) | (loss == 1))
    assert batch["supervised_tokens"] == int(loss.sum())
    # Positions restart at 0 at every physical boundary and count up through the span.
    for a, b in zip(cu_padded[:n], cu_padded[1 : n + 1]):
        assert pos[a:b].tolist() == list(range(b - a))
    # M-RoPE: segment positions copied, gaps continue text positions on all 3 axes.
    mrope = batch["mrope_position_ids"]
    if segments[0].mrope_position_ids is None:
        assert mrope is None
    else:
        assert mrope.shape == (3, 1, T) and mrope.dtype == torch.int64
        for s, a, b, length in zip(segments, cu_padded, cu_padded[1:], lengths):
            assert torch.equal(mrope[:, 0, a : a + length], s.mrope_position_ids)
            first = int(s.mrope_position_ids.max()) + 1
            assert torch.equal(mrope[:, 0, a + length : b], torch.arange(first, first + b - a - length).expand(3, -1))
    assert batch["__keys__"] == [f"s{i}" for i in range(n)]


# --------------------------------------------------------------------------- attention reference


def _thd_vs_per_segment_attention(segments, layout, seed=0, heads=2, dim=8, mask_cu_padded=None):
    """Max abs difference at real positions between SDPA on the packed row and per-segment causal SDPA."""
    batch = build_thd_batch(segments, layout)
    T = batch["total_tokens"]
    cu, cu_padded = batch["cu_seqlens_q"], batch["cu_seqlens_q_padded"]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, T, dim, generator=g, dtype=torch.float32) for _ in range(3))
    mask = thd_attention_mask(cu_padded if mask_cu_padded is None else mask_cu_padded, cu, T)
    packed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert not torch.isnan(packed).any()
    worst = 0.0
    for s, start in enumerate(cu_padded[: len(segments)].tolist()):
        length = int(cu[s + 1] - cu[s])
        rows = slice(start, start + length)
        reference = F.scaled_dot_product_attention(q[..., rows, :], k[..., rows, :], v[..., rows, :], is_causal=True)
        worst = max(worst, (packed[..., rows, :] - reference).abs().max().item())
    return worst


def test_attention_mask_matches_per_segment_causal_attention():
    segments = [seg(list(range(1, 6)), [1] * 5), seg([7, 8, 9], [1] * 3), seg(list(range(10, 16)), [1] * 6)]
    layout = ThdLayout(seq_length=24, pad_multiple=4, pad_to_max_length=True)  # spans 8, 4, 12 (tail absorbed)
    assert build_thd_batch(segments, layout)["cu_seqlens_q_padded"].tolist() == [0, 8, 12, 24]
    assert _thd_vs_per_segment_attention(segments, layout) < 1e-5
    # Negative control: treating the logical boundaries as physical ones misplaces segments 2 and 3.
    wrong = build_thd_batch(segments, layout)["cu_seqlens_q"]
    assert _thd_vs_per_segment_attention(segments, layout, mask_cu_padded=wrong) > 1e-2


def test_attention_mask_golden():
    mask = thd_attention_mask(torch.tensor([0, 4, 6]), torch.tensor([0, 3, 5]), 6)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],  # gap: only itself
            [0, 0, 0, 0, 1, 0],
            [0, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


@settings(max_examples=30, deadline=None)
@given(packs(), st.integers(0, 2**16))
def test_attention_mask_property(pack, seed):
    segments, layout = pack
    assert _thd_vs_per_segment_attention(segments, layout, seed=seed) < 1e-5


class _PixelParts(torch.utils.data.Dataset):
    """Concatenates pixel rows the way pack collation does, reporting whether the result was
    already in shared memory inside the worker (so the queue transfer does not copy it again)."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        from energon_pack.thd import _cat_rows

        parts = [torch.full((i + 2, 5), float(i)), torch.arange(10, dtype=torch.float32).view(2, 5)]
        out = _cat_rows(parts)
        return out, out.is_shared()


def test_pixel_concat_lands_in_shared_memory_inside_workers_only():
    from energon_pack.thd import _cat_rows

    parts = [torch.ones(2, 3, dtype=torch.bfloat16), torch.zeros(1, 3, dtype=torch.bfloat16)]
    local = _cat_rows(parts)
    assert not local.is_shared() and torch.equal(local, torch.cat(parts))
    loader = torch.utils.data.DataLoader(_PixelParts(), batch_size=None, num_workers=1)
    for i, (rows, shared_in_worker) in enumerate(loader):
        assert shared_in_worker
        expected = torch.cat([torch.full((i + 2, 5), float(i)), torch.arange(10, dtype=torch.float32).view(2, 5)])
        assert torch.equal(rows, expected)
