"""Resume where a state does not belong: another rank, world size, worker count or dataset, or an edited state.

For a grid of workers {0, 2} x world sizes {1, 2, 3} x packing modes carry/rounds, a finite stream's
state is saved at a few cut points and restored into a loader that differs in one way: another
rank of the same world size, the same rank of another world size, another worker count, the
dataset with a shard added, removed or resized (re-prepared), or the state itself edited (open
bins removed, a packing counter or the reader's position changed). Each restore goes through
:func:`energon_pack.energon.restore_state_rank` ("ours") and through Energon's own
``loader.restore_state_rank`` ("energon", guarded once :mod:`energon_pack.energon` is imported),
then the rest of the epoch is read. A ``ConfigError`` whose
message names the change is "refused correctly" (``refused_after_packs``: Energon's path refused
only after packs of workers that started clean); no error is "accepted silently", another error
or message "wrong error", a call past the alarm a hang. The positive control restores the
unchanged loader by each path and must yield exactly the remaining packs.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .loaders import batch_difference, close, make_loader, roundtrip, stress_out_dir
from .watchdog import Hang, hang_alarm

CASE_SECONDS = 60
SHARD = 60  # records per shard; four shards make the saved dataset
RESIZED = 45  # records of part-00001.tar in the resized dataset
FIGURES = (
    "cases",
    "refused_correctly",
    "accepted_silently",
    "wrong_error",
    "hangs",
    "controls",
    "control_mismatches",
    "refused_after_packs",
)


def cells_for(scale: str) -> list[dict]:
    """The grid (full) or two cells of it (bounded); ``cuts`` are fractions of the epoch's packs."""
    if scale == "full":
        return [
            dict(workers=w, world_size=n, mode=m, cuts=(0.1, 0.6), paths=("ours", "energon"))
            for w in (0, 2)
            for n in (1, 2, 3)
            for m in ("carry", "rounds")
        ]
    return [
        dict(workers=0, world_size=2, mode="carry", cuts=(0.5,), paths=("ours", "energon")),
        dict(workers=2, world_size=3, mode="rounds", cuts=(0.5,), paths=("ours",)),
    ]


def _datasets(root: Path) -> dict[str, Path]:
    from .data import random_records, write_shards

    recs = random_records(5 * SHARD, seed=21, max_len=300, bad_every=23)
    shards = [recs[i : i + SHARD] for i in range(0, 5 * SHARD, SHARD)]
    layouts = {
        "base": shards[:4],
        "shard_added": shards,
        "shard_removed": shards[:3],
        "shard_resized": [shards[0], shards[1][:RESIZED], *shards[2:4]],
    }
    with contextlib.redirect_stdout(io.StringIO()):  # Energon's prepare prints its progress
        return {name: write_shards(root / name, parts) for name, parts in layouts.items()}


# ---------------------------------------------------------------------------------------- state edits
def _edit_state(state: Any, change: Callable[[dict], bool]) -> int:
    """Apply ``change`` to every mapping of a saved state (in place); the number it changed."""
    from energon_pack.energon.checkpoint import walk_state

    hits = []
    walk_state(state, lambda node: hits.append(1) if change(node) else False)
    return len(hits)


def _drop_open_bins(node: dict) -> bool:
    if isinstance(node.get("_packer_state"), dict) and node["_packer_state"].get("bins"):  # carry: open bins
        node["_packer_state"] = {**node["_packer_state"], "bins": []}
        return True
    if node.get("_pre_packing_buffer"):  # rounds: the samples held for the next round
        node["_pre_packing_buffer"] = type(node["_pre_packing_buffer"])()
        return True
    return False


def _bump_packing_counter(node: dict) -> bool:
    stats = node["_packer_state"]["stats"] if isinstance(node.get("_packer_state"), dict) else node.get("_stats_state")
    if isinstance(stats, dict) and "samples" in stats:
        stats["samples"] += 1
        return True
    return False


def _bump_reader_position(node: dict) -> bool:
    if isinstance(node.get("_sample_count"), int):
        node["_sample_count"] += 1
        return True
    return False


EDITS = {
    "open_bins_removed": _drop_open_bins,
    "packing_counter_edited": _bump_packing_counter,
    "reader_position_edited": _bump_reader_position,
}
_CHECKPOINT = (
    "checkpoint",
    r"checkpoint: the (loader state's parts .* do not match the checksum|carry-over state holds)",
)


# ---------------------------------------------------------------------------------------- one restore
def attempt(make: Callable[[], Any], state: Any, path: str, expect: tuple[str, str]) -> tuple[str, str, int]:
    """Restore ``state`` into ``make()`` by ``path`` and read the rest of the epoch: (outcome, detail, packs
    yielded before the refusal). ``expect`` is the knob and a pattern the refusal must name (a worker's
    error arrives inside PyTorch's traceback text, after the packs of workers that started clean)."""
    from energon_pack.energon.checkpoint import restore_state_rank
    from energon_pack.errors import ConfigError

    packs = 0
    try:
        with hang_alarm(CASE_SECONDS):
            loader = make()
            try:
                if path == "ours":
                    restore_state_rank(loader, state)
                else:
                    loader.restore_state_rank(state)
                for _ in loader:
                    packs += 1
            finally:
                close(loader)
    except Hang:
        return "hangs", f"no answer in {CASE_SECONDS} s", packs
    except ConfigError as exc:
        named = getattr(exc, "knob", None) == expect[0] and re.search(expect[1], str(exc), re.S)
        return ("refused_correctly" if named else "wrong_error"), str(exc)[-300:], packs
    except Exception as exc:  # noqa: BLE001 - any other error is a figure
        return "wrong_error", f"{type(exc).__name__}: {exc}"[:300], packs
    return "accepted_silently", f"restored and yielded {packs} packs without an error", packs


def _changes(cell: dict, rank: int, data: dict[str, Path], state: Any) -> list[tuple[str, dict, Any, tuple]]:
    """(name, loader keywords, state, (knob, expected words)) for every way this restore can be wrong."""
    w, n = cell["workers"], cell["world_size"]
    base = dict(path=data["base"], workers=w, rank=rank, world_size=n)
    out = []
    if n > 1:
        other = (rank + 1) % n
        out.append(
            (
                "other_rank",
                {**base, "rank": other},
                state,
                ("rank", rf"rank: the state was saved on rank {rank} of {n} and is restored on rank {other} of {n}\b"),
            )
        )
    for n2 in (1, 2, 3):
        if n2 != n:
            r2 = min(rank, n2 - 1)
            out.append(
                (
                    f"world_size_{n2}",
                    {**base, "world_size": n2, "rank": r2},
                    state,
                    (
                        "rank",
                        rf"rank: the state was saved on rank {rank} of {n} and is restored on rank {r2} of {n2}\b",
                    ),
                )
            )
    w2 = 2 if w == 0 else 0
    out.append(
        (
            "other_workers",
            {**base, "workers": w2},
            state,
            (
                "num_workers",
                rf"num_workers: the state was saved by a "
                rf"loader with num_workers={w}, this loader has num_workers={w2}\b",
            ),
        )
    )
    shard = {
        "shard_added": r"added part-00004\.tar \(60 samples\)",
        "shard_removed": r"removed part-00003\.tar \(60 samples\)",
        "shard_resized": rf"part-00001\.tar now has {RESIZED} samples, not {SHARD}",
    }
    for name, words in shard.items():
        out.append(
            (
                name,
                {**base, "path": data[name]},
                state,
                ("dataset", rf"dataset: the dataset's shards changed since .*{words}"),
            )
        )
    for name, edit in EDITS.items():
        edited = roundtrip(state)
        if _edit_state(edited, edit):  # a state with nothing to edit (no open bins at this cut) is no case
            out.append((name, base, edited, _CHECKPOINT))
    return out


def run_cell(cell: dict, rank: int, data: dict[str, Path]) -> dict:
    """Every cut point and change of one (workers, world size, mode, rank)."""
    from energon_pack.energon.checkpoint import restore_state_rank, save_state_rank

    figures = {k: 0 for k in FIGURES}
    rows: list[dict] = []
    mode = cell["mode"]

    def make(kw: dict) -> Callable[[], Any]:
        kw = dict(kw)
        return lambda: make_loader(kw.pop("path"), mode=mode, finite=True, **kw)

    own = dict(path=data["base"], workers=cell["workers"], rank=rank, world_size=cell["world_size"])
    with hang_alarm(CASE_SECONDS * 4):
        ref_loader = make(own)()
        reference = list(ref_loader)
        close(ref_loader)
        cuts = sorted({max(1, min(len(reference) - 1, round(f * len(reference)))) for f in cell["cuts"]})
        states, loader, taken = {}, make(own)(), 0
        it = iter(loader)
        for cut in cuts:
            while taken < cut:
                next(it)
                taken += 1
            states[cut] = roundtrip(save_state_rank(loader))
        close(loader)
    for cut in cuts:
        for change, kw, state, expect in _changes(cell, rank, data, states[cut]):
            for path in cell["paths"]:
                outcome, detail, packs = attempt(make(kw), roundtrip(state), path, expect)
                figures["cases"] += 1
                figures[outcome] += 1
                if outcome == "refused_correctly" and packs:
                    figures["refused_after_packs"] += 1
                rows.append(dict(cut=cut, change=change, path=path, outcome=outcome, detail=detail, packs=packs))
        for path in cell["paths"]:
            figures["controls"] += 1
            try:
                with hang_alarm(CASE_SECONDS * 2):
                    loader = make(own)()
                    (restore_state_rank if path == "ours" else type(loader).restore_state_rank)(
                        loader, roundtrip(states[cut])
                    )
                    rest = list(loader)
                    close(loader)
                want = reference[cut:]
                bad = len(rest) != len(want) or any(batch_difference(a, b) is not None for a, b in zip(rest, want))
                detail = f"{len(rest)} packs, {len(want)} wanted" if bad else ""
            except Exception as exc:  # noqa: BLE001 - Hang included: the control failed
                bad, detail = True, f"{type(exc).__name__}: {exc}"[:300]
            figures["control_mismatches"] += bad
            rows.append(
                dict(cut=cut, change="none (control)", path=path, outcome="mismatch" if bad else "exact", detail=detail)
            )
    return {**figures, "rows": rows}


def run_topology(out_dir, scale: str = "bounded") -> dict:
    """Run the grid at ``scale``; writes ``resume_topology.json`` to ``out_dir`` and returns the figures."""
    out_dir = stress_out_dir(out_dir, scale)
    data = _datasets(out_dir / "topology_data")
    totals = {k: 0 for k in FIGURES}
    cells, failures, by_change = [], [], {}
    start = time.perf_counter()
    for cell in cells_for(scale):
        rank = cell["world_size"] - 1  # the last rank: another rank and a smaller world both differ
        t0 = time.perf_counter()
        result = run_cell(cell, rank, data)
        rows = result.pop("rows")
        for k in FIGURES:
            totals[k] += result[k]
        failures += [dict(cell, rank=rank, **r) for r in rows if r["outcome"] not in ("refused_correctly", "exact")]
        for r in rows:
            change = re.sub(r"_\d$", "", r["change"])  # world_size_1/2/3 -> world_size
            by_change.setdefault(change, {}).setdefault(r["outcome"], 0)
            by_change[change][r["outcome"]] += 1
        cells.append(
            {
                **{k: v for k, v in cell.items() if k not in ("cuts", "paths")},
                "rank": rank,
                **result,
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    result = {
        "scale": scale,
        **totals,
        "seconds": round(time.perf_counter() - start, 2),
        "by_change": by_change,
        "cells": cells,
        "failures": failures[:40],
    }
    (out_dir / "resume_topology.json").write_text(json.dumps(result, indent=2, default=str))
    return result
