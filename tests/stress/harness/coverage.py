"""Coverage of finite epochs on awkward dataset shapes, across ranks, workers and both packing modes.

For each shape (1 sample, fewer samples than workers, prime sizes, one giant shard, many tiny
shards, an all-bad shard, all bad; 0 samples is checked for a clear error) every valid sample
must come out exactly once across ranks and workers, valid + skipped must equal the total, and
every skip must be visible: in the ``packing_stats`` of some batch, or, for a worker that
emitted no pack at all, in its final stats in the loader state (``worker_stats_from_state``)
together with the end-of-stream warning.
"""

from __future__ import annotations

import json
import time
import warnings
from collections import Counter

from .loaders import close, make_loader, stress_out_dir
from .watchdog import HANG_SECONDS, Hang, hang_alarm


def shapes(scale: str) -> dict[str, list[list[dict]]]:
    from .data import random_records

    def recs(n, seed, bad_every=0):
        return random_records(n, seed=seed, max_len=300, bad_every=bad_every)

    big = 1500 if scale == "full" else 400
    out = {
        "one_sample": [recs(1, 1)],
        "fewer_than_workers": [recs(1, 2), recs(1, 3), recs(1, 4)],
        "primes": [recs(13, 5, 7), recs(29, 6), recs(53, 7, 11)],
        "one_giant_shard": [recs(big, 8, 19)],
        "many_tiny_shards": [
            recs(1 + i % 3, 100 + i, 2 if i % 5 == 0 else 0) for i in range(40 if scale == "full" else 24)
        ],
        "all_bad_shard": [recs(31, 9), [{"bad": "missing_field"}] * 37, recs(17, 10)],
        "all_bad": [[{"bad": "missing_field"}] * 23, [{"bad": "invalid_json"}] * 19],
        "post_encode_failures": [
            [{"n": 50, "post_bad": "corrupt_image"} if i % 4 == 0 else {"n": 120} for i in range(41)]
        ],
    }
    return out


def run_case(path, records, *, mode, workers, world_size) -> dict:
    from energon_pack.energon.checkpoint import worker_stats_from_state

    from .data import valid_keys

    total = sum(len(r) for r in records)
    valid = valid_keys(records)
    seen: Counter = Counter()
    skips_in_batches = 0
    skips_in_state_only = 0
    for rank in range(world_size):
        loader = make_loader(path, mode=mode, workers=workers, rank=rank, world_size=world_size, finite=True)
        latest = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for batch in loader:
                seen.update(batch["__keys__"])
                s = batch["packing_stats"]
                latest[(s["rank"], s["worker"])] = s
        skips_in_batches += sum(n for s in latest.values() for _, n in s["skips"])
        # workers that emitted no pack report their skips only in their final state
        for stats in worker_stats_from_state(loader.save_state_rank()):
            if stats["packs"] == 0 and stats["samples"] == 0:
                skips_in_state_only += sum(n for _, n in stats["skips"])
        close(loader)
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    lost = len(set(valid) - set(seen))
    unknown = len(set(seen) - set(valid))
    skipped = skips_in_batches + skips_in_state_only
    return dict(
        total=total,
        valid=len(valid),
        seen=len(seen),
        duplicates=duplicates,
        lost=lost + unknown,
        skipped_in_batches=skips_in_batches,
        skipped_in_state_only=skips_in_state_only,
        uncounted=total - len(set(seen) & set(valid)) - skipped,
    )


def run_coverage(out_dir, scale: str = "bounded") -> dict:
    """Run every shape x layout at ``scale``; writes ``coverage.json`` to ``out_dir``."""
    from .data import write_shards

    out_dir = stress_out_dir(out_dir, scale)
    layouts = (
        [(w, r, m) for w in (0, 2, 4) for r in (1, 2) for m in ("carry", "rounds")]
        if scale == "full"
        else [(0, 1, "carry"), (2, 2, "rounds"), (0, 2, "rounds"), (2, 1, "carry")]
    )
    totals = dict(cases=0, duplicates=0, lost=0, uncounted=0, crashes=0, hangs=0)
    cases, errors = [], []
    start = time.perf_counter()
    # 0 samples: Energon refuses to prepare/load it; the error must be clear (counted as a crash if not)
    try:
        write_shards(out_dir / "cov_empty", [[]])
        list(make_loader(out_dir / "cov_empty", mode="carry", workers=0, finite=True))
        cases.append({"shape": "empty", "outcome": "0 packs"})
    except Exception as exc:  # noqa: BLE001
        clear = "empty" in str(exc).lower() or "no " in str(exc).lower()
        cases.append({"shape": "empty", "outcome": f"{type(exc).__name__}: {str(exc)[:160]}", "clear": clear})
        if not clear:
            totals["crashes"] += 1
    for name, records in shapes(scale).items():
        path = write_shards(out_dir / f"cov_{name}", records)
        for workers, world, mode in layouts:
            totals["cases"] += 1
            t0 = time.perf_counter()
            try:
                with hang_alarm(HANG_SECONDS):
                    figures = run_case(path, records, mode=mode, workers=workers, world_size=world)
            except Hang:
                totals["hangs"] += 1
                figures = {"hang": True}
            except Exception as exc:  # noqa: BLE001
                totals["crashes"] += 1
                errors.append(f"{name} w{workers} r{world} {mode}: {type(exc).__name__}: {exc}"[:300])
                figures = {"crash": True}
            for k in ("duplicates", "lost", "uncounted"):
                totals[k] += abs(figures.get(k, 0))
            cases.append(
                {
                    "shape": name,
                    "workers": workers,
                    "world_size": world,
                    "mode": mode,
                    **figures,
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
    result = {
        "scale": scale,
        **totals,
        "seconds": round(time.perf_counter() - start, 2),
        "results": cases,
        "errors": errors[:20],
    }
    (out_dir / "coverage.json").write_text(json.dumps(result, indent=2))
    return result
