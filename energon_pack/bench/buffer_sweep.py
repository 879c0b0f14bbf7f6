"""Sweep the packing buffer size K for both packing modes on an Energon dataset.

Shared by ``energon-pack bench`` and ``examples/compare_buffer_sizes.py``: a JSON result, a
markdown table, and (with matplotlib) PNG plots of fill, worker RSS, first-batch latency and
throughput against K, with the recommended K marked. Also evaluates the project's own benchmark
targets that compare cells side by side (information; ``energon-pack bench --check`` turns a
miss into exit 1).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from .loader_bench import CellResult, _wait_for_workers_to_exit, cells_to_json, format_cells, run_cell
from .targets import check, format_target

DEFAULT_BUFFERS = (1, 4, 8, 16, 32, 64, 128, 256)
MODES = ("carry", "rounds")


# Documented time constants for the estimate printed before a sweep (measured on the 2-core dev
# machine, 2 workers, width 8192, demo data: ~12 packs/s at K=64, ~50 at K=1; worker start-up and
# first batch ~4 s per cell). A sweep refines the estimate from its first cell.
SECONDS_PER_PACK_AT_8192 = 0.08
SECONDS_PER_CELL = 4.0
#: the fill reference line in the plots: the project's benchmark goal (>= 99% at K=64)
FILL_TARGET = 0.99
#: recommended K: the smallest measured K whose carry fill is within this of the best carry fill
RECOMMEND_WITHIN = 0.005


def estimate_seconds(cells: int, packs: int | None, seq_length: int = 8192) -> float | None:
    """Rough wall time of ``cells`` cells of ``packs`` packs from the documented constants (None: full epochs)."""
    if packs is None:
        return None
    return cells * (SECONDS_PER_CELL + packs * SECONDS_PER_PACK_AT_8192 * seq_length / 8192)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


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
    tokenizer: Any = None,
) -> list[CellResult]:
    """Every (mode, K) cell; prints a time estimate before it starts and a refined one after the first cell."""
    plan = [(mode, k) for mode in modes for k in buffers]
    guess = estimate_seconds(len(plan), packs, seq_length)
    print(f"sweep: {len(plan)} cells ({len(modes)} modes x {len(buffers)} K) x "
          + (f"{packs} packs: about {_minutes(guess)} (estimate at ~{SECONDS_PER_PACK_AT_8192 * seq_length / 8192:.2f} s/pack "
             f"+ {SECONDS_PER_CELL:.0f} s/cell; refined after the first cell)" if guess is not None
             else "one full epoch each: the estimate follows the first cell"), flush=True)
    cells = []
    for i, (mode, k) in enumerate(plan):
        start = time.perf_counter()
        cells.append(run_cell(path, mode=mode, buffer=k, workers=workers, packs=packs, seq_length=seq_length,
                              preset=preset, progress=progress, tokenizer=tokenizer))
        if i == 0 and len(plan) > 1:
            _wait_for_workers_to_exit()  # part of every later cell's cost
            took = time.perf_counter() - start
            print(f"first cell took {_minutes(took)}: about {_minutes(took * (len(plan) - 1))} left "
                  f"(larger K take longer per pack)", flush=True)
    return cells


def recommended_k(cells: list[CellResult], mode: str = "carry", within: float = RECOMMEND_WITHIN) -> int | None:
    """The smallest measured K whose ``mode`` fill is within ``within`` (0.005 = 0.5 points) of that
    mode's best fill; falls back to the first mode measured when ``mode`` was not."""
    if not cells:
        return None
    rows = [c for c in cells if c.mode == mode] or [c for c in cells if c.mode == cells[0].mode]
    best = max(c.fill for c in rows)
    return min(c.buffer for c in rows if c.fill >= best - within)


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


def figures(cells: list[CellResult], context: dict[str, Any] | None = None) -> dict[str, Any]:
    """Matplotlib figures ``fill``, ``rss``, ``latency`` and ``throughput`` against K.

    Each has a title with the run context (data path, width, workers, packs per cell), x ticks at
    the measured K, y from 0; the fill plot marks the fill target and the recommended K
    (:func:`recommended_k`: the smallest K within 0.5 fill points of the best carry fill)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    context = context or {}
    ks = sorted({c.buffer for c in cells})
    packs = context.get("packs")
    title = (f"{context.get('dataset', '?')}\nwidth {context.get('seq_length', '?')}, {context.get('workers', '?')} workers, "
             f"{'one epoch' if packs is None else f'{packs} packs'} per cell"
             + (f", {context['preset']}" if context.get("preset") else ""))
    rec = recommended_k(cells)
    modes = [m for m in MODES if any(c.mode == m for c in cells)]

    def base(ylabel: str) -> tuple[Any, Any]:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("packing_buffer_size K (samples per worker)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.set_title(title, fontsize=8)
        return fig, ax

    def ticks(ax: Any) -> None:
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if len(ks) > 1:
            ax.set_xlim(ks[0] / 1.3, ks[-1] * 1.3)

    out = {}
    for attr, label, name in (("fill", "bin fill: real tokens / slots (%)", "fill"),
                              ("peak_worker_rss_mb", "peak RSS of all workers (MB)", "rss"),
                              ("first_batch_s", "first-batch latency (s)", "latency")):
        fig, ax = base(label)
        top = 0.0
        for mode in modes:
            rows = sorted((c for c in cells if c.mode == mode), key=lambda c: c.buffer)
            ys = [getattr(c, attr) * (100 if attr == "fill" else 1) for c in rows]
            ax.plot([c.buffer for c in rows], ys, marker="o", label=mode)
            top = max([top, *[y for y in ys if y == y]])
        if attr == "fill":
            ax.axhline(FILL_TARGET * 100, color="green", linestyle="--", linewidth=1,
                       label=f"fill target {FILL_TARGET:.0%}")
            ax.set_ylim(0, 101)
        else:
            ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        if rec is not None:
            ax.axvline(rec, color="gray", linestyle=":", linewidth=1.5,
                       label=f"recommended K={rec} (smallest K within 0.5 fill points of the best carry fill)"
                       if attr == "fill" else f"recommended K={rec}")
        ticks(ax)
        ax.legend(fontsize=7, loc="lower right" if attr == "fill" else "best")
        fig.tight_layout()
        out[name] = fig

    fig, ax = base("packs/s (solid)")
    ax2 = ax.twinx()
    ax2.set_ylabel("source samples/s (dashed)")
    top1 = top2 = 0.0
    for i, mode in enumerate(modes):
        rows = sorted((c for c in cells if c.mode == mode), key=lambda c: c.buffer)
        xs = [c.buffer for c in rows]
        color = f"C{i}"
        p = [c.packs_per_s for c in rows]
        sm = [c.samples_per_s for c in rows]
        ax.plot(xs, p, marker="o", color=color, label=f"{mode} packs/s")
        ax2.plot(xs, sm, marker="s", linestyle="--", color=color, label=f"{mode} samples/s")
        top1 = max([top1, *[v for v in p if v == v]])
        top2 = max([top2, *[v for v in sm if v == v]])
    ax.set_ylim(0, top1 * 1.15 if top1 > 0 else 1)
    ax2.set_ylim(0, top2 * 1.15 if top2 > 0 else 1)
    ticks(ax)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="lower left")
    fig.tight_layout()
    out["throughput"] = fig
    return out


def plot(cells: list[CellResult], out_dir: Path, context: dict[str, Any] | None = None) -> list[Path]:
    """PNG plots ``buffer_{fill,rss,latency,throughput}.png`` of :func:`figures`."""
    import matplotlib.pyplot as plt

    written = []
    for name, fig in figures(cells, context).items():
        path = Path(out_dir) / f"buffer_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(path: str | Path, out_dir: str | Path, *, plots: bool = True, tokenizer_name: str | None = None,
         **kw: Any) -> dict[str, Any]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = sweep(path, **kw)
    context = {"dataset": str(path), "seq_length": kw.get("seq_length", 8192), "workers": kw.get("workers", 2),
               "packs": kw.get("packs", 200), "preset": kw.get("preset", "qwen2.5-vl"), "tokenizer": tokenizer_name}
    rec = recommended_k(cells)
    result = {"dataset": str(path), "context": context, "cells": cells_to_json(cells), "recommended_k": rec,
              "targets": targets(cells)}
    print(format_cells(cells))
    if rec is not None:
        print(f"\nrecommended K = {rec}: the smallest measured K whose carry fill is within 0.5 points of the best")
    if result["targets"]:
        print("\nproject benchmark targets (for information):")
    for t in result["targets"]:
        print(format_target(t))
    if plots:
        try:
            result["plots"] = [str(p) for p in plot(cells, out_dir, context)]
        except ImportError:
            plots = False
            print("matplotlib is not installed: no plots (pip install 'energon-pack[examples]')")
    (out_dir / "buffer_sizes.json").write_text(json.dumps(result, indent=2))
    (out_dir / "buffer_sizes.md").write_text(markdown_table(cells) + "\n")
    print(f"\nwrote {out_dir}/buffer_sizes.json, buffer_sizes.md" + (", buffer_*.png" if plots else ""))
    return result
