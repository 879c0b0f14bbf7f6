"""Fill and speed of OnlinePacker vs "round FFD" (Energon's PackingDataset behaviour).

Round FFD partitions each buffer of K fresh samples with first-fit-decreasing and emits every
group, carrying nothing over; OnlinePacker keeps open bins across rounds with the same bound
of K held samples. Both run side by side on the same seeded streams, so ratios are fair on a
noisy machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.bench.mixes import MIXES
from energon_pack.bench.outputs import write_report
from energon_pack.bench.targets import check, format_target
from energon_pack.packing import OnlinePacker, first_fit_decreasing

DEFAULT_BUFFERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_WIDTHS = (4096, 8192)
MEDIA_PER_PACK = 32


def run_online(costs: np.ndarray, capacity: tuple[int, ...], **kw: Any) -> dict[str, float]:
    packer = OnlinePacker(capacity, **kw)
    rows = [r[0] for r in costs.tolist()] if len(capacity) == 1 else [tuple(r) for r in costs.tolist()]
    start = time.perf_counter()
    emitted = 0
    for i, cost in enumerate(rows):
        emitted += len(packer.push(i, cost))
    emitted += len(packer.flush())
    elapsed = time.perf_counter() - start
    assert packer.stats.samples == len(rows) and emitted == packer.stats.packs
    return {"fill": packer.stats.fill, "packs": packer.stats.packs, "us_per_sample": elapsed / len(rows) * 1e6}


def run_rounds(costs: np.ndarray, capacity: tuple[int, ...], buffer_size: int) -> dict[str, float]:
    start = time.perf_counter()
    packs = 0
    for begin in range(0, len(costs), buffer_size):
        packs += len(first_fit_decreasing(costs[begin : begin + buffer_size], capacity).groups)
    elapsed = time.perf_counter() - start
    return {
        "fill": float(costs[:, 0].sum()) / (packs * capacity[0]),
        "packs": packs,
        "us_per_sample": elapsed / len(costs) * 1e6,
    }


def bench_packing(
    samples: int = 20000,
    buffers: tuple[int, ...] = DEFAULT_BUFFERS,
    widths: tuple[int, ...] = DEFAULT_WIDTHS,
    mixes: tuple[str, ...] = tuple(MIXES),
    lookahead_packs: float = 4.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Run every (mix, width, K) cell; returns rows plus the issue's target checks."""
    rows = []
    for mix in mixes:
        for width in widths:
            costs = MIXES[mix](samples, width, seed)
            capacity = (width, MEDIA_PER_PACK)[: costs.shape[1]]
            look = run_online(costs, capacity, lookahead_packs=lookahead_packs)
            rows.append(
                {
                    "mix": mix,
                    "width": width,
                    "buffer": f"lookahead_packs={lookahead_packs:g}",
                    **_prefix("online", look),
                }
            )
            for k in buffers:
                online = run_online(costs, capacity, max_buffered=k)
                rounds = run_rounds(costs, capacity, k)
                rows.append(
                    {"mix": mix, "width": width, "buffer": k, **_prefix("online", online), **_prefix("rounds", rounds)}
                )
    return {"samples": samples, "seed": seed, "rows": rows, "targets": _targets(rows, lookahead_packs)}


def _prefix(name: str, result: dict[str, float]) -> dict[str, float]:
    return {f"{name}_{k}": v for k, v in result.items()}


def _targets(rows: list[dict[str, Any]], lookahead_packs: float) -> list[dict[str, Any]]:
    def cell(mix: str, width: int, buffer: Any) -> dict[str, Any] | None:
        return next((r for r in rows if r["mix"] == mix and r["width"] == width and r["buffer"] == buffer), None)

    checks = []
    look = cell("lognormal", 8192, f"lookahead_packs={lookahead_packs:g}")
    if look:
        checks.append(check("lognormal w8192 lookahead_packs fill >= 99.5%", look["online_fill"], ">=", 0.995))
    k64 = cell("lognormal", 8192, 64)
    if k64:
        checks.append(check("lognormal w8192 K=64 fill >= 99%", k64["online_fill"], ">=", 0.99))
    k256 = cell("lognormal", 8192, 256)
    if k256:
        checks.append(check("lognormal w8192 K=256 us/sample <= 5", k256["online_us_per_sample"], "<=", 5.0))
    worst = min((r["online_fill"] - r["rounds_fill"] for r in rows if "rounds_fill" in r), default=None)
    if worst is not None:
        checks.append(check("online fill - round FFD fill, worst cell >= 0", worst, ">=", 0.0))
    return checks


def format_table(result: dict[str, Any]) -> str:
    head = (
        f"{'mix':<11}{'width':>6} {'buffer':<20}{'online fill':>12}{'rounds fill':>12}"
        f"{'online packs':>13}{'rounds packs':>13}{'online us/s':>12}{'rounds us/s':>12}"
    )
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        rf = f"{r['rounds_fill'] * 100:11.2f}%" if "rounds_fill" in r else f"{'':>12}"
        rp = f"{r['rounds_packs']:>13}" if "rounds_packs" in r else f"{'':>13}"
        ru = f"{r['rounds_us_per_sample']:>12.2f}" if "rounds_us_per_sample" in r else f"{'':>12}"
        lines.append(
            f"{r['mix']:<11}{r['width']:>6} {str(r['buffer']):<20}{r['online_fill'] * 100:11.2f}%{rf}"
            f"{r['online_packs']:>13}{rp}{r['online_us_per_sample']:>12.2f}{ru}"
        )
    lines.append("")
    for t in result["targets"]:
        lines.append(format_target(t))
    return "\n".join(lines)


def main(out: str | Path, **kw: Any) -> dict[str, Any]:
    result = bench_packing(**kw)
    print(format_table(result))
    print("\n" + write_report(out, result))
    return result
