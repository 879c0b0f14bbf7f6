"""Sweep the packing buffer size K for both packing modes on an Energon dataset.

Shared by ``energon-pack bench`` and ``examples/compare_buffer_sizes.py``: a JSON result, a
markdown table, and (with matplotlib) PNG plots of fill, worker RSS and first-batch latency
against K. Also checks the issue targets that compare cells side by side in one run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .loader_bench import CellResult, cells_to_json, format_cells, run_cell
from .targets import check, format_target

DEFAULT_BUFFERS = (1, 4, 8, 16, 32, 64, 128, 256)
MODES = ("carry", "rounds")


def sweep(
    path: str | Path,
    *,
    buffers: Sequence[int] = DEFAULT_BUFFERS,
    modes: Sequence[str] = MODES,
    workers: int = 2,
    packs: int | None = 200,
    seq_length: int = 8192,
    preset: str = "qwen2.5-vl",
    progress: bool = True,
) -> list[CellResult]:
    cells = []
    for mode in modes:
        for k in buffers:
            cells.append(run_cell(path, mode=mode, buffer=k, workers=workers, packs=packs, seq_length=seq_length,
                                  preset=preset, progress=progress))
    return cells


def targets(cells: list[CellResult]) -> list[dict[str, Any]]:
    """Issue targets measured side by side: carry >= rounds at every K, RSS and latency ratios."""
    by = {(c.mode, c.buffer): c for c in cells}
    checks = []
    for k in sorted({c.buffer for c in cells}):
        if ("carry", k) in by and ("rounds", k) in by:
            checks.append(check(f"carry fill >= rounds fill at K={k}", by["carry", k].fill - by["rounds", k].fill, ">=", 0.0))
    small, large = ("carry", 8), ("carry", 256)
    if small in by and large in by:
        checks.append(check("carry worker RSS K=256 / K=8 <= 1.15",
                             by[large].peak_worker_rss_mb / by[small].peak_worker_rss_mb, "<=", 1.15))
        checks.append(check("carry first-batch latency K=256 / K=8 <= 3",
                             by[large].first_batch_s / by[small].first_batch_s, "<=", 3.0))
    return checks


def markdown_table(cells: list[CellResult]) -> str:
    lines = ["| mode | K | packs | samples/pack | fill | packs/s | samples/s | first batch (s) | peak worker RSS (MB) | skipped |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        lines.append(f"| {c.mode} | {c.buffer} | {c.packs} | {c.samples_per_pack:.1f} | {c.fill * 100:.2f}% | "
                     f"{c.packs_per_s:.2f} | {c.samples_per_s:.1f} | {c.first_batch_s:.2f} | {c.peak_worker_rss_mb:.0f} | "
                     f"{sum(c.skips.values())} |")
    return "\n".join(lines)


def plot(cells: list[CellResult], out_dir: Path) -> list[Path]:
    """PNG plots of fill, peak worker RSS and first-batch latency against K (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for attr, label, name in (("fill", "bin fill (real tokens / slots)", "fill"),
                              ("peak_worker_rss_mb", "peak RSS of all workers (MB)", "rss"),
                              ("first_batch_s", "first-batch latency (s)", "latency")):
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for mode in MODES:
            xs = [c.buffer for c in cells if c.mode == mode]
            ys = [getattr(c, attr) * (100 if attr == "fill" else 1) for c in cells if c.mode == mode]
            if xs:
                ax.plot(xs, ys, marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("packing_buffer_size K (samples per worker)")
        ax.set_ylabel(label + (" %" if attr == "fill" else ""))
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"buffer_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(path: str | Path, out_dir: str | Path, *, plots: bool = True, **kw: Any) -> dict[str, Any]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = sweep(path, **kw)
    result = {"dataset": str(path), "cells": cells_to_json(cells), "targets": targets(cells)}
    print(format_cells(cells))
    print()
    for t in result["targets"]:
        print(format_target(t))
    if plots:
        try:
            result["plots"] = [str(p) for p in plot(cells, out_dir)]
        except ImportError:
            plots = False
            print("matplotlib is not installed: no plots (pip install 'energon-pack[examples]')")
    (out_dir / "buffer_sizes.json").write_text(json.dumps(result, indent=2))
    (out_dir / "buffer_sizes.md").write_text(markdown_table(cells) + "\n")
    print(f"\nwrote {out_dir}/buffer_sizes.json, buffer_sizes.md" + (", buffer_*.png" if plots else ""))
    return result
