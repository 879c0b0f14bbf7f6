"""energon_pack.packing.calibrate: step times generated from known costs are fitted back, the coefficients stay >= 0,
unusable runs are refused by name, the terms come from every batch form we hand a trainer, and the fitted file
loads as a cost model."""

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from energon_pack.errors import ConfigError
from energon_pack.packing.calibrate import (
    MIN_STEPS,
    StepTimeRecord,
    fit_cost_model,
    fit_step_times,
    nnls,
    pack_cost_terms,
    read_step_times,
    sum_terms,
    write_cost_model,
)
from energon_pack.packing.step_cost import cost_model_from, cost_model_from_file, cost_model_name

#: the ms of each term the synthetic steps are made of (a 3B-like step: 0.05 ms per slot)
TRUE_MS = {"intercept": 30.0, "slots": 0.05, "tokens_squared": 2e-6, "patches": 0.01, "patches_squared": 1e-6}


def synthetic_steps(n=120, noise=0.01, seed=0, ms=TRUE_MS, widths=(2048, 4096, 8192)):
    """``n`` records whose seconds follow ``ms`` per term, times (1 + normal noise of ``noise``)."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        width = float(rng.choice(widths))
        segments = int(rng.integers(1, 8))
        images = int(rng.integers(0, 5))
        sides = rng.integers(16, 80, size=(images, 2))
        terms = {
            "slots": width,
            "tokens": width,
            "tokens_squared": width * width / segments,
            "patches": float(sum(h * w for h, w in sides)),
            "patches_squared": float(sum((h * w) ** 2 for h, w in sides)),
            "segments": float(segments),
            "images": float(images),
        }
        step_ms = ms["intercept"] + sum(ms[k] * terms[k] for k in ms if k != "intercept")
        records.append(StepTimeRecord(i, step_ms * (1 + rng.normal(0, noise)) / 1e3, terms))
    return records


def test_known_costs_are_recovered_from_noisy_steps():
    model, report = fit_cost_model(synthetic_steps(), name="synthetic", warmup=3)
    c = report.coefficients_ms
    assert report.steps == 117 and report.warmup == 3 and report.not_separable == []
    # within the noise's reach: each term's ms from 117 steps with 1% noise
    assert c["slots"] == pytest.approx(0.05, rel=0.02) and c["tokens_squared"] == pytest.approx(2e-6, rel=0.07)
    assert c["patches"] == pytest.approx(0.01, rel=0.05) and c["patches_squared"] == pytest.approx(1e-6, rel=0.15)
    assert c["intercept"] == pytest.approx(30.0, abs=3.0)
    # 1% noise on the steps: R^2 near 1, the residual spread the noise's (this seed's numbers)
    assert (report.r2, report.residual_cv, report.residual_max) == (0.9995, 0.0104, 0.0347)
    assert report.usable and report.terms_kept == ["intercept", "slots", "tokens_squared", "patches", "patches_squared"]
    # the model in token-equivalents: the per-slot cost is the unit
    assert model.per_token == 1.0 and model.per_window_patch == 0.0 and model.source == "fit:synthetic"
    assert model.per_patch == pytest.approx(0.2, rel=0.05) and model.per_token_squared == pytest.approx(4e-5, rel=0.07)


def test_noise_free_steps_are_fitted_exactly():
    records = synthetic_steps(noise=0.0)
    _, report = fit_cost_model(records, warmup=0)
    assert report.r2 == 1.0 and report.residual_cv == 0.0
    assert report.coefficients_ms == pytest.approx(TRUE_MS, rel=1e-6)


def test_a_negative_cost_is_fitted_as_zero_not_shipped():
    """Steps that get *faster* with patches squared: least squares would price it below 0, NNLS pins it at 0."""
    records = synthetic_steps(ms={**TRUE_MS, "patches_squared": -2e-7}, noise=0.002)
    model, report = fit_cost_model(records, warmup=0)
    assert report.coefficients_ms["patches_squared"] == 0.0 and model.per_patch_squared == 0.0
    assert "patches_squared" not in report.terms_kept
    assert all(v >= 0 for v in report.coefficients_ms.values())
    x = np.asarray([[1.0, *(r.terms[k] for k in list(TRUE_MS)[1:])] for r in records])
    free = np.linalg.lstsq(x, [r.seconds * 1e3 for r in records], rcond=None)[0]
    assert free[-1] < 0  # what unconstrained least squares would have shipped


def test_nnls_is_the_best_non_negative_solution():
    """Against every subset of free columns solved by least squares (the brute-force NNLS) on random problems."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        m, n = int(rng.integers(4, 20)), int(rng.integers(1, 5))
        a, b = rng.normal(size=(m, n)), rng.normal(size=m)
        best = np.inf
        for k in range(n + 1):
            for cols in itertools.combinations(range(n), k):
                x = np.zeros(n)
                if cols:
                    x[list(cols)] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
                if (x >= 0).all():
                    best = min(best, float(np.linalg.norm(a @ x - b)))
        x = nnls(a, b)
        assert (x >= 0).all() and float(np.linalg.norm(a @ x - b)) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_images_of_one_size_leave_patches_squared_unpriced():
    """Every image 20x20 patches: patches squared is 400 x patches in every step, so only patches is priced."""
    records = []
    for i, r in enumerate(synthetic_steps(noise=0.0)):
        images = r.terms["images"]
        terms = {**r.terms, "patches": 400.0 * images, "patches_squared": 160000.0 * images}
        ms = 30 + 0.05 * terms["slots"] + 2e-6 * terms["tokens_squared"] + 0.012 * terms["patches"]
        records.append(StepTimeRecord(i, ms / 1e3, terms))
    model, report = fit_cost_model(records, warmup=0)
    assert report.not_separable == ["patches_squared"] and model.per_patch_squared == 0.0
    assert report.coefficients_ms["patches"] == pytest.approx(0.012) and report.r2 == 1.0


def test_unusable_runs_are_refused_by_name():
    records = synthetic_steps(n=MIN_STEPS + 2)
    with pytest.raises(ConfigError) as caught:
        fit_cost_model(records, warmup=3)
    assert caught.value.knob == "steps"
    assert MIN_STEPS == 8 and str(caught.value) == (
        "steps: 7 steps after the 3 warm-up steps; a fit needs at least 8. Fix: record more steps (or drop fewer "
        "with warmup)"
    )
    one_width = synthetic_steps(widths=(4096,))
    with pytest.raises(ConfigError, match="every step computes 4096 token slots.*record steps of different lengths"):
        fit_cost_model(one_width)
    flat = [StepTimeRecord(r.step, 0.5 - r.terms["slots"] * 1e-6, r.terms) for r in synthetic_steps(noise=0.0)]
    with pytest.raises(ConfigError, match="the fitted cost of a token slot is 0"):
        fit_cost_model(flat)  # steps faster the longer they are
    with pytest.raises(ConfigError, match="warmup: is -1"):
        fit_cost_model(records, warmup=-1)
    with pytest.raises(ConfigError, match="there are no steps to fit"):
        fit_step_times([], [])


def test_fitted_file_loads_as_the_cost_model(tmp_path):
    model, report = fit_cost_model(synthetic_steps(), name="h100-eager")
    path = tmp_path / "cm.json"
    stable = write_cost_model(path, model, report)
    assert cost_model_from_file(path) == model == cost_model_from(str(path)) == cost_model_from(path)
    assert stable == cost_model_name(model) and stable.startswith("fit:h100-eager#")
    saved = json.loads(path.read_text())
    assert saved["fit"]["r2"] == report.r2 and saved["fit"]["steps"] == 117 and saved["fit"]["usable"] is True
    assert "residuals_ms" not in saved["fit"] and not list(tmp_path.glob("*.tmp"))


def test_terms_of_our_batch_hf_kwargs_and_bridge_batch():
    grids = torch.tensor([[1, 4, 6], [1, 2, 2]])
    video = torch.tensor([[2, 4, 4]])
    ours = {
        "input_ids": torch.zeros(1, 64, dtype=torch.long),
        "cu_seqlens_q": torch.tensor([0, 10, 30, 50], dtype=torch.int32),
        "cu_seqlens_q_padded": torch.tensor([0, 12, 32, 64], dtype=torch.int32),
        "image_grid_thw": grids,
        "video_grid_thw": video,
    }
    expected = {
        "slots": 64.0,
        "tokens": 50.0,
        "tokens_squared": 100.0 + 400 + 400,
        "patches": 24.0 + 4 + 32,
        "patches_squared": 576.0 + 16 + 2 * 256,
        "segments": 3.0,
        "images": 2.0,
        "videos": 1.0,
        "micro_batches": 1.0,
    }
    assert pack_cost_terms(ours) == expected
    # HF forward kwargs (PackedCollator): the physical spans HF's varlen attention runs
    hf = {"input_ids": ours["input_ids"], "cu_seq_lens_q": ours["cu_seqlens_q_padded"], "image_grid_thw": grids}
    assert pack_cost_terms(hf) == {
        **expected,
        "tokens": 64.0,
        "tokens_squared": 144.0 + 400 + 1024,
        "patches": 28.0,
        "patches_squared": 592.0,
        "videos": 0.0,
    }
    # static cu_seqlens (zero-length padding segments) and Bridge's legacy [1, n+1] padded with -1 and visual_inputs
    static = {**ours, "cu_seqlens_q": torch.tensor([0, 10, 30, 50, 50, 50], dtype=torch.int32)}
    assert pack_cost_terms(static) == expected
    bridge = {
        "input_ids": ours["input_ids"],
        "cu_seqlens": torch.tensor([[0, 10, 30, 50, -1, -1]]),
        "visual_inputs": SimpleNamespace(image_grid_thw=grids, video_grid_thw=video),
    }
    assert pack_cost_terms(bridge) == expected
    # unpacked rows: each row one segment, its attention mask's length
    rows = {
        "input_ids": torch.zeros(2, 8, dtype=torch.long),
        "attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3]),
    }
    assert pack_cost_terms(rows)["tokens_squared"] == 64.0 + 25 and pack_cost_terms(rows)["slots"] == 16.0
    with pytest.raises(ConfigError, match="batch: has neither cu_seqlens nor input_ids"):
        pack_cost_terms({"labels": torch.zeros(1, 4)})
    step = sum_terms([expected, expected])
    assert step["slots"] == 128.0 and step["micro_batches"] == 2.0 and step["images"] == 4.0


def test_step_file_cut_last_line_is_skipped_and_other_bad_lines_refused(tmp_path):
    records = synthetic_steps(n=12)
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(r.as_json() + "\n" for r in records) + '{"step": 12, "seconds": 0.4, "slo')
    read, skipped = read_step_times(path)
    assert skipped == 1 and [r.step for r in read] == list(range(12))
    assert read[0] == StepTimeRecord(0, records[0].seconds, {**records[0].terms, "videos": 0.0, "micro_batches": 0.0})
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "not json", *lines[1:3]]) + "\n")
    with pytest.raises(ConfigError, match=r"steps: .*steps.jsonl line 2 is not JSON"):
        read_step_times(path)
    path.write_text(json.dumps({"step": 0, "seconds": -1.0, **records[0].terms}) + "\n")
    with pytest.raises(ConfigError, match=r"line 1 has seconds=-1.0"):
        read_step_times(path)
    path.write_text(json.dumps({"step": 0, "seconds": 0.5}) + "\n")
    with pytest.raises(ConfigError, match=r"line 1 has no 'slots'.*StepTimeCallback or StepTimer"):
        read_step_times(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_step_times(tmp_path / "missing.jsonl")
