"""The reliability report, from a clone: ``python tests/stress/report.py [--full] [--out DIR]``.

Runs the resume sweep, the resume topology cases (another rank, world size, worker count or
dataset, an edited state), the coverage sweep, and, when their modules are present, the
hostile-input fuzz (``harness.fuzz.run_fuzz``), the convert fuzz (``harness.convert_fuzz``), the faults of
video files, object storage and pack-offline (``harness.faults``) and the memory bound
(``harness.memory.run_memory``); prints one table against the target "0 duplicated, 0 lost,
0 uncounted, 0 crashes, 0 hangs, 0 resume mismatches, 0 restores accepted elsewhere, 0 outside
bytes", writes ``stress_report.json`` and returns non-zero if any target is missed. Rows marked
``info`` are counts, not targets.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET = (
    "0 duplicated, 0 lost, 0 uncounted, 0 crashes, 0 hangs, 0 resume mismatches, 0 restores accepted "
    "elsewhere, 0 outside bytes"
)
INFO = ("cut points", "restore cases", "refused correctly", "records", "hostile records", "cases")
TRUE = ("within bound", "records add up")  # targets that must be True, not 0
FUZZ_SAMPLES = {"bounded": 600, "full": 10_000}


def _optional(module: str, name: str) -> Callable | None:
    try:
        return getattr(importlib.import_module(f"harness.{module}"), name)
    except (ImportError, AttributeError):
        return None


def _run(name: str, fn: Callable[[], dict]) -> tuple[dict, float, str | None]:
    start = time.perf_counter()
    try:
        return fn(), time.perf_counter() - start, None
    except Exception as exc:  # noqa: BLE001 - a crashing part is a missed target, reported
        return {}, time.perf_counter() - start, f"{name}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"


def rows_for(part: str, r: dict) -> list[tuple[str, Any]]:
    """(figure, value) rows of one part; every value must be 0 (True for :data:`TRUE`; any for :data:`INFO`)."""
    if part == "resume":
        return [
            ("resume mismatches", r.get("mismatches")),
            ("duplicated", r.get("duplicates")),
            ("lost", r.get("lost")),
            ("crashes", r.get("crashes")),
            ("hangs", r.get("hangs")),
        ]
    if part == "coverage":
        return [
            ("duplicated", r.get("duplicates")),
            ("lost", r.get("lost")),
            ("uncounted", r.get("uncounted")),
            ("crashes", r.get("crashes")),
            ("hangs", r.get("hangs")),
        ]
    if part == "fuzz":
        return [
            ("duplicated", r.get("duplicates")),
            ("lost", r.get("good_missing")),
            ("uncounted", r.get("bad_uncounted")),
            ("overcounted", r.get("bad_overcounted")),
            ("bad emitted", r.get("bad_emitted")),
            ("good mismatched", r.get("good_mismatched")),
            ("crashes", r.get("crashes")),
        ]
    if part == "memory":
        return [("within bound", r.get("within_bound"))]
    if part == "topology":
        return [
            ("restore cases", r.get("cases")),
            ("refused correctly", r.get("refused_correctly")),
            ("accepted silently", r.get("accepted_silently")),
            ("wrong error", r.get("wrong_error")),
            ("hangs", r.get("hangs")),
            ("control mismatches", r.get("control_mismatches")),
        ]
    if part == "convert":
        lost = (
            None if r.get("wanted_not_written") is None else r["wanted_not_written"] + r.get("wanted_not_delivered", 0)
        )
        dup = None if r.get("written_twice") is None else r["written_twice"] + r.get("delivered_twice", 0)
        emitted = (
            None if r.get("delivered_unwanted") is None else r["delivered_unwanted"] + r.get("delivered_unwritten", 0)
        )
        return [
            ("records", r.get("records")),
            ("hostile records", r.get("hostile")),
            ("crashes", r.get("crashes")),
            ("hangs", r.get("hangs")),
            ("skip reason mismatch", r.get("skip_reason_mismatches")),
            ("hostile written", r.get("written_unwanted")),
            ("hostile delivered", emitted),
            ("lost", lost),
            ("duplicated", dup),
            ("records add up", r.get("records_add_up")),
            ("outside bytes", r.get("outside_bytes_in_shards")),
            ("uncounted", r.get("written_unaccounted")),
            ("loader reason mismatch", r.get("loader_reason_mismatches")),
            ("hostile 1st line", r.get("first_line_failures")),
        ]
    if part == "faults":
        return [
            ("cases", r.get("cases")),
            ("crashes", r.get("crashes")),
            ("hangs", r.get("hangs")),
            ("wrong outcome", r.get("wrong_outcome")),
            ("mixed outputs", r.get("mixed_outputs")),
            ("over memory bound", r.get("over_memory_bound")),
            ("late failures", r.get("late_failures")),
        ]
    return []


def _met(figure: str, value: Any) -> bool:
    if figure in INFO:
        return True
    return value is True if figure in TRUE else value == 0


def _mark(figure: str, ok: bool) -> str:
    return "info" if figure in INFO else "yes" if ok else "NO"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/stress/report.py", description=__doc__)
    parser.add_argument("--full", action="store_true", help="full scale (>= 200 resume cut points, every layout)")
    parser.add_argument("--out", default="bench_results/stress", help="folder for data and JSON reports")
    args = parser.parse_args(argv)
    scale = "full" if args.full else "bounded"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from harness.coverage import run_coverage
    from harness.resume import run_resume_sweep
    from harness.topology import run_topology

    parts: dict[str, Callable[[], dict]] = {
        "resume": lambda: run_resume_sweep(out / "resume", scale),
        "topology": lambda: run_topology(out / "topology", scale),
        "coverage": lambda: run_coverage(out / "coverage", scale),
    }
    fuzz = _optional("fuzz", "run_fuzz")
    if fuzz is not None:
        parts["fuzz"] = lambda: fuzz(out_dir=out / "fuzz", n_samples=FUZZ_SAMPLES[scale], seed=0, workers=2)
    convert = _optional("convert_fuzz", "run_convert_fuzz")
    if convert is not None:
        parts["convert"] = lambda: convert(out / "convert", scale)
    faults = _optional("faults", "run_faults")
    if faults is not None:
        parts["faults"] = lambda: faults(out / "faults", scale)
    memory = _optional("memory", "run_memory")
    if memory is not None:
        parts["memory"] = lambda: memory(out_dir=out / "memory")

    report: dict[str, Any] = {"scale": scale, "target": TARGET, "parts": {}, "missed": []}
    table = []
    for name, fn in parts.items():
        print(f"running {name} ({scale}) ...", flush=True)
        result, seconds, error = _run(name, fn)
        report["parts"][name] = {
            "seconds": round(seconds, 1),
            "error": error,
            **{k: v for k, v in result.items() if not isinstance(v, (list, dict))},
        }
        if error:
            table.append((name, "crashes", "error", False, seconds))
            report["missed"].append(f"{name}: {error.splitlines()[0]}")
            continue
        for figure, value in rows_for(name, result):
            ok = _met(figure, value)
            table.append((name, figure, value, ok, seconds))
            if not ok:
                report["missed"].append(f"{name}: {figure} = {value}")
        if name == "resume":
            table.append((name, "cut points", result.get("cut_points"), True, seconds))
    for name in ("fuzz", "convert", "faults", "memory"):
        if name not in parts:
            report["parts"][name] = {"skipped": "module not installed"}

    print(f"\nstress report ({scale}); target: {TARGET}\n")
    print(f"{'part':<10} {'figure':<24} {'value':>10}  {'ok':<5} {'seconds':>8}")
    last = None
    for name, figure, value, ok, seconds in table:
        head = f"{name if name != last else '':<10} {figure:<24} {str(value):>10}  {_mark(figure, ok):<5}"
        print(f"{head} {seconds:>8.1f}" if name != last else head)
        last = name
    (out / "stress_report.json").write_text(json.dumps(report, indent=2, default=str))
    verdict = "all targets met" if not report["missed"] else "MISSED: " + "; ".join(report["missed"])
    print(f"\n{verdict}\nwrote {out / 'stress_report.json'}")
    return 0 if not report["missed"] else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
