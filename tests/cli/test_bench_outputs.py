"""Every file a benchmark command writes lies under its --out / --out-dir, is named in its output, and a
second run never overwrites a first (the earlier run's files are kept under their time); a run that
fails before writing leaves no folder."""

import json
import os
import time

import pytest

from energon_pack.bench.outputs import RunFiles, write_report
from energon_pack.cli import main


def _stamp(path):
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(path)))


def test_the_folder_is_made_at_the_first_write_and_every_file_is_announced(tmp_path):
    files = RunFiles(tmp_path / "out" / "deep", ["a.json", "a.md"])
    assert not (tmp_path / "out").exists()
    assert files.announce() == "wrote nothing"
    files.write_json("a.json", {"x": 1})
    files.write_json("a.json", {"x": 2})  # a run rewrites its own file
    files.write_text("a.md", "t\n")
    assert files.announce() == f"wrote {tmp_path}/out/deep/a.json, a.md"
    assert json.loads((tmp_path / "out" / "deep" / "a.json").read_text()) == {"x": 2}
    assert sorted(p.name for p in (tmp_path / "out" / "deep").iterdir()) == ["a.json", "a.md"]  # no temporary left
    with pytest.raises(ValueError, match="'b.json' is not one of this run's files"):
        files.path("b.json")


def test_a_second_run_keeps_the_first_runs_set_under_its_time(tmp_path, capsys):
    first = RunFiles(tmp_path, ["r.json", "r.md", "r.png"])
    first.write_text("r.json", "one")
    first.write_text("r.md", "one")
    old = os.path.getmtime(tmp_path / "r.json") - 3600
    os.utime(tmp_path / "r.json", (old, old))
    os.utime(tmp_path / "r.md", (old, old))
    stamp = _stamp(tmp_path / "r.json")
    capsys.readouterr()
    second = RunFiles(tmp_path, ["r.json", "r.md", "r.png"])
    second.write_text("r.json", "two")
    assert capsys.readouterr().out == (
        f"{tmp_path}/ held an earlier run's r.json (and 1 more): kept its 2 files with the earlier run's time "
        f"in the name (r.{stamp}.json)\n"
    )
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "r.json": "two",
        f"r.{stamp}.json": "one",
        f"r.{stamp}.md": "one",
    }
    # a third run whose earlier files carry the same time: a counter keeps them apart
    os.utime(tmp_path / "r.json", (old, old))
    third = RunFiles(tmp_path, ["r.json", "r.md", "r.png"])
    third.write_text("r.json", "three")
    assert (tmp_path / f"r.{stamp}-2.json").read_text() == "two" and (tmp_path / "r.json").read_text() == "three"


def test_write_report_announces_the_file(tmp_path):
    assert write_report(tmp_path / "x" / "r.json", {"a": 1}) == f"wrote {tmp_path}/x/r.json"
    assert json.loads((tmp_path / "x" / "r.json").read_text()) == {"a": 1}


def test_two_bench_packing_runs_write_two_files_and_announce_both(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["bench-packing", "--samples", "300", "--buffers", "4", "--widths", "4096"]
    main(args + ["--seed", "1"])
    out = capsys.readouterr().out
    assert out.splitlines()[-2] == "wrote bench_results/packing.json"  # the default, relative to here
    stamp = _stamp(tmp_path / "bench_results" / "packing.json")
    main(args + ["--seed", "2"])
    out = capsys.readouterr().out
    assert (
        f"bench_results/ held an earlier run's packing.json: kept it with the earlier run's time in the name "
        f"(packing.{stamp}.json)" in out
    )
    assert "wrote bench_results/packing.json" in out
    kept = json.loads((tmp_path / "bench_results" / f"packing.{stamp}.json").read_text())
    newest = json.loads((tmp_path / "bench_results" / "packing.json").read_text())
    assert (kept["seed"], newest["seed"]) == (1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench_results"]


def test_a_failed_bench_or_demo_leaves_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--data", "missing", "--tokenizer", "demo"]) == 2
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("x")
    assert main(["demo", "--data", "stuff"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stuff"]


def test_a_bench_failing_in_its_first_cell_leaves_no_folder(tmp_path, capsys, monkeypatch):
    from energon_pack.bench import buffer_sweep
    from energon_pack.energon.demo_data import make_demo_shards
    from energon_pack.errors import ConfigError

    data = make_demo_shards(tmp_path / "d", samples=20, per_shard=20)

    def failing_cell(path, **kw):
        raise ConfigError("seq_length", "too small for a sample", "pass a wider --width")

    monkeypatch.setattr(buffer_sweep, "warm_up", lambda path, **kw: 0.0)
    monkeypatch.setattr(buffer_sweep, "run_cell", failing_cell)
    out = tmp_path / "out"
    assert main(["bench", "--data", str(data), "--out-dir", str(out), "--tokenizer", "demo", "--loader-cells"]) == 2
    assert "--width" in capsys.readouterr().err and not out.exists()


def _cell(mode, k):
    from energon_pack.bench.loader_bench import CellResult

    return CellResult(mode, k, 2, 10, 100, 7000, 8000, 0.875, 10.0, 5.0, 50.0, 1.0, 900.0, real_tokens_per_s=3500.0)


def test_two_bench_runs_keep_both_sets(tmp_path, capsys, monkeypatch):
    from energon_pack.bench import buffer_sweep
    from energon_pack.energon.demo_data import make_demo_shards

    data = make_demo_shards(tmp_path / "d", samples=20, per_shard=20)
    cells = [_cell(mode, k) for mode in ("carry", "rounds") for k in (4, 16)]
    monkeypatch.setattr(buffer_sweep, "sweep", lambda path, on_cell=None, **kw: (on_cell(cells), cells)[1])
    out = tmp_path / "out"
    args = ["bench", "--data", str(data), "--out-dir", str(out), "--tokenizer", "demo", "--loader-cells"]
    assert main(args + ["--no-plots"]) == 0
    assert f"wrote {out}/buffer_sizes.json, buffer_sizes.md" in capsys.readouterr().out
    stamp = _stamp(out / "buffer_sizes.json")
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"{out}/ held an earlier run's buffer_sizes.json (and 1 more)" in printed
    assert (
        f"wrote {out}/buffer_sizes.json, buffer_fill.png, buffer_rss.png, buffer_latency.png, "
        f"buffer_throughput.png, buffer_sizes.md" in printed
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"buffer_sizes.{stamp}.json", f"buffer_sizes.{stamp}.md", "buffer_sizes.json", "buffer_sizes.md"]
        + [f"buffer_{n}.png" for n in ("fill", "rss", "latency", "throughput")]
    )
