"""The README's main job and the examples run end to end on tiny data (no timing asserts)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from energon_pack.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_demo_reports_both_modes(tmp_path, capsys):
    out = tmp_path / "demo.json"
    rc = main(
        [
            "demo",
            "--data",
            str(tmp_path / "data"),
            "--samples",
            "120",
            "--packs",
            "4",
            "--workers",
            "0",
            "--seq-length",
            "4096",
            "--buffer",
            "16",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "carry (ours)" in printed and "rounds (Energon's PackingDataset + FFD)" in printed
    assert "4 packs per mode in 2 timed runs each, order carry-rounds-rounds-carry, after an untimed warm-up" in printed
    assert re.search(
        r"\ncarry / rounds speed: [0-9.]+x samples/s \(runs [0-9.]+-[0-9.]+x\), [0-9.]+x real tokens/s, "
        r"median of 2 paired runs; ",
        printed,
    )
    assert f"wrote {out}" in printed
    assert "repeats the dataset" not in printed  # 2 packs per run read fewer than its 120 samples
    cells = json.loads(out.read_text())["cells"]
    assert [c["mode"] for c in cells] == ["carry", "rounds"]
    for c in cells:
        assert c["packs"] == 4 and c["runs"] == 2 and c["dataset_samples"] == 120
        assert c["buffer"] == 16 and 0 < c["fill"] <= 1
        assert c["real_tokens"] + (c["slots"] - c["real_tokens"]) == 4 * 4096
        assert c["first_batch_s"] > 0 and c["peak_worker_rss_mb"] > 0
    assert (tmp_path / "data" / ".nv-meta" / "dataset.yaml").exists()


@pytest.mark.parametrize(
    ("samples", "tokens", "line"),
    [
        (
            [0.84, 1.06, 1.42],
            [0.9, 1.1, 1.3],
            "carry / rounds speed: 1.06x samples/s (runs 0.84-1.42x), 1.10x real tokens/s, median of 3 paired "
            "runs; the runs disagree on which mode is faster: no speed difference measured here",
        ),
        (
            [1.3, 1.2, float("nan"), 1.5],
            [1.3, 1.2, float("nan"), 1.5],
            "carry / rounds speed: 1.30x samples/s (runs 1.20-1.50x), 1.30x real tokens/s, median of 3 paired "
            "runs; carry faster in each of the 3 runs",
        ),
        (
            [0.5, 0.75],
            [0.5, 0.75],
            "carry / rounds speed: 0.62x samples/s (runs 0.50-0.75x), 0.62x real tokens/s, median of 2 paired "
            "runs; carry slower in each of the 2 runs",
        ),
    ],
)
def test_demo_speed_ratio_is_printed_with_its_spread(samples, tokens, line):
    """The demo's carry/rounds speed is never a bare median: its range, and whether the runs agree."""
    from energon_pack.cli.demo import speed_line

    assert speed_line(samples, tokens) == line


def test_compare_buffer_sizes_example_writes_json_table_and_plots(tmp_path):
    from energon_pack.energon import make_demo_shards

    data = make_demo_shards(tmp_path / "data", samples=80, per_shard=40)
    listing_before = sorted(p.name for p in data.iterdir())
    out = tmp_path / "out"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "compare_buffer_sizes.py"),
            "--data",
            str(data),
            "--buffers",
            "4,16",
            "--workers",
            "1",
            "--packs",
            "3",
            "--seq-length",
            "4096",
            "--out-dir",
            str(out),
            "--loader-cells",  # a loader run per cell (the replayed default: tests/bench/test_bench_user_data.py)
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads((out / "buffer_sizes.json").read_text())
    cells = result["cells"]
    assert [(c["mode"], c["buffer"]) for c in cells] == [("carry", 4), ("carry", 16), ("rounds", 4), ("rounds", 16)]
    fields = {
        "mode",
        "buffer",
        "workers",
        "packs",
        "samples",
        "real_tokens",
        "slots",
        "fill",
        "samples_per_pack",
        "packs_per_s",
        "samples_per_s",
        "first_batch_s",
        "peak_worker_rss_mb",
        "skips",
        "real_tokens_per_s",
        "runs",
        "dataset_samples",
        "samples_read",
        "sources",
    }
    for c in cells:
        assert set(c) == fields and c["packs"] == 3 and c["workers"] == 1
        assert c["real_tokens_per_s"] > 0 and c["runs"] == 1 and c["dataset_samples"] == 80
        assert c["samples_read"] == c["samples"] + sum(c["skips"].values())
    assert "sweep: 4 cells (2 modes x 2 K) x 3 packs, after an untimed warm-up" in run.stdout
    assert (
        f"wrote {out}/buffer_sizes.json, buffer_fill.png, buffer_rss.png, buffer_latency.png, "
        "buffer_throughput.png, buffer_sizes.md" in run.stdout
    )
    assert result["targets"] == []  # the project's targets are judged on its demo data only
    assert result["recommended_k"] in (4, 16)
    assert result["context"] == {
        "dataset": str(data),
        "seq_length": 4096,
        "workers": 1,
        "packs": 3,
        "preset": "qwen2.5-vl",
        "tokenizer": "qwen2.5-vl (Qwen's 151,643-token BPE + 22 added tokens, offline)",
    }
    assert (out / "buffer_sizes.md").read_text().count("\n") == 2 + 4
    for name in ("fill", "rss", "latency", "throughput"):
        assert (out / f"buffer_{name}.png").stat().st_size > 1000
    assert listing_before == sorted(p.name for p in data.iterdir())  # the dataset folder is only read


def _help_pages() -> list[list[str]]:
    from energon_pack.cli.main import _build

    return [["--help"], *([name, "--help"] for name in _build()[1])]


@pytest.mark.parametrize("command", _help_pages(), ids=" ".join)
def test_cli_help_is_plain_text(command, capsys):
    """Every command's --help exits 0 and prints no reST/Markdown markup (help texts are read in a terminal)."""
    with pytest.raises(SystemExit) as exc:
        main(command)
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "usage: energon-pack" in printed
    assert not re.findall(r"``|:(?:mod|func|class|meth|attr|data):`|\*\*\w", printed)


def test_cli_help_lists_every_command():
    assert [c[0] for c in _help_pages()[1:]] == [
        "demo",
        "make-demo",
        "convert",
        "prepare",
        "bench",
        "bench-packing",
        "inspect",
        "bench-pixels",
        "bench-sft",
        "pack-offline",
        "bench-offline",
        "calibrate",
        "plan",
        "plan-blend",
    ]


# The data-parallel example (a real HF Qwen-VL, 2 gloo processes via torchrun, save/resume, two-node
# rendezvous) is tested in tests/examples/test_finetune_example.py.


def test_task_encoder_config_example_runs_with_the_real_tokenizer():
    """examples/task_encoder_config.py as a user runs it: both paths yield a full pack, with Qwen's real ids."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "task_encoder_config.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if "pack:" in line]
    assert lines[0].startswith("Qwen-VL pack: torch.Size([1, 8192]) segments ")
    assert lines[1].startswith("JSONL pack: torch.Size([1, 4096]) segments ")
    source = (ROOT / "examples" / "task_encoder_config.py").read_text()
    assert 'load_tokenizer("qwen2.5-vl")' in source and "load_demo_tokenizer" not in source
