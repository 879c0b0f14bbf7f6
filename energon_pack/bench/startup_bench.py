"""How long the command line takes to start: ``energon-pack --help``, ``energon-pack convert`` of a
10-record JSON file and ``python -c "import energon_pack"``, each in a fresh process (wall time, several
repeats, the median), next to a bare ``python -c pass``.

Run ``python -m energon_pack.bench.startup_bench [--out-dir DIR] [--repeats N]``: it prints a table and
writes ``DIR/startup.json``. The goal (issue 32) is a convert under 1.5 s on an idle 2-core machine, which
needs it to import neither torch nor Megatron-Energon (``tests/cli/test_fast_start.py`` checks the imports;
this measures the time).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: the wall-time goal of a small convert, in seconds
CONVERT_TARGET_S = 1.5
RESULT_FILE = "startup.json"


def cli_command() -> list[str]:
    """The installed ``energon-pack`` script (what a user runs), else ``python -m energon_pack.cli``."""
    script = Path(sys.executable).parent / "energon-pack"
    return [str(script)] if script.exists() else [sys.executable, "-m", "energon_pack.cli"]


def write_source(folder: Path, records: int = 10) -> Path:
    """A ShareGPT JSON array of ``records`` text-only records."""
    path = folder / "ten.json"
    turns = [{"from": "human", "value": "question {i}"}, {"from": "gpt", "value": "answer {i}"}]
    data = [
        {"id": str(i), "conversations": [{**t, "value": t["value"].format(i=i)} for t in turns]} for i in range(records)
    ]
    path.write_text(json.dumps(data))
    return path


def time_once(argv: list[str], cwd: Path) -> float:
    """Wall seconds of one run of ``argv`` to its end (it must exit 0)."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return seconds


def measure(repeats: int) -> list[dict[str, Any]]:
    """Each case ``repeats`` times (after one unmeasured warm-up run that fills the OS file cache)."""
    cli = cli_command()
    rows = []
    with tempfile.TemporaryDirectory(prefix="energon_pack_startup_") as tmp:
        tmp_path = Path(tmp)
        source = write_source(tmp_path)
        runs = itertools.count()
        cases = {
            "python -c pass": lambda: [sys.executable, "-c", "pass"],
            'python -c "import energon_pack"': lambda: [sys.executable, "-c", "import energon_pack"],
            "energon-pack --help": lambda: [*cli, "--help"],
            "energon-pack convert (10 JSON records)": lambda: [
                *cli,
                "convert",
                str(source),
                str(tmp_path / f"out{next(runs)}"),
                "--no-progress",
            ],
        }
        for name, argv in cases.items():
            time_once(argv(), tmp_path)
            seconds = [time_once(argv(), tmp_path) for _ in range(repeats)]
            row = {
                "case": name,
                "median_s": round(statistics.median(seconds), 4),
                "min_s": round(min(seconds), 4),
                "max_s": round(max(seconds), 4),
                "runs_s": [round(s, 4) for s in seconds],
            }
            if name.startswith("energon-pack convert"):
                row["target_s"] = CONVERT_TARGET_S
                row["met"] = row["median_s"] < CONVERT_TARGET_S
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["case"]) for r in rows)
    lines = [f"{'case':<{width}}  {'median s':>9}  {'min s':>7}  {'max s':>7}  target"]
    for r in rows:
        target = "" if "target_s" not in r else f"< {r['target_s']} s: {'met' if r['met'] else 'MISSED'}"
        lines.append(f"{r['case']:<{width}}  {r['median_s']:>9.3f}  {r['min_s']:>7.3f}  {r['max_s']:>7.3f}  {target}")
    return "\n".join(lines)


def main(out_dir: str | Path = "bench_results", repeats: int = 5) -> dict[str, Any]:
    """Measure, print the table, write ``out_dir/startup.json``; returns the result."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows = measure(repeats)
    result = {
        "benchmark": "startup",
        "repeats": repeats,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load] if load else None,
        "cli": cli_command(),
        "cases": rows,
    }
    print(table(rows))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULT_FILE
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--out-dir", default="bench_results", help="folder for startup.json (default: bench_results)")
    parser.add_argument("--repeats", type=int, default=5, help="measured runs per case (default: 5)")
    args = parser.parse_args()
    main(args.out_dir, args.repeats)
