"""How the side-by-side loader figures are taken: warm-up first, modes in ABBA order with one seed per
run, runs merged (counts summed, rates the median), the repeat note; the demo in both orders. The
loader itself is replaced by fakes here (it is measured end to end in tests/cli/test_cli_and_examples.py)."""

import json
import re

import pytest

from energon_pack.bench import loader_bench
from energon_pack.bench.loader_bench import CellResult, abba, merge_runs, repeat_note, split_packs
from energon_pack.cli import main


def cell(mode="carry", packs=10, samples=100, real=8000, rate=50.0, first=1.0, rss=900.0, **kw):
    return CellResult(
        mode=mode,
        buffer=kw.pop("buffer", 16),
        workers=2,
        packs=packs,
        samples=samples,
        real_tokens=real,
        slots=packs * 1000,
        fill=real / (packs * 1000),
        samples_per_pack=samples / packs,
        packs_per_s=rate / 10,
        samples_per_s=rate,
        first_batch_s=first,
        peak_worker_rss_mb=rss,
        real_tokens_per_s=rate * 80,
        **kw,
    )


def test_abba_order_and_pack_split():
    assert abba(("carry", "rounds"), 2) == [(0, "carry"), (0, "rounds"), (1, "rounds"), (1, "carry")]
    assert abba(("rounds", "carry"), 3) == [
        (0, "rounds"),
        (0, "carry"),
        (1, "carry"),
        (1, "rounds"),
        (2, "rounds"),
        (2, "carry"),
    ]
    assert split_packs(150, 4) == [38, 38, 37, 37] and split_packs(5, 2) == [3, 2]
    assert split_packs(6, 4) == [2, 2, 2] and split_packs(3, 4) == [3] and split_packs(1, 2) == [1]


def test_merged_runs_sum_counts_and_take_the_median_rate():
    runs = [
        cell(packs=3, samples=30, real=2400, rate=40.0, first=2.0, rss=800.0, skips={"oversize": 1}),
        cell(
            packs=2, samples=26, real=1900, rate=60.0, first=1.0, rss=950.0, skips={"oversize": 2, "corrupt_image": 1}
        ),
    ]
    m = merge_runs(runs)
    assert (m.packs, m.samples, m.real_tokens, m.slots, m.runs) == (5, 56, 4300, 5000, 2)
    assert m.fill == 0.86 and m.samples_per_pack == 56 / 5
    assert m.samples_per_s == 50.0 and m.real_tokens_per_s == 4000.0 and m.first_batch_s == 1.5
    assert m.peak_worker_rss_mb == 950.0 and m.skips == {"corrupt_image": 1, "oversize": 3}
    assert m.samples_read == 56 + 4
    three = merge_runs([cell(rate=r) for r in (10.0, 70.0, 30.0)])
    assert three.samples_per_s == 30.0 and three.packs == 30


def test_repeat_note_names_both_sizes():
    assert repeat_note(6, 4012, "cell 1 (carry K=1)") == (
        "dataset holds 6 samples; cell 1 (carry K=1) reads 4,012 (it repeats the dataset 669 times)"
    )
    assert repeat_note(1200, 1650, "each timed run") == (
        "dataset holds 1,200 samples; each timed run reads 1,650 (it repeats the dataset 1.4 times)"
    )
    assert repeat_note(1200, 1200, "x") is None and repeat_note(None, 50, "x") is None


def test_interleaved_runs_abba_with_one_seed_per_run(monkeypatch):
    calls = []

    def fake_cell(path, *, mode, packs, seed, **kw):
        calls.append((mode, packs, seed, kw["buffer"]))
        return cell(mode=mode, packs=packs, samples=packs * 10, rate=100.0 if mode == "carry" else 50.0)

    monkeypatch.setattr(loader_bench, "run_cell", fake_cell)
    (carry, rounds), timed = loader_bench.interleaved("d", modes=("carry", "rounds"), packs=5, buffer=16, seed=3)
    assert calls == [("carry", 3, 3, 16), ("rounds", 3, 3, 16), ("rounds", 2, 4, 16), ("carry", 2, 4, 16)]
    assert (carry.mode, carry.packs, carry.runs, rounds.mode, rounds.packs) == ("carry", 5, 2, "rounds", 5)
    assert [(r, c.mode, c.packs) for r, c in timed] == [
        (0, "carry", 3),
        (0, "rounds", 3),
        (1, "rounds", 2),
        (1, "carry", 2),
    ]
    assert loader_bench.paired_ratios(timed, "carry", "rounds", "samples_per_s") == [2.0, 2.0]


def _fake_loader(monkeypatch, calls, dataset_samples=20):
    """run_cell replaced: carry twice as fast as rounds whatever the order (what a fair run shows)."""

    def fake_cell(path, *, mode, buffer, workers, packs, seed=0, **kw):
        calls.append((mode, workers, packs, seed))
        return cell(
            mode=mode,
            buffer=buffer,
            packs=packs,
            samples=packs * 12,
            real=packs * 900,
            rate=120.0 if mode == "carry" else 60.0,
            skips={"oversize": 1},
            dataset_samples=dataset_samples,
        )

    monkeypatch.setattr(loader_bench, "run_cell", fake_cell)


@pytest.mark.parametrize("order", [("carry", "rounds"), ("rounds", "carry")])
def test_demo_in_either_order_warms_up_interleaves_and_reports_carry_first(tmp_path, capsys, monkeypatch, order):
    from energon_pack.cli.demo import run_demo
    from energon_pack.cli.main import build_parser
    from energon_pack.energon.demo_data import make_demo_shards

    data = make_demo_shards(tmp_path / "d", samples=20, per_shard=20)
    calls = []
    _fake_loader(monkeypatch, calls)
    out = tmp_path / "out" / "demo.json"
    args = build_parser().parse_args(["demo", "--data", str(data), "--packs", "8", "--out", str(out)])
    assert run_demo(args, order=order) == 0
    a, b = order
    # the untimed warm-up (1 pack per mode, in this process), then 4 timed runs of 2 packs: A B B A A B B A
    runs = [(a, 0), (b, 0), (b, 1), (a, 1), (a, 2), (b, 2), (b, 3), (a, 3)]
    assert calls == [(a, 0, 1, 0), (b, 0, 1, 0)] + [(mode, 2, 2, seed) for mode, seed in runs]
    printed = capsys.readouterr().out
    abba = "-".join(mode for mode, _ in runs)
    assert f"8 packs per mode in 4 timed runs each, order {abba}, after an untimed warm-up" in printed
    table = [m[1] for m in re.finditer(r"^(carry|rounds) +64 ", printed, re.M)]
    assert table == ["carry", "rounds"]
    assert (
        "carry / rounds speed: 2.00x samples/s (runs 2.00-2.00x), 2.00x real tokens/s, median of 4 paired runs; "
        "carry faster in each of the 4 runs" in printed
    )
    # each run reads 2 packs x 12 samples + 1 skipped = 25 of the dataset's 20
    assert "dataset holds 20 samples; each timed run reads 25 (it repeats the dataset 1.2 times)" in printed
    assert f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["order"] == list(order) and [c["mode"] for c in result["cells"]] == ["carry", "rounds"]
    assert [(c["packs"], c["runs"], c["samples_read"], c["dataset_samples"]) for c in result["cells"]] == [
        (8, 4, 100, 20),
        (8, 4, 100, 20),
    ]
    assert [(t["run"], t["mode"], t["packs"]) for t in result["timed_runs"]] == [(r, m, 2) for m, r in runs]
    assert result["carry_over_rounds"] == {"samples_per_s": 2.0, "real_tokens_per_s": 2.0}


def test_paired_ratios_skip_a_run_without_a_rate():
    timed = [(0, cell("carry", rate=90.0)), (0, cell("rounds", rate=60.0)), (1, cell("rounds", rate=float("nan")))]
    timed += [(1, cell("carry", rate=80.0)), (2, cell("carry", rate=100.0)), (2, cell("rounds", rate=40.0))]
    assert loader_bench.paired_ratios(timed, "carry", "rounds", "samples_per_s") == [1.5, 2.5]


def test_demo_says_nothing_about_repeats_when_the_dataset_is_larger(tmp_path, capsys, monkeypatch):
    from energon_pack.energon.demo_data import make_demo_shards

    data = make_demo_shards(tmp_path / "d", samples=20, per_shard=20)
    _fake_loader(monkeypatch, [], dataset_samples=1000)
    assert main(["demo", "--data", str(data), "--packs", "2", "--out", str(tmp_path / "demo.json")]) == 0
    assert "repeats the dataset" not in capsys.readouterr().out
