"""The patch budget of static packs, chosen from the data: the smallest ``max_patches_per_pack`` whose fill
stays within half a point of the packs without one (``static_visual=True`` pads every pack to it).

The samples' costs (aligned tokens, vision patches) are read once through the task encoder's own
``preencode_sample`` (image headers only, no pixels); the packer is then replayed on them for each candidate
budget, as the loader runs it (carry mode, ``packing_buffer_size`` K, seeded).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from energon_pack.packing import OnlinePacker

#: a recommended budget keeps fill within this of the packs without a patch budget
RECOMMEND_WITHIN = 0.005

__all__ = ["RECOMMEND_WITHIN", "candidate_costs", "fill_with_budget", "recommend_patch_budget"]


def candidate_costs(path: str, *, width: int, preset: Any = "qwen2.5-vl", tokenizer: Any = None,
                    limit: int | None = None, **packing: Any) -> np.ndarray:
    """int64 (n, 2): each sample's (aligned tokens, patches) as the encoder's ``preencode_sample`` costs it;
    skipped samples are left out. ``packing``: other :class:`PackingConfig` knobs (cp, tp, ...)."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset, stateless

    from energon_pack.energon.samples import PackCandidate
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    class CostReader(QwenVLPackingTaskEncoder):
        @stateless
        def postencode_sample(self, sample: Any) -> Any:
            return sample

        @stateless
        def batch(self, samples: list) -> list:
            return [tuple(s.cost) for s in samples if isinstance(s, PackCandidate)]

    encoder = CostReader(tokenizer=tokenizer, preset=preset, seq_length=width, max_patches_per_pack=2**40, **packing)
    dataset = get_train_dataset(path, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None,
                                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), task_encoder=encoder,
                                repeat=False)
    rows: list[tuple[int, ...]] = []
    for batch in get_loader(dataset):
        rows.extend(batch)
        if limit is not None and len(rows) >= limit:
            break
    return np.asarray(rows[:limit], dtype=np.int64).reshape(-1, 2)


def fill_with_budget(costs: np.ndarray, width: int, budget: int | None, *, buffer: int = 64, seed: int = 0) -> dict:
    """Fill (real tokens / slots), packs and the largest pack's patches of the carry packer on ``costs``,
    with a patch budget (``None``: tokens only). Samples over the budget are counted as skipped."""
    capacity = (width,) if budget is None else (width, budget)
    packer = OnlinePacker(capacity, max_buffered=buffer, seed=seed)
    most, patches = 0, {i: int(c[1]) for i, c in enumerate(costs)}

    def done(groups: list) -> int:
        return max((sum(patches[k] for k in g) for g in groups), default=0)

    for i, c in enumerate(costs.tolist()):
        most = max(most, done(packer.push(i, c[0] if budget is None else (c[0], c[1]))))
    most = max(most, done(packer.flush()))
    return {"budget": budget, "fill": packer.stats.fill, "packs": packer.stats.packs, "skipped": packer.stats.skipped,
            "max_pack_patches": most}


def recommend_patch_budget(costs: np.ndarray, width: int, *, buffer: int = 64, within: float = RECOMMEND_WITHIN,
                           multiple: int = 256, seed: int = 0) -> dict:
    """The smallest multiple of ``multiple`` whose fill is within ``within`` of no budget's (bisection
    between the largest sample's patches and the largest dynamic pack's). Returns the budget, both fills,
    their difference in points, and every candidate tried."""
    free = fill_with_budget(costs, width, None, buffer=buffer, seed=seed)
    lo = max(multiple, math.ceil(int(costs[:, 1].max(initial=1)) / multiple) * multiple)
    hi = max(lo, math.ceil(free["max_pack_patches"] / multiple) * multiple)
    tried = {}

    def ok(b: int) -> bool:
        tried[b] = fill_with_budget(costs, width, b, buffer=buffer, seed=seed)
        return free["fill"] - tried[b]["fill"] <= within

    while lo < hi:  # fill grows with the budget (up to packer noise): the smallest passing multiple
        mid = (lo + hi) // 2 // multiple * multiple
        if ok(mid):
            hi = mid
        else:
            lo = mid + multiple
    if hi not in tried:
        ok(hi)
    best = tried[hi]
    return {"budget": hi, "fill_dynamic": free["fill"], "fill_static": best["fill"],
            "mean_pack_patches": round(float(costs[:, 1].sum()) / max(best["packs"], 1), 1),
            "fill_delta_points": round(100 * (free["fill"] - best["fill"]), 3), "width": width, "buffer": buffer,
            "samples": int(len(costs)), "max_dynamic_pack_patches": free["max_pack_patches"],
            "tried": sorted(({"budget": b, "fill": r["fill"]} for b, r in tried.items()), key=lambda r: r["budget"])}


def main(path: str, out_dir: str | None = None, *, width: int = 8192, buffer: int = 64, preset: str = "qwen2.5-vl",
         tokenizer: Any = None, within: float = RECOMMEND_WITHIN) -> dict:
    """Read the costs of ``path``, print and return the recommended patch budget (``visual_budget.json`` in
    ``out_dir`` when given)."""
    import json
    from pathlib import Path

    costs = candidate_costs(path, width=width, preset=preset, tokenizer=tokenizer)
    result = recommend_patch_budget(costs, width, buffer=buffer, within=within)
    print(f"recommended max_patches_per_pack = {result['budget']} for width {width}, K={buffer}: fill "
          f"{result['fill_static']:.2%} vs {result['fill_dynamic']:.2%} without a patch budget "
          f"({result['fill_delta_points']:+.2f} points); a pack holds {result['mean_pack_patches']:,.0f} real patches "
          f"on average ({result['samples']} samples). Use it with static_visual=True.", flush=True)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "visual_budget.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":  # python -m energon_pack.bench.visual_budget DATA [WIDTH]
    import sys

    main(sys.argv[1], width=int(sys.argv[2]) if len(sys.argv) > 2 else 8192)
