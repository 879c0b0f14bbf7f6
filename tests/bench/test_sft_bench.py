"""The SFT benchmark runs end to end on tiny inputs and reports every target."""

import json

from energon_pack.bench.sft_bench import main


def test_sft_bench_tiny(tmp_path, capsys):
    result = main(tmp_path / "sft.json", size_mb=1, getitem_samples=100, fill_samples=2000, workdir=tmp_path)
    assert [t["name"] for t in result["targets"]] == [
        "index build / wc -l",
        "lazy __getitem__ samples/s",
        "in-batch fill @4096",
    ]
    assert result["index"]["lines"] > 0 and result["fill"]["fill"] > result["fill"]["baseline"]["fill"]
    assert json.loads((tmp_path / "sft.json").read_text())["getitem"]["samples"] == 100
    printed = capsys.readouterr().out
    assert "index: 1 MiB" in printed and "target" not in printed  # graded only with check=True
    assert [p.name for p in tmp_path.iterdir()] == ["sft.json"]  # generated files removed
