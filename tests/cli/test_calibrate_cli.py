"""``energon-pack calibrate``: a run's step times (written by StepTimer) -> a fitted cost-model file that the real
Energon loader's encoder takes as ``cost_model=`` and names in its packing stats; unusable fits exit 2 with one line."""

import json

import numpy as np
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack.cli import main
from energon_pack.integrations.step_times import StepTimer
from energon_pack.packing.step_cost import cost_model_from_file, cost_model_name
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import close


def write_steps(path, n=40, width_choices=(1024, 2048, 4096), noise=0.01, seed=0):
    """``n`` steps recorded through StepTimer.record: ms = 20 + 0.05/slot + 2e-6/token^2 + 0.01/patch (x noise)."""
    rng = np.random.default_rng(seed)
    with StepTimer(path, device="cpu") as timer:
        for _ in range(n):
            width = float(rng.choice(width_choices))
            terms = {
                "slots": width,
                "tokens": width,
                "tokens_squared": width * width / int(rng.integers(1, 6)),
                "patches": float(rng.integers(0, 8000)),
                "patches_squared": 0.0,
            }
            ms = 20 + 0.05 * terms["slots"] + 2e-6 * terms["tokens_squared"] + 0.01 * terms["patches"]
            timer.record(terms, ms * np.exp(rng.normal(0, noise)) / 1e3)


def test_calibrate_writes_the_cost_model_the_encoder_prices_by(demo_shards, tmp_path, capsys):
    steps, out = tmp_path / "steps.jsonl", tmp_path / "models" / "h100.json"
    write_steps(steps)
    assert len(steps.read_text().splitlines()) == 40
    assert main(["calibrate", str(steps), "--out", str(out), "--name", "h100-eager", "--warmup", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    model = cost_model_from_file(out)
    name = cost_model_name(model)
    assert name.startswith("fit:h100-eager#") and model.per_token == 1.0
    assert model.per_patch == json.loads(out.read_text())["per_patch"]
    assert printed[0].split() == ["term", "ms", "per", "unit", "cost_model"]
    assert [line.split()[0] for line in printed[1:6]] == [
        "intercept",
        "slots",
        "tokens_squared",
        "patches",
        "patches_squared",
    ]
    assert printed[2].split()[1:] == ["0.05052", "1"]  # ms per slot fitted, the unit of the model
    assert printed[6].startswith("38 steps (2 warm-up dropped), mean ") and "R^2 0.999" in printed[6]
    assert printed[7] == f"wrote {out} ({name}); use it as cost_model={str(out)!r}"
    # the real loader: the encoder prices packs by the file, and its stats (and resume fingerprint) name it
    encoder = QwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset=get_preset("qwen2.5-vl", max_pixels=400 * 28 * 28),
        seq_length=4096,
        cost_model=str(out),
    )
    assert encoder.packing.cost_model == model and encoder.resume_knobs()["cost_model"] == name  # the fingerprint's
    loader = get_loader(
        get_train_dataset(
            str(demo_shards),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            task_encoder=encoder,
            packing_buffer_size=16,
            repeat=True,
        )
    )
    it = iter(loader)
    batches = [next(it) for _ in range(2)]
    close(loader)
    assert [b["packing_stats"]["cost_model"] for b in batches] == [name, name]


def test_unusable_fits_exit_2_with_one_line(tmp_path, capsys):
    steps, out = tmp_path / "steps.jsonl", tmp_path / "cm.json"
    write_steps(steps, noise=0.8)  # step times that follow their packs far less than they vary
    assert main(["calibrate", str(steps), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("energon-pack calibrate: error: R^2 0.")
    assert "is below 0.8: these step times do not follow the packs' cost terms" in err[0] and not out.exists()
    write_steps(steps, n=10)
    assert main(["calibrate", str(steps), "--out", str(out), "--warmup", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "energon-pack calibrate: error: steps: 7 steps after the 3 warm-up steps; a fit needs at least 8. "
        "Fix: record more steps (or drop fewer with --warmup)"
    ]
    write_steps(steps, width_choices=(2048,))
    assert main(["calibrate", str(steps), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every step computes 2048 token slots" in err[0]
    assert err[0].endswith(
        "Fix: record steps of different lengths (packs of several widths, or packs not padded to one width)"
    )
    assert not out.exists()
