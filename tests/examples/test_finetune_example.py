"""examples/finetune_multi_gpu.py (a real HF Qwen-VL, tiny) and examples/gpu_benchmark.py on CPU.

* 2 gloo processes (torchrun): saving at step 2 and resuming gives the uninterrupted run's losses.
* The example's own loss code path on a packed row equals the summed per-sample losses of the
  members run alone through HF's own path (stock sdpa, HF computes M-RoPE), for all three versions.
* Two "nodes" of one process each, rendezvous over c10d on 127.0.0.1: disjoint data per rank.
* The GPU benchmark's code path, tiny and 2 steps.
"""

import copy
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _hf_helpers import NO_IMPLICIT_PREPARE, alone_forward, split_pack

pytest.importorskip("transformers")
pytestmark = NO_IMPLICIT_PREPARE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune_multi_gpu.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
# tiny CPU runs use the demo tokenizer (a 151,936-row LM head would dominate a tiny model's CPU time)
COMMON = [
    "--device",
    "cpu",
    "--size",
    "tiny",
    "--width",
    "1024",
    "--workers",
    "1",
    "--buffer",
    "16",
    "--log-every",
    "1",
    "--tokenizer",
    "demo",
    "--manual-gc",
    "2",
]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ft = _load(EXAMPLE, "finetune_multi_gpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from energon_pack.energon import make_demo_shards

    return make_demo_shards(tmp_path_factory.mktemp("ft") / "data", samples=160, per_shard=20)


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("RANK", None)
    return env


def _run(args, cwd, timeout=300):
    res = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return res


def test_two_process_save_and_resume_gives_the_uninterrupted_losses(data, tmp_path):
    base = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
        str(EXAMPLE),
        *COMMON,
        "--data",
        str(data),
        "--steps",
        "4",
    ]
    full, resumed, ckpt = tmp_path / "full.json", tmp_path / "resumed.json", tmp_path / "ckpt"
    _run(base + ["--save-at", "2", "--ckpt", str(ckpt), "--report", str(full)], tmp_path)
    assert {p.name for p in ckpt.iterdir()} == {"train.pt", "loader_rank0.pt", "loader_rank1.pt"}
    base[4] = str(_free_port())
    _run(base + ["--resume", str(ckpt), "--report", str(resumed)], tmp_path)
    a, b = json.loads(full.read_text()), json.loads(resumed.read_text())
    assert a["world_size"] == 2 and a["steps"] == 4 and b["start_step"] == 2 and b["steps"] == 2
    assert a["params"]["vision"] > 0 and a["params"]["llm"] > 0
    assert list(b["losses"]) == ["2", "3"]
    for step, loss in b["losses"].items():
        assert abs(loss - a["losses"][step]) <= 1e-6, (step, loss, a["losses"][step])
    # the resumed run trains on exactly the packs the uninterrupted run saw after step 2
    for rank in range(2):
        assert b["keys_per_rank"][rank] == a["keys_per_rank"][rank][-len(b["keys_per_rank"][rank]) :]
    assert all(h["real_tokens"] <= 2 * 1024 and h["step_s"] > 0 and h["data_wait_s"] >= 0 for h in a["history"])
    assert 0.5 < a["fill"] <= 1 and a["real_tokens_per_s"] > 0 and 0 <= a["data_wait_share"] < 1
    assert a["losses"]["3"] < a["losses"]["0"]  # it trains


@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_training_loss_equals_members_run_alone_through_hf(data, name):
    loader, encoder = ft.make_loader(
        str(data), width=512, preset=ft.vision_preset(name, "tiny"), buffer=8, workers=0, tokenizer="demo"
    )
    tok = encoder.tokenizer
    batch = None
    for i, b in enumerate(loader):
        if b["num_segments"] >= 3 and b["pixel_values"] is not None:
            batch = b
            break
        assert i < 20
    ref = ft.build_model(name, "tiny", tok)
    model = ft.prepare_model(copy.deepcopy(ref))
    loss, loss_sum, count = ft.forward_loss(model, batch)
    loss.backward()
    alone_sum, alone_count = 0.0, 0.0
    for seg in split_pack(batch, tok.special.image_pad, tok.special.video_pad):
        s, c = ft.packed_loss(alone_forward(ref, seg), seg)
        (s / batch["supervised_tokens"]).backward()  # the example's normalisation (one process)
        alone_sum, alone_count = alone_sum + s.detach(), alone_count + c
    assert count == alone_count == batch["supervised_tokens"] > 0
    assert torch.allclose(loss_sum.detach(), alone_sum, rtol=1e-6, atol=1e-5), (loss_sum, alone_sum)
    assert torch.allclose(loss.detach(), alone_sum / alone_count, rtol=1e-6, atol=1e-7)
    grads = dict(model.named_parameters())
    for pname, p in ref.named_parameters():
        assert torch.allclose(grads[pname].grad, p.grad, rtol=1e-5, atol=1e-5), pname


def test_image_free_pack_gives_the_vision_tower_exact_zero_grads(data):
    loader, encoder = ft.make_loader(
        str(data), width=512, preset=ft.vision_preset("qwen2.5-vl", "tiny"), buffer=8, workers=0, tokenizer="demo"
    )
    b = next(iter(loader))
    length = int(b["cu_seqlens_q"][1])  # the first member alone, as a text-only row
    ids = b["input_ids"][:, :length]
    ids = ids.masked_fill((ids == encoder.tokenizer.special.image_pad), 11)
    cu = torch.tensor([0, length], dtype=torch.int32)
    text = {
        "input_ids": ids,
        "labels": b["labels"][:, :length],
        "loss_mask": b["loss_mask"][:, :length],
        "position_ids": torch.arange(length)[None],
        "cu_seqlens_q_padded": cu,
        "cu_seqlens_kv_padded": cu,
        "max_seqlen_q": length,
        "max_seqlen_kv": length,
    }
    model = ft.prepare_model(ft.build_model("qwen2.5-vl", "tiny", encoder.tokenizer))
    plain, _, _ = ft.forward_loss(model, text)
    touched, _, _ = ft.forward_loss(model, text, touch_vision=ft.vision_params(model))
    assert float(plain.detach()) == float(touched.detach())
    touched.backward()
    vision = ft.vision_params(model)
    assert vision and all(p.grad is not None and not p.grad.any() for p in vision)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_rendezvous_on_localhost_read_disjoint_data(data, tmp_path):
    port = _free_port()
    procs = []
    for node in range(2):
        cmd = [
            str(TORCHRUN),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-id",
            "two-nodes",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            str(EXAMPLE),
            *COMMON,
            "--data",
            str(data),
            "--steps",
            "3",
            "--report",
            str(tmp_path / f"node{node}.json"),
        ]
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=_env())
        )
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-5000:]
    reports = [json.loads(f.read_text()) for f in tmp_path.glob("node*.json")]
    assert len(reports) == 1  # only global rank 0 writes
    report = reports[0]
    assert report["world_size"] == 2 and report["steps"] == 3
    k0, k1 = report["keys_per_rank"]
    assert k0 and k1 and not set(k0) & set(k1)
    assert len(set(k0)) == len(k0) and len(set(k1)) == len(k1)


def test_gpu_benchmark_code_path_on_cpu(data, tmp_path):
    """examples/gpu_benchmark.py, tiny model, every feed (gb.FEEDS), one timed step each (no timing asserts)."""
    gb = _load(ROOT / "examples" / "gpu_benchmark.py", "gpu_benchmark")
    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    gb.main(
        [
            "--device",
            "cpu",
            "--size",
            "tiny",
            "--steps",
            "1",
            "--width",
            "512",
            "--warmup",
            "0",
            "--workers",
            "0",
            "--buffer",
            "8",
            "--data",
            str(data),
            "--out",
            str(out),
            "--md",
            str(md),
            "--tokenizer",
            "demo",
        ]
    )
    result = json.loads(out.read_text())
    assert result["vocab_rows"] == 832 and result["tokenizer"].startswith("demo") and result["transformers"]
    rows = {r["feed"]: r for r in result["rows"]}
    assert list(rows) == list(gb.FEEDS)
    for r in rows.values():
        assert r["real_tokens"] >= 512 and r["real_tokens_per_s"] > 0 and r["median_step_ms"] > 0
        assert 0 < r["fill"] <= 1 and 0 <= r["data_wait_share"] < 1 and r["model_tflop"] > 0
    assert rows["unpadded"]["fill"] == 1.0 and rows["padded"]["fill"] < 1.0
    assert rows["padded"]["real_tokens"] == rows["unpadded"]["real_tokens"]  # the same samples, pads removed
    assert {t["target"] for t in result["targets"]} >= {"carry / padded (1 GPU)", "carry data wait"}
    assert md.read_text().count("| carry | 1 |") == 1
    combined = tmp_path / "combined.json"
    gb.main(["--combine", str(out), str(out), "--out", str(combined)])
    assert len(json.loads(combined.read_text())["rows"]) == 2 * len(gb.FEEDS)


def test_gpu_benchmark_balanced_feeds_run_beside_their_tokens_only_twins(data, tmp_path):
    """``carry:compute`` / ``carry-static:compute`` pack with balance="compute" in the same process; the static
    feeds share one budget; each balanced row gets its step spread and its targets against the twin."""
    gb = _load(ROOT / "examples" / "gpu_benchmark.py", "gpu_benchmark")
    out = tmp_path / "gpu.json"
    feeds = "carry,carry:compute,carry-static,carry-static:compute"
    cpu = ["--device", "cpu", "--size", "tiny", "--width", "512", "--warmup", "0", "--workers", "0"]
    gb.main(
        cpu
        + ["--steps", "3", "--buffer", "8", "--data", str(data), "--out", str(out), "--tokenizer", "demo"]
        + ["--feeds", feeds]
    )
    result = json.loads(out.read_text())
    rows = {r["feed"]: r for r in result["rows"]}
    assert list(rows) == feeds.split(",")
    assert [r["balance"] for r in rows.values()] == ["tokens", "compute", "tokens", "compute"]
    assert rows["carry-static"]["static_budgets"] == rows["carry-static:compute"]["static_budgets"] is not None
    for r in rows.values():
        assert r["steps"] >= 2 and 0 <= r["step_cv"] and set(r["dp_efficiency"]) == {"8", "64"}
        assert 0 < r["dp_efficiency"]["64"] <= r["dp_efficiency"]["8"] <= 1
    names = {t["target"] for t in result["targets"]}
    for feed in ("carry", "carry-static"):
        assert f"{feed}:compute / {feed} real tokens/s (1 GPU)" in names
        assert f"{feed}:compute bootstrap DP-64 efficiency (1 GPU)" in names


def test_gpu_benchmark_feed_names_and_step_spread():
    gb = _load(ROOT / "examples" / "gpu_benchmark.py", "gpu_benchmark")
    assert gb.parse_feed("carry-static:compute") == ("carry-static", "compute")
    assert gb.parse_feed("rounds32") == ("rounds32", "tokens")
    for bad in ("rounds16:compute", "padded:compute", "carry:cost", "roundsx", "bogus"):
        with pytest.raises(SystemExit, match="unknown feed"):
            gb.parse_feed(bad)
    flat = gb.step_spread([500.0] * 10)
    assert flat["step_cv"] == 0 and flat["dp_efficiency"] == {"8": 1.0, "64": 1.0}
    spread = gb.step_spread([400.0, 600.0] * 5)
    assert spread["step_cv"] == pytest.approx(0.2)
    # 8 ranks drawing 400/600 ms at random: the slowest is 600 unless all 8 drew 400 (1/256)
    assert spread["dp_efficiency"]["8"] == pytest.approx(500 / (600 - 200 / 256), abs=0.005)
    assert gb.step_spread([500.0]) == {"step_cv": None, "dp_efficiency": {}}
    assert gb.step_spread([400.0, 600.0] * 5, dp_sizes=()) == {"step_cv": spread["step_cv"], "dp_efficiency": {}}


def test_padded_and_unpadded_batches_hold_the_same_samples(data):
    gb = _load(ROOT / "examples" / "gpu_benchmark.py", "gpu_benchmark")
    loader, encoder = ft.make_loader(
        str(data), width=512, preset=ft.vision_preset("qwen2.5-vl", "tiny"), buffer=8, workers=0, tokenizer="demo"
    )
    batch = next(iter(loader))
    tok = encoder.tokenizer
    samples = gb.members(batch, tok.special.image_pad, tok.special.video_pad)
    assert [s["key"] for s in samples] == list(batch["__keys__"])
    row, padded = gb.concat_row(samples), gb.padded_batch(samples, tok.pad_id)
    assert int(row["input_ids"].numel()) == int(batch["real_tokens"]) == int(padded["attention_mask"].sum())
    assert float(row["loss_mask"].sum()) == float(padded["loss_mask"].sum()) == batch["supervised_tokens"]
    if batch["pixel_values"] is not None:
        assert torch.equal(row["pixel_values"], batch["pixel_values"]) and torch.equal(
            padded["pixel_values"], batch["pixel_values"]
        )
    # the unpadded row through the example's path equals the pack's loss (same segments, gaps removed)
    model = ft.prepare_model(ft.build_model("qwen2.5-vl", "tiny", tok))
    with torch.no_grad():
        _, pack_sum, _ = ft.forward_loss(model, batch)
        _, row_sum, _ = ft.forward_loss(model, row)
    assert torch.allclose(pack_sum, row_sum, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", sorted(ft.MODELS))
def test_examples_default_to_the_real_tokenizer_and_the_real_vocabulary_rows(data, name):
    """Without --tokenizer the examples' loader and model use the model's real tokenizer (built offline)
    and the real models' 151,936 embedding rows; the demo tokenizer only when asked for."""
    from energon_pack.chat import QWEN_VL_VOCAB_ROWS, load_tokenizer

    loader, encoder = ft.make_loader(str(data), width=2048, preset=ft.vision_preset(name, "tiny"), buffer=4, workers=0)
    assert encoder.tokenizer._energon_pack_qwen_vocab == name
    cfg = ft.model_config(name, "tiny", encoder.tokenizer)
    text = getattr(cfg, "text_config", cfg)
    assert QWEN_VL_VOCAB_ROWS == 151936 and text.vocab_size == 151936
    assert cfg.image_token_id == 151655 and cfg.video_token_id == 151656 and text.eos_token_id == 151645
    batch = next(iter(loader))
    real = load_tokenizer(name)
    ids = batch["input_ids"][0, : int(batch["cu_seqlens_q"][1])].tolist()
    header = "system" if name != "qwen3-vl" else "user"  # Qwen3-VL's template has no default system prompt
    assert ids[:3] == real.encode(f"<|im_start|>{header}\n") and max(ids) < 151936
    assert ft.vocab_size(load_tokenizer("demo")) == 832
