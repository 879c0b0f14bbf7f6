"""The K sweep's order (an untimed warm-up, then the modes side by side at each K, ABBA), its time-left
estimate from the cells done, and its repeat note (the loader is a fake here)."""

import pytest

from energon_pack.bench import buffer_sweep
from energon_pack.bench.buffer_sweep import estimate_left, plan_cells
from energon_pack.bench.loader_bench import CellResult


def test_plan_puts_the_modes_side_by_side_at_each_k_in_abba_order():
    assert plan_cells(("carry", "rounds"), (1, 4, 8)) == [
        ("carry", 1),
        ("rounds", 1),
        ("rounds", 4),
        ("carry", 4),
        ("carry", 8),
        ("rounds", 8),
    ]
    assert plan_cells(("rounds",), (4, 16)) == [("rounds", 4), ("rounds", 16)]


def test_time_left_is_fitted_to_every_cell_done():
    # one K done: each cell as long as the mean of those done (a floor when larger K follow)
    assert estimate_left([(1, 10.0), (1, 14.0)], [4, 4, 8]) == (36.0, False)
    # cells cost 10 + 0.5 K: the fit finds it and sums the rest
    done = [(1, 10.5), (1, 10.5), (4, 12.0), (4, 12.0), (8, 14.0)]
    left, fitted = estimate_left(done, [8, 64, 64])
    assert fitted and left == pytest.approx(14.0 + 42.0 + 42.0)
    # a cost falling with K is not extrapolated: the slope is taken as 0
    assert estimate_left([(1, 20.0), (4, 10.0)], [256]) == (15.0, True)


def _cell(mode, k, dataset_samples=6):
    return CellResult(
        mode=mode,
        buffer=k,
        workers=2,
        packs=200,
        samples=4000,
        real_tokens=1_600_000,
        slots=200 * 8192,
        fill=1_600_000 / (200 * 8192),
        samples_per_pack=20.0,
        packs_per_s=10.0,
        samples_per_s=200.0,
        first_batch_s=1.0,
        peak_worker_rss_mb=900.0,
        skips={"oversize": 12},
        dataset_samples=dataset_samples,
    )


def test_sweep_warms_up_runs_abba_reports_each_cell_and_the_repeats(capsys, monkeypatch):
    calls, reported = [], []
    monkeypatch.setattr(buffer_sweep, "warm_up", lambda path, **kw: calls.append(("warm-up", kw["buffer"])) or 2.0)
    monkeypatch.setattr(
        buffer_sweep, "run_cell", lambda path, mode, buffer, **kw: calls.append((mode, buffer)) or _cell(mode, buffer)
    )
    monkeypatch.setattr(buffer_sweep, "_wait_for_workers_to_exit", lambda: None)
    cells = buffer_sweep.sweep(
        "d",
        buffers=(4, 16),
        packs=200,
        progress=False,
        on_cell=lambda done: reported.append([(c.mode, c.buffer) for c in done]),
    )
    assert calls == [("warm-up", 4), ("carry", 4), ("rounds", 4), ("rounds", 16), ("carry", 16)]
    assert [(c.mode, c.buffer) for c in cells] == [("carry", 4), ("carry", 16), ("rounds", 4), ("rounds", 16)]
    assert reported[1] == [("carry", 4), ("rounds", 4)] and reported[2] == [("carry", 4), ("rounds", 4), ("rounds", 16)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "sweep: 4 cells (2 modes x 2 K) x 200 packs, after an untimed warm-up; at each K the modes run next "
        "to each other, their order alternating"
    )
    assert lines[1] == "warm-up (untimed): 2 s"
    assert lines[2] == "dataset holds 6 samples; cell 1 (carry K=4) reads 4,012 (it repeats the dataset 669 times)"
    assert lines[3].startswith("cell 1/4 (carry K=4) took ") and lines[3].endswith(
        "left (at least: larger K take longer)"
    )
    assert lines[4].startswith("cell 2/4 (rounds K=4) took ")
    assert lines[5].startswith("cell 3/4 (rounds K=16) took ") and lines[5].endswith(
        "(a + b*K fitted to the 3 cells done)"
    )
    assert len(lines) == 6  # no line after the last cell


def test_sweep_on_a_dataset_larger_than_a_cell_prints_no_repeat_note(capsys, monkeypatch):
    monkeypatch.setattr(buffer_sweep, "warm_up", lambda path, **kw: 0.0)
    monkeypatch.setattr(buffer_sweep, "run_cell", lambda path, mode, buffer, **kw: _cell(mode, buffer, 10_000))
    monkeypatch.setattr(buffer_sweep, "_wait_for_workers_to_exit", lambda: None)
    buffer_sweep.sweep("d", buffers=(4,), modes=("carry",), packs=200, progress=False)
    assert "repeats" not in capsys.readouterr().out
