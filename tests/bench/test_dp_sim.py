"""``energon-pack bench --ranks N``: N ranks' real loaders (worker processes) on the demo shards, tokens-only and
compute-balanced, and the predicted data-parallel efficiency of their steps under the step-cost model."""

import json

import pytest
import torch

from _cli_entry import energon_pack
from energon_pack.bench.dp_sim import format_table, pack_step_cost, recommend, simulate
from energon_pack.packing import StepCostModel


def test_pack_cost_adds_segments_and_grids():
    model = StepCostModel.from_shape("qwen2.5-vl-3b")
    batch = {
        "cu_seqlens_q": torch.tensor([0, 100, 400]),
        "image_grid_thw": torch.tensor([[1, 4, 6]]),
        "video_grid_thw": torch.tensor([[2, 2, 2]]),
    }
    assert pack_step_cost(batch, model) == pytest.approx(
        model.sample_cost(100) + model.sample_cost(300) + model.sample_cost(0, [(1, 4, 6), (2, 2, 2)])
    )


def test_two_ranks_of_the_demo_shards(demo_shards):
    result = simulate(demo_shards, ranks=2, steps=5, buffer=48, workers=1, seq_length=4096, tokenizer="demo")
    tokens, compute = result["rows"]
    assert (tokens["mode"], compute["mode"]) == ("tokens", "compute")
    assert compute["cost_cv"] < tokens["cost_cv"] and compute["dp_efficiency"] >= tokens["dp_efficiency"]
    assert all(0 < r["dp_efficiency"] <= 1 and r["fill"] > 0.9 for r in result["rows"])
    assert "DP efficiency" in format_table(result) and json.dumps(result)
    rec = result["recommendation"]
    assert rec == recommend(result["rows"]) and f"recommended: balance={rec['balance']!r}" in format_table(result)


def test_the_command(demo_shards, tmp_path):
    run = energon_pack(
        "bench",
        "--data",
        str(demo_shards),
        "--ranks",
        "2",
        "--steps",
        "3",
        "--buffers",
        "32",
        "--workers",
        "1",
        "--seq-length",
        "2048",
        "--tokenizer",
        "demo",
        "--out-dir",
        str(tmp_path / "out"),
    )
    assert run.returncode == 0, run.stderr
    assert "2 ranks x 3 steps of 1 pack(s), K=32" in run.stdout and "wrote " in run.stdout
    saved = json.loads((tmp_path / "out" / "dp_sim.json").read_text())
    assert [r["mode"] for r in saved["rows"]] == ["tokens", "compute"]


def test_recommendation_weighs_fill_against_the_wait():
    rows = [
        {"mode": "tokens", "tokens_per_step_cost": 0.90},
        {"mode": "compute", "tokens_per_step_cost": 0.99},
    ]
    assert recommend(rows) == {"balance": "compute", "gain": pytest.approx(0.1), "over": "tokens"}
    rows[0]["tokens_per_step_cost"] = 1.0
    assert recommend(rows) == {"balance": "tokens", "gain": pytest.approx(1 / 0.99 - 1), "over": "compute"}
