"""The K sweep's order (an untimed warm-up, then the modes side by side at each K, ABBA), its time-left
estimate from the cells done, and its repeat note (the loader is a fake here)."""

from energon_pack.bench import buffer_sweep
from energon_pack.bench.buffer_sweep import estimate_left, expected_reads, plan_cells
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


def test_time_left_follows_the_samples_read_not_k():
    # the per-sample rate of the cells done (start-up included), times the samples the rest will read
    assert estimate_left([(300, 8.0), (100, 2.0)], [4000, 4000]) == 200.0
    # a cell's expected reads: full packs of samples as long as the cell's, plus K samples held per worker
    cell = _cell("carry", 1)
    assert expected_reads(cell, 256, 200, 2) == round(200 * 8192 / 400) + 512
    assert expected_reads(cell, 4, None, 2) == 6  # one pass: the dataset's samples


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
    clock = iter(range(0, 1000, 10))  # every cell takes 10 s
    monkeypatch.setattr(buffer_sweep.time, "perf_counter", lambda: float(next(clock)))
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
    # 4,012 read + 8 held = 4,020 samples in 10 s; each cell ahead reads 200 full packs (8192 / 400 tokens) + 2K
    assert lines[3:6] == [
        "cell 1/4 (carry K=4) took 10 s: about 31 s left (402 samples/s so far, full packs ahead)",
        "cell 2/4 (rounds K=4) took 10 s: about 21 s left (402 samples/s so far, full packs ahead)",
        "cell 3/4 (rounds K=16) took 10 s: about 10 s left (403 samples/s so far, full packs ahead)",
    ]
    assert len(lines) == 6  # no line after the last cell


def test_sweep_on_a_dataset_larger_than_a_cell_prints_no_repeat_note(capsys, monkeypatch):
    monkeypatch.setattr(buffer_sweep, "warm_up", lambda path, **kw: 0.0)
    monkeypatch.setattr(buffer_sweep, "run_cell", lambda path, mode, buffer, **kw: _cell(mode, buffer, 10_000))
    monkeypatch.setattr(buffer_sweep, "_wait_for_workers_to_exit", lambda: None)
    buffer_sweep.sweep("d", buffers=(4,), modes=("carry",), packs=200, progress=False)
    assert "repeats" not in capsys.readouterr().out
