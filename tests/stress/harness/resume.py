"""Resume sweep: save at many cut points, restore into a fresh loader, compare every later pack bit for bit.

Cells cover workers {0, 2, 4}, world sizes {1, 2} (each rank its own loader), packing modes
carry/rounds, and train (infinite) and finite (``get_val_dataset``) streams. Cut points include
the first pack, packs inside a round with open bins, the last packs of a finite epoch, and a
chained cut (restore, save again before any ``next``, restore that). Every cut point runs with
an ``alarm`` watchdog: a blocked call counts as a hang, an exception as a crash.
"""

from __future__ import annotations

import json
import time

from .loaders import batch_difference, close, make_loader, roundtrip, stress_out_dir
from .watchdog import HANG_SECONDS, Hang, hang_alarm


def cells_for(scale: str) -> list[dict]:
    if scale == "full":
        cells = [
            dict(workers=w, world_size=r, mode=m, finite=f)
            for w in (0, 2, 4)
            for r in (1, 2)
            for m in ("carry", "rounds")
            for f in (False, True)
        ]
        return [dict(c, cuts=9) for c in cells]  # 24 cells x (9 cuts + 1 chained) = 240 cut points
    return [
        dict(workers=0, world_size=1, mode="carry", finite=True, cuts=5),
        dict(workers=2, world_size=1, mode="rounds", finite=True, cuts=5),
        dict(workers=0, world_size=2, mode="rounds", finite=False, cuts=4),
        dict(workers=2, world_size=2, mode="carry", finite=False, cuts=4),
    ]  # 18 cuts + 4 chained = 22 ... plus the last-pack cuts below


def _cut_points(n: int, k: int, finite: bool) -> list[int]:
    if n <= 2:
        return list(range(1, n + 1))
    points = {1, max(1, n // 3), max(1, n // 2)}
    if finite:
        points |= {n - 2, n - 1, n}  # the last packs of the epoch (n: saved after the very last one)
    step = max(1, n // (k + 1))
    c = step
    while len(points) < k and c < n:
        points.add(c)
        c += step
    return sorted(p for p in points if 1 <= p <= n)[: max(k, 6 if finite else k)]


def run_cell(path, cell: dict, rank: int, train_packs: int, tail: int) -> dict:
    mode, workers, world, finite = cell["mode"], cell["workers"], cell["world_size"], cell["finite"]
    figures = dict(cut_points=0, mismatches=0, duplicates=0, lost=0, crashes=0, hangs=0, errors=[])
    kw = dict(mode=mode, workers=workers, rank=rank, world_size=world, finite=finite)
    try:
        ref_loader = make_loader(path, **kw)
        it = iter(ref_loader)
        if finite:
            reference = list(it)
        else:
            reference = [next(it) for _ in range(train_packs)]
        cuts = _cut_points(len(reference), cell["cuts"], finite)
        states = {}
        first = make_loader(path, **kw)
        fit = iter(first)
        taken = 0
        for cut in cuts:
            while taken < cut:
                next(fit)
                taken += 1
            states[cut] = roundtrip(first.save_state_rank())
        close(first)
        close(ref_loader)
    except Hang:
        figures["hangs"] += 1
        return figures
    except Exception as exc:  # noqa: BLE001
        figures["crashes"] += 1
        figures["errors"].append(f"reference: {type(exc).__name__}: {exc}"[:300])
        return figures
    chained = cuts[len(cuts) // 2]
    for cut in cuts + ["chained"]:
        figures["cut_points"] += 1
        at = chained if cut == "chained" else cut
        try:
            restored = make_loader(path, **kw)
            restored.restore_state_rank(states[at])
            if cut == "chained":  # save right after a restore, before any next(), and restore that
                from energon_pack.energon.checkpoint import save_state_rank

                rit = iter(restored)
                again = roundtrip(save_state_rank(restored))
                del rit
                close(restored)
                restored = make_loader(path, **kw)
                restored.restore_state_rank(again)
            want = reference[at:] if finite else reference[at : at + tail]
            rit = iter(restored)
            got = []
            for _ in range(len(want)):
                batch = next(rit, None)
                if batch is None:
                    break
                got.append(batch)
            if finite:
                extra = list(rit)
                figures["duplicates"] += sum(len(b["__keys__"]) for b in extra)
            figures["lost"] += sum(len(b["__keys__"]) for b in want[len(got) :])
            diffs = [(i, d) for i, (a, b) in enumerate(zip(got, want)) if (d := batch_difference(a, b)) is not None]
            figures["mismatches"] += len(diffs)
            if diffs:
                figures["errors"].append(
                    f"cut {cut}: {len(diffs)} packs differ, first pack {at + diffs[0][0]} at "
                    f"{diffs[0][1]!r} (keys {got[diffs[0][0]]['__keys__']} vs {want[diffs[0][0]]['__keys__']})"[:300]
                )
            close(restored)
        except Hang:
            figures["hangs"] += 1
        except Exception as exc:  # noqa: BLE001
            figures["crashes"] += 1
            figures["errors"].append(f"cut {cut}: {type(exc).__name__}: {exc}"[:300])
    return figures


def run_resume_sweep(out_dir, scale: str = "bounded") -> dict:
    """Run the sweep at ``scale`` ("bounded" or "full"); writes ``resume_sweep.json`` to ``out_dir``."""
    from .data import random_records, write_shards

    out_dir = stress_out_dir(out_dir, scale)
    records = random_records(360 if scale == "full" else 200, seed=11, max_len=300, bad_every=23)
    data = write_shards(out_dir / "resume_data", [records[i : i + 40] for i in range(0, len(records), 40)])
    train_packs, tail = (40, 10) if scale == "full" else (24, 6)
    totals = dict(cut_points=0, mismatches=0, duplicates=0, lost=0, crashes=0, hangs=0)
    cells, errors = [], []
    start = time.perf_counter()
    for cell in cells_for(scale):
        for rank in range(cell["world_size"]):
            t0 = time.perf_counter()
            with hang_alarm(HANG_SECONDS * 4):
                figures = run_cell(data, cell, rank, train_packs, tail)
            errors += figures.pop("errors")
            for k in totals:
                totals[k] += figures[k]
            cells.append(
                {
                    **{k: v for k, v in cell.items() if k != "cuts"},
                    "rank": rank,
                    **figures,
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
    result = {
        "scale": scale,
        **totals,
        "seconds": round(time.perf_counter() - start, 2),
        "cells": cells,
        "errors": errors[:20],
    }
    (out_dir / "resume_sweep.json").write_text(json.dumps(result, indent=2))
    return result
