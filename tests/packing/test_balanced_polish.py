"""The compute-balanced packer's polish pass (state format 2): a hand-checked trim of a heavy pack, exact packs
of a small seeded stream, exact resume at every point (flush included), the bounded delay of every sample, every
budget respected, format-1 states continued with the packs they would have built, and the bench's independent
FLOP count checked by hand."""

import json

import numpy as np
import pytest

from energon_pack.bench.balance_bench import QWEN25_VL_3B, independent_pack_flops
from energon_pack.packing.balanced import STATE_FORMAT, ComputeBalancedPacker


def _stream(packer, items, start=0):
    out = []
    for key, (budgets, cost) in list(enumerate(items))[start:]:
        out.extend(packer.push(key, budgets, cost))
    return out


def _seeded(n=40, seed=7):
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(n):
        tokens, heavy = int(rng.integers(5, 60)), rng.random() < 0.3
        items.append((tokens, float(tokens * (3.0 if heavy else 1.0))))
    return items


def test_the_polish_trims_a_heavy_pack_by_hand():
    """rho = (300 + 3 x 20) / 120 = 3, a full pack costs 300. Greedy: the heavy oldest plus two texts, cost 340,
    full: 25 x (40/300)^2 = 0.444. Dropping one text: cost 320, room 20: 25 x (20/300)^2 + 0.2 = 0.311 (dropping
    both: 0.4): the polish drops the earliest member."""
    items = [(60, 300.0), (20, 20.0), (20, 20.0), (20, 20.0)]
    greedy = ComputeBalancedPacker(100, buffer_size=4, polish_moves=0)
    assert _stream(greedy, items) == [[0, 1, 2]] and greedy.held_keys() == [3]
    polished = ComputeBalancedPacker(100, buffer_size=4)
    assert _stream(polished, items) == [[0, 2]] and polished.held_keys() == [1, 3]
    assert polished.cost_packed == 320.0 and polished.stats.packs == 1


def test_exact_packs_of_a_small_seeded_stream():
    items = _seeded()
    packer = ComputeBalancedPacker(100, buffer_size=6)
    assert _stream(packer, items) == [
        [0, 1, 5], [2, 7], [3, 4, 9], [6, 13], [8, 15, 12], [10, 17, 14], [11, 20, 16],
        [18, 22, 21], [19, 23, 25], [24, 28, 27], [26, 33], [29, 34], [30, 37, 36],
    ]  # fmt: skip
    assert packer.held_keys() == [31, 32, 35, 38, 39]
    greedy = ComputeBalancedPacker(100, buffer_size=6, polish_moves=0)  # the format-1 algorithm's packs
    assert _stream(greedy, items)[:6] == [[0, 1, 5], [2, 8], [3, 4, 9], [6, 11, 10], [7, 14, 15], [12, 17, 16]]


@pytest.mark.parametrize("cut", [1, 6, 17, 39, 40])
def test_resume_at_any_point_builds_the_same_packs(cut):
    items = _seeded()
    whole = ComputeBalancedPacker(100, buffer_size=6)
    expected = _stream(whole, items) + whole.flush()
    first = ComputeBalancedPacker(100, buffer_size=6)
    head = _stream(first, items[:cut])
    state = json.loads(json.dumps(first.state_dict()))
    assert state["format"] == STATE_FORMAT == 2 and state["polish_moves"] == 4 and state["deviation_weight"] == 25.0
    restored = ComputeBalancedPacker(100, buffer_size=6)
    restored.load_state_dict(state)
    assert head + _stream(restored, items, cut) + restored.flush() == expected
    assert restored.stats.state_dict() == whole.stats.state_dict() and restored.cost_packed == whole.cost_packed


def test_every_sample_leaves_within_the_buffer_and_once():
    """The oldest goes into every pack, so a sample leaves with at most the K-th pack built after it arrived."""
    rng = np.random.default_rng(3)
    items = [(int(t), float(t * rng.choice([1.0, 4.0]))) for t in rng.integers(1, 900, 3000)]
    packer, arrived, delays, seen = ComputeBalancedPacker(2048, buffer_size=16), {}, [], []
    for key, (tokens, cost) in enumerate(items):
        arrived[key] = packer.stats.packs
        for group in packer.push(key, tokens, cost):
            delays += [packer.stats.packs - arrived[k] for k in group]
            seen += group
    assert max(delays) == 12 <= 16 and packer.held == 14
    assert sorted(seen + packer.held_keys()) == list(range(len(items)))


def test_every_budget_is_respected_by_the_polish():
    """Tokens, patches and media budgets: no pack goes over any, though the polish swaps members."""
    rng = np.random.default_rng(11)
    items = []
    for _ in range(2000):
        media = int(rng.integers(0, 3))
        patches = int(rng.integers(100, 3000)) * media
        tokens = int(rng.integers(20, 400)) + patches // 4
        items.append(((tokens, patches, media), tokens + 0.3 * patches))
    packer = ComputeBalancedPacker((4096, 6000, 3), buffer_size=64)
    groups = _stream(packer, items) + packer.flush()
    used = np.asarray([np.sum([items[k][0] for k in g], axis=0) for g in groups])
    assert (used <= [4096, 6000, 3]).all() and used[:, 2].max() == 3 and used[:, 1].max() > 5000
    assert sorted(k for g in groups for k in g) == list(range(len(items)))


def test_a_format_1_state_continues_with_its_own_packs():
    """A state saved before the polish pass (format 1: no polish knobs) resumes, in a packer that takes saved
    tuning (the encoders'), with the greedy packs it would have built; a plain packer refuses it by name."""
    items = _seeded()
    expected = _stream(ComputeBalancedPacker(100, buffer_size=6, polish_moves=0), items)
    first = ComputeBalancedPacker(100, buffer_size=6, polish_moves=0)
    head = _stream(first, items[:17])
    state = first.state_dict()
    old = {k: v for k, v in state.items() if k not in ("polish_moves", "deviation_weight")} | {"format": 1}
    with pytest.raises(ValueError, match="polish_moves"):
        ComputeBalancedPacker(100, buffer_size=6).load_state_dict(old)
    restored = ComputeBalancedPacker(100, buffer_size=6, resume_saved_tuning=True)
    restored.load_state_dict(old)
    assert restored.polish_moves == 0 and head + _stream(restored, items, 17) == expected
    with pytest.raises(ValueError, match="unsupported packer state format 0"):
        restored.load_state_dict({**state, "format": 0})


@pytest.mark.parametrize("knobs", [{"polish_moves": -1}, {"polish_moves": 1.5}, {"deviation_weight": -2}])
def test_polish_knobs_checked(knobs):
    with pytest.raises(ValueError, match=next(iter(knobs))):
        ComputeBalancedPacker(100, **knobs)


def test_the_independent_flop_count_by_hand():
    """Text: 3 x (2 x per-token FLOPs x tokens + 36 layers x 2 x 2048 x L^2 per segment). An image of 16 x 20
    patches: merged 8 x 10, windows of 4 x 4 merged tokens: four of 64 patches and two of 32 at the edge."""
    d, layers = 2048, 36
    per_token = layers * (2 * d * d + 2 * d * 2 * 128 + 3 * d * 11008) + d * 151936
    text = 3.0 * (2.0 * per_token * 150 + layers * 2 * d * (100**2 + 50**2))
    assert independent_pack_flops([100, 50], []) == pytest.approx(text, rel=1e-12)
    v = 1280
    per_patch = 3 * 2 * 14 * 14 * v + 32 * (4 * v * v + 3 * v * 3420) + (5120 * 5120 + 5120 * 2048) / 4
    attention = 4 * v * (4 * 320**2 + 28 * (4 * 64**2 + 2 * 32**2))
    image = 3.0 * (2.0 * (per_token * 90 + per_patch * 320) + layers * 2 * d * 90**2 + attention)
    assert independent_pack_flops([90], [(1, 16, 20)]) == pytest.approx(image, rel=1e-12)
    assert QWEN25_VL_3B["full_attention_layers"] == (7, 15, 23, 31)


def test_the_bench_reads_real_samples_as_the_encoder_costs_them(demo_shards):
    """``--data``: each sample's tokens and grids through the real loader and the Qwen2.5-VL encoder's own
    pre-encoding, with the real tokenizer: the same tokens and patches as the encoder's cost reader, broken samples
    left out."""
    from energon_pack.bench.balance_bench import read_samples
    from energon_pack.bench.visual_budget import candidate_costs
    from energon_pack.chat.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("qwen2.5-vl")
    samples = read_samples(demo_shards, width=8192, tokenizer=tokenizer, limit=120)
    costs = candidate_costs(str(demo_shards), width=8192, tokenizer=tokenizer, limit=120)
    assert len(samples) == len(costs) == 120
    assert [t for t, _ in samples] == costs[:, 0].tolist()
    assert [sum(t * h * w for t, h, w in grids) for _, grids in samples] == costs[:, 1].tolist()
    assert sum(1 for _, grids in samples if grids) == 86
