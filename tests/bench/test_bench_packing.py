"""The packing benchmark's CLI runs end to end and reports consistent numbers (no timing asserts)."""

import json

import numpy as np

from energon_pack.bench.packing_bench import run_rounds
from energon_pack.cli import main


def test_bench_packing_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "packing.json"
    rc = main(["bench-packing", "--samples", "600", "--buffers", "4,64", "--widths", "4096", "--out", str(out)])
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "online fill" in printed and "rounds fill" in printed
    # three mixes x (lookahead row + 2 buffer rows)
    assert len(result["rows"]) == 9 and result["samples"] == 600
    for row in result["rows"]:
        assert 0 < row["online_fill"] <= 1
        if "rounds_fill" in row:
            assert row["online_fill"] >= row["rounds_fill"]
    assert {t["target"] for t in result["targets"]} == {"online fill - round FFD fill, worst cell >= 0"}
    assert rc == (0 if all(t["met"] for t in result["targets"]) else 1)


def test_round_ffd_baseline_counts_packs_per_buffer():
    # buffer of 2: [6,5] -> 2 packs, [4,3] -> 1 pack; fill = 18 / (3 * 10)
    costs = np.array([[6], [5], [4], [3]])
    r = run_rounds(costs, (10,), 2)
    assert r["packs"] == 3 and abs(r["fill"] - 0.6) < 1e-12
