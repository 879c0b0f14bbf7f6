"""The step-cost model and the compute-balanced packer: exact FLOP coefficients of a hand-checked shape, every
sample packed once within the width, deterministic packs and exact resume, and packs whose cost spread (and so a
data-parallel step's wait for its slowest rank) is a fraction of tokens-only packing's at about the same fill."""

import json
from pathlib import Path

import numpy as np
import pytest

from energon_pack.bench.balance_bench import bench_balance, dp_efficiency, format_table
from energon_pack.bench.mixes import llava_photos
from energon_pack.errors import ConfigError
from energon_pack.packing import FITTED, OnlinePacker, named_cost_model
from energon_pack.packing.balanced import ComputeBalancedPacker
from energon_pack.packing.step_cost import LLMShape, ModelShape, StepCostModel, VisionShape

ROOT = Path(__file__).resolve().parents[2]

TINY = ModelShape(
    "tiny",
    LLMShape(hidden=4, layers=2, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10),
    VisionShape(hidden=2, depth=3, intermediate=4, out_hidden=4, patch_size=2, full_blocks=1, window_patches=4),
)


def test_flop_coefficients_of_a_hand_checked_shape():
    m = StepCostModel.from_shape(TINY)
    # LLM dense per token: 6 x (layers x (q,k,v,o = 4*2*(2*2+2*1) + gated MLP 3*4*8) + LM head 4*10) = 1968
    token = 6 * (2 * (48 + 96) + 40)
    assert m.per_token == 1.0 and m.per_token_squared == pytest.approx(6 * 2 * 2 * 2 / token)
    # vision per patch: embed 3*2*2^2*2 = 48, 3 blocks of 4*2*2 + 2*2*4 = 32, merger (8*8 + 8*4) / 4 = 24
    assert m.per_patch == pytest.approx(6 * (48 + 3 * 32 + 24) / token)
    assert m.per_window_patch == pytest.approx(12 * 2 * 2 * 4 / token)  # 2 windowed blocks, 4 patches a window
    assert m.per_patch_squared == pytest.approx(12 * 2 * 1 / token)  # 1 full block
    cost = m.sample_cost(10, [(2, 2, 3)])
    assert cost == pytest.approx(
        10 + m.per_token_squared * 100 + 2 * ((m.per_patch + m.per_window_patch) * 6 + m.per_patch_squared * 36)
    )
    assert m.source == "flops:tiny" and StepCostModel.from_dict(json.loads(json.dumps(m.as_dict()))) == m


def test_a_pack_costs_the_sum_of_its_samples():
    """pack_cost over a pack's segments and grids is the sum of its members' sample_cost (the cost is additive),
    through pack_terms: the terms a step-time fit regresses on."""
    m = StepCostModel.from_shape("qwen2.5-vl-3b")
    members = [(391, [(1, 34, 46)]), (1200, []), (80, [(2, 10, 12), (1, 4, 4)])]
    lengths = [t for t, _ in members]
    grids = [g for _, gs in members for g in gs]
    terms = StepCostModel.pack_terms(lengths, grids)
    assert terms == {
        "tokens": 1671.0,
        "tokens_squared": float(391**2 + 1200**2 + 80**2),
        "patches": float(34 * 46 + 2 * 120 + 16),
        "patches_squared": float((34 * 46) ** 2 + 2 * 120**2 + 16**2),
    }
    assert m.pack_cost(lengths, grids) == pytest.approx(sum(m.sample_cost(t, g) for t, g in members), rel=1e-12)
    assert m.terms_cost(terms) == m.pack_cost(lengths, grids)


def test_named_shapes_and_an_unknown_one():
    big, small = StepCostModel.from_shape("qwen2.5-vl-7b"), StepCostModel.from_shape("qwen2.5-vl-3b")
    assert 0 < big.per_patch < small.per_patch  # the same vision tower weighs less against a larger LLM
    with pytest.raises(ConfigError) as caught:
        StepCostModel.from_shape("qwen9-vl")
    assert caught.value.knob == "shape"


def test_each_fitted_model_is_its_runs_fit():
    """A shipped fitted model carries the coefficients of the run its source names (docs/benchmarks/<run>.json),
    rounded to 4 digits: none drifts from the measurement it cites."""
    for name, model in FITTED.items():
        run = json.loads((ROOT / "docs" / "benchmarks" / f"{model.source.removeprefix('fit:')}.json").read_text())
        fitted = run["fit"]["fitted_token_equivalents"]
        assert named_cost_model(name) is model and model.per_window_patch == 0.0, name
        for key, value in fitted.items():
            assert getattr(model, key) == pytest.approx(value, rel=5e-4), (name, key)


def _stream(packer, items, upto=None):
    groups = []
    for key, (tokens, cost) in list(enumerate(items))[:upto]:
        groups.extend(packer.push(key, tokens, cost))
    return groups


@pytest.fixture(scope="module")
def items():
    model = StepCostModel.from_shape("qwen2.5-vl-3b")
    return [(t, model.sample_cost(t, g)) for t, g in llava_photos(3000, 8192, seed=5)] + [(9000, 9000.0)]


def test_every_sample_leaves_once_within_the_width(items):
    packer = ComputeBalancedPacker(8192, buffer_size=64)
    groups = _stream(packer, items) + packer.flush()
    keys = [k for g in groups for k in g]
    assert sorted(keys) == list(range(len(items) - 1)) and packer.pop_skipped() == [(len(items) - 1, "oversize")]
    assert all(sum(items[k][0] for k in g) <= 8192 for g in groups)
    assert packer.held == 0 and packer.stats.packs == len(groups) and packer.stats.skips == {"oversize": 1}


def test_same_packs_again_and_after_a_resume(items):
    whole = ComputeBalancedPacker(8192, buffer_size=64)
    expected = _stream(whole, items)
    first = ComputeBalancedPacker(8192, buffer_size=64)
    head = _stream(first, items, 1234)
    state = json.loads(json.dumps(first.state_dict()))
    restored = ComputeBalancedPacker(8192, buffer_size=64)
    restored.load_state_dict(state)
    tail = []
    for key, (tokens, cost) in list(enumerate(items))[1234:]:
        tail.extend(restored.push(key, tokens, cost))
    assert head + tail == expected
    assert restored.stats.state_dict() == whole.stats.state_dict()
    with pytest.raises(ValueError, match="same budgets, buffer and balance knobs"):
        ComputeBalancedPacker(8192, buffer_size=32).load_state_dict(state)


def test_balanced_packs_cost_alike_at_about_the_same_fill(items):
    tokens = np.asarray([t for t, _ in items[:-1]])
    costs = np.asarray([c for _, c in items[:-1]])
    online = OnlinePacker((8192,), max_buffered=256)
    plain = [g for i, t in enumerate(tokens) for g in online.push(i, (int(t),))]
    balanced = _stream(ComputeBalancedPacker(8192, buffer_size=256), items[:-1])

    def figures(groups):
        cost = np.asarray([costs[g].sum() for g in groups])
        return tokens[sum(groups, [])].sum() / (len(groups) * 8192), cost.std() / cost.mean(), cost

    fill_plain, cv_plain, cost_plain = figures(plain)
    fill_bal, cv_bal, cost_bal = figures(balanced)
    assert cv_bal < cv_plain / 2.5 and fill_bal > fill_plain - 0.01 and fill_bal > 0.985
    assert dp_efficiency(cost_bal, 8) > 0.97 > dp_efficiency(cost_plain, 8)


def test_dp_efficiency_of_equal_and_unequal_packs():
    assert dp_efficiency(np.full(10, 5.0), 8) == 1.0
    assert dp_efficiency(np.array([1.0, 3.0]), 1) == 1.0  # one rank waits for no one
    two = dp_efficiency(np.array([1.0, 3.0]), 2, draws=200000)
    assert two == pytest.approx(2.0 / 2.5, abs=0.01)  # mean step 2, expected max 0.25*1 + 0.75*3 = 2.5


def test_a_packer_that_resumes_saved_tuning_continues_the_saved_run(items):
    """An encoder-made packer (resume_saved_tuning) restores a state saved under other tuning (an earlier
    release's room_weight 0.15) and builds the packs that run would have; a plain packer refuses it by name,
    and the budgets and buffer must match either way."""
    old = dict(buffer_size=64, room_weight=0.15)
    expected = _stream(ComputeBalancedPacker(8192, **old), items)
    first = ComputeBalancedPacker(8192, **old)
    head = _stream(first, items, 1234)
    state = json.loads(json.dumps(first.state_dict()))
    with pytest.raises(ValueError, match="room_weight"):
        ComputeBalancedPacker(8192, buffer_size=64).load_state_dict(state)
    with pytest.raises(ValueError, match="buffer_size"):
        ComputeBalancedPacker(8192, buffer_size=32, resume_saved_tuning=True).load_state_dict(state)
    restored = ComputeBalancedPacker(8192, buffer_size=64, resume_saved_tuning=True)
    restored.load_state_dict(state)
    assert (restored.slack, restored.room_weight) == (0.03, 0.15)
    tail = []
    for key, (tokens, cost) in list(enumerate(items))[1234:]:
        tail.extend(restored.push(key, tokens, cost))
    assert head + tail == expected


@pytest.mark.parametrize("knobs", [{"buffer_size": 0}, {"slack": -1}, {"room_weight": "x"}])
def test_knobs_checked(knobs):
    with pytest.raises(ValueError):
        ComputeBalancedPacker(8192, **knobs)


def test_the_bench_prints_every_mode():
    result = bench_balance(samples=1500, buffers=(64,), ranks=(8,))
    rows = [(r["mix"], r["mode"], r["buffer"]) for r in result["rows"]]
    assert rows == [("llava_photos", m, 64) for m in ("tokens", "default", "qwen2.5-vl-3b")]
    tokens, default, named = result["rows"]
    assert (tokens["cost_model"], default["cost_model"], named["cost_model"]) == (
        None,
        "flops:qwen2.5-vl-7b",
        "flops:qwen2.5-vl-3b",
    )
    assert named["dp_efficiency"]["8"] > tokens["dp_efficiency"]["8"] and named["cost_cv"] < tokens["cost_cv"]
    table = format_table(result)
    assert "DP-8" in table and table.count("\n") == 6 and result["mixes"]["llava_photos"]["samples"] == 1500


def test_every_budget_is_respected(items):
    """A second budget (here: at most 3 samples a pack) holds in every pack, as in OnlinePacker."""
    packer = ComputeBalancedPacker((8192, 3), buffer_size=64)
    groups = []
    for key, (tokens, cost) in enumerate(items[:-1]):
        groups.extend(packer.push(key, (tokens, 1), cost))
    groups += packer.flush()
    assert max(len(g) for g in groups) == 3 and sorted(k for g in groups for k in g) == list(range(len(items) - 1))
    assert packer.held_keys() == []
