"""examples/finetune_multi_gpu.py with --static (tiny HF Qwen-VL, CPU): the whole model under torch.compile
compiles in the first step only, across packs of different content; --grad-checkpoint gives the same losses."""

import json
import sys
from pathlib import Path

import pytest

from _hf_helpers import NO_IMPLICIT_PREPARE

pytest.importorskip("transformers")
pytestmark = NO_IMPLICIT_PREPARE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
COMMON = [
    "--device",
    "cpu",
    "--size",
    "tiny",
    "--width",
    "1024",
    "--workers",
    "0",
    "--buffer",
    "16",
    "--log-every",
    "1",
    "--tokenizer",
    "demo",
    "--steps",
    "5",
    "--patch-budget",
    "1024",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from energon_pack.energon import make_demo_shards

    return make_demo_shards(tmp_path_factory.mktemp("static") / "data", samples=160, per_shard=20)


def _run(data, tmp_path, *extra):
    import finetune_multi_gpu as ft

    report = tmp_path / f"report{len(list(tmp_path.iterdir()))}.json"
    ft.main(["--data", str(data), "--report", str(report), *COMMON, *extra])
    return json.loads(report.read_text())


def test_static_packs_compile_once_and_checkpointing_changes_no_loss(data, tmp_path):
    import torch._dynamo

    torch._dynamo.reset()
    compiled = _run(data, tmp_path, "--static", "--compile-model", "--compile-backend", "aot_eager")
    assert compiled["static_budgets"] == {"max_patches_per_pack": 1024}
    assert compiled["history"][0]["graphs_compiled"] > 0
    assert compiled["graphs_compiled_after_first_step"] == 0, [h["graphs_compiled"] for h in compiled["history"]]
    assert len({h["real_tokens"] for h in compiled["history"]}) > 1  # packs of different content
    torch._dynamo.reset()
    eager = _run(data, tmp_path, "--static")
    checkpointed = _run(data, tmp_path, "--static", "--grad-checkpoint")
    for a, b, c in zip(eager["history"], checkpointed["history"], compiled["history"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * max(1.0, abs(a["loss"]))
        assert abs(a["loss"] - c["loss"]) <= 1e-4 * max(1.0, abs(a["loss"]))


@pytest.mark.parametrize("model", ["qwen2-vl", "qwen3-vl"])
def test_static_packs_compile_once_on_the_other_versions(data, tmp_path, model):
    import torch._dynamo

    torch._dynamo.reset()
    report = _run(data, tmp_path, "--model", model, "--static", "--compile-model", "--compile-backend", "aot_eager")
    assert report["history"][0]["graphs_compiled"] > 0
    assert report["graphs_compiled_after_first_step"] == 0, [h["graphs_compiled"] for h in report["history"]]


def test_the_vision_tower_alone_compiles_once(data, tmp_path):
    import torch._dynamo

    torch._dynamo.reset()
    report = _run(data, tmp_path, "--static", "--graph-vision", "--compile-backend", "aot_eager")
    assert report["history"][0]["graphs_compiled"] > 0 and report["graphs_compiled_after_first_step"] == 0
