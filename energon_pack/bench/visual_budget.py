"""The patch budget of static packs, chosen from the data: the smallest ``max_patches_per_pack`` whose fill
stays within half a point of the packs without one (``static_visual=True`` pads every pack to it).

The samples' costs (aligned tokens, vision patches) are read once through the task encoder's own
``preencode_sample`` (image headers only, no pixels); the packer is then replayed on them for each candidate
budget, as the loader runs it (carry mode, ``packing_buffer_size`` K, seeded).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from energon_pack.packing import OnlinePacker

from .outputs import RunFiles

#: a recommended budget keeps fill within this of the packs without a patch budget
RECOMMEND_WITHIN = 0.005

__all__ = ["RECOMMEND_WITHIN", "candidate_costs", "fill_with_budget", "recommend_patch_budget"]


#: the reader's patch budget: above any sample's patches (16,384 visual tokens = 65,536 patches, the chat limit), and
#: within the static packs' memory check (its packs are never built)
READ_ALL_PATCHES = 1 << 17


def candidate_costs(
    path: str,
    *,
    width: int,
    preset: Any = "qwen2.5-vl",
    tokenizer: Any = None,
    limit: int | None = None,
    **packing: Any,
) -> np.ndarray:
    """int64 (n, 3): each sample's (aligned tokens, patches, frames) as the encoder's ``preencode_sample``
    costs it (frames: one per image, the temporal grid per video); skipped samples are left out.
    ``packing``: other :class:`PackingConfig` knobs (cp, tp, ...)."""
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

    encoder = CostReader(
        tokenizer=tokenizer,
        preset=preset,
        seq_length=width,
        max_patches_per_pack=READ_ALL_PATCHES,
        static_visual=True,
        max_vision_frames=READ_ALL_PATCHES,
        **packing,
    )
    dataset = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=encoder,
        repeat=False,
    )
    rows: list[tuple[int, ...]] = []
    for batch in get_loader(dataset):
        rows.extend(batch)
        if limit is not None and len(rows) >= limit:
            break
    return np.asarray(rows[:limit], dtype=np.int64).reshape(-1, 3)


#: the budgets replayed: (name, column of the cost matrix [tokens, patches, segments, frames])
_BUDGETS = (("max_patches_per_pack", 1), ("max_segments", 2), ("max_vision_frames", 3))


def fill_with_budget(
    costs: np.ndarray,
    width: int,
    budget: int | None = None,
    *,
    segments: int | None = None,
    frames: int | None = None,
    buffer: int = 64,
    seed: int = 0,
) -> dict:
    """Fill (real tokens / slots), packs, skips and the fullest pack's patches / segments / frames of the
    carry packer replayed on ``costs`` (:func:`candidate_costs`) with the budgets given (None: no budget)."""
    full = np.column_stack([costs[:, 0], costs[:, 1], np.ones(len(costs), dtype=np.int64), costs[:, 2]])
    limits = dict(zip(("max_patches_per_pack", "max_segments", "max_vision_frames"), (budget, segments, frames)))
    dims = [0] + [col for name, col in _BUDGETS if limits[name] is not None]
    packer = OnlinePacker((width, *(v for v in limits.values() if v is not None)), max_buffered=buffer, seed=seed)
    most = np.zeros(4, dtype=np.int64)

    def done(groups: list) -> None:
        for g in groups:
            np.maximum(most, full[list(g)].sum(0), out=most)

    for i, row in enumerate(full[:, dims].tolist()):
        done(packer.push(i, tuple(row)))
    done(packer.flush())
    return {
        "fill": packer.stats.fill,
        "packs": packer.stats.packs,
        "skipped": packer.stats.skipped,
        "max_pack_patches": int(most[1]),
        "max_pack_segments": int(most[2]),
        "max_pack_frames": int(most[3]),
    }


def _smallest(lo: int, hi: int, step: int, ok: Any) -> int:
    """The smallest multiple of ``step`` in [lo, hi] that passes ``ok`` (bisection; ``hi`` is assumed to)."""
    while lo < hi:
        mid = (lo + hi) // 2 // step * step
        if mid < lo:
            mid = lo
        if ok(mid):
            hi = mid
        else:
            lo = mid + step
    return hi


def recommend_patch_budget(
    costs: np.ndarray,
    width: int,
    *,
    buffer: int = 64,
    within: float = RECOMMEND_WITHIN,
    multiple: int = 256,
    seed: int = 0,
) -> dict:
    """The budgets of static packs, each the smallest whose fill stays within ``within`` of packs with no
    budget but tokens: ``max_patches_per_pack`` (a multiple of ``multiple``), then with it ``max_segments``
    (static LLM cu_seqlens), then ``max_vision_frames`` (the vision tower's full-attention cu_seqlens).
    Returns them, both fills, their difference in points and the mean real patches per pack."""
    kw = dict(buffer=buffer, seed=seed)
    free = fill_with_budget(costs, width, **kw)
    chosen: dict[str, int | None] = {"budget": None, "segments": None, "frames": None}

    def ok(name: str) -> Any:
        def test(value: int) -> bool:
            return free["fill"] - fill_with_budget(costs, width, **{**chosen, name: value}, **kw)["fill"] <= within

        return test

    lo = max(multiple, -(-int(costs[:, 1].max(initial=1)) // multiple) * multiple)
    chosen["budget"] = _smallest(
        lo, max(lo, -(-free["max_pack_patches"] // multiple) * multiple), multiple, ok("budget")
    )
    top = fill_with_budget(costs, width, chosen["budget"], **kw)
    chosen["segments"] = _smallest(1, top["max_pack_segments"], 1, ok("segments"))
    top = fill_with_budget(costs, width, chosen["budget"], segments=chosen["segments"], **kw)
    chosen["frames"] = _smallest(
        max(1, int(costs[:, 2].max(initial=1))), max(1, top["max_pack_frames"]), 1, ok("frames")
    )
    best = fill_with_budget(costs, width, **chosen, **kw)
    return {
        "budget": chosen["budget"],
        "max_segments": chosen["segments"],
        "max_vision_frames": chosen["frames"],
        "fill_dynamic": free["fill"],
        "fill_static": best["fill"],
        "fill_delta_points": round(100 * (free["fill"] - best["fill"]), 3),
        "mean_pack_patches": round(float(costs[:, 1].sum()) / max(best["packs"], 1), 1),
        "width": width,
        "buffer": buffer,
        "samples": int(len(costs)),
        "max_dynamic_pack_patches": free["max_pack_patches"],
        "skipped": best["skipped"],
    }


def main(
    path: str,
    out_dir: str | None = None,
    *,
    width: int = 8192,
    buffer: int = 64,
    preset: str = "qwen2.5-vl",
    tokenizer: Any = None,
    within: float = RECOMMEND_WITHIN,
) -> dict:
    """Read the costs of ``path``, print and return the recommended patch budget (``visual_budget.json`` in
    ``out_dir`` when given)."""
    costs = candidate_costs(path, width=width, preset=preset, tokenizer=tokenizer)
    result = recommend_patch_budget(costs, width, buffer=buffer, within=within)
    print(
        f"recommended max_patches_per_pack = {result['budget']}, max_segments = {result['max_segments']}, "
        f"max_vision_frames = {result['max_vision_frames']} for width {width}, K={buffer}: fill "
        f"{result['fill_static']:.2%} vs {result['fill_dynamic']:.2%} without a patch budget "
        f"({result['fill_delta_points']:+.2f} points); a pack holds {result['mean_pack_patches']:,.0f} real patches "
        f"on average ({result['samples']} samples). Use it with static_visual=True.",
        flush=True,
    )
    if out_dir is not None:
        files = RunFiles(out_dir, ["visual_budget.json"])
        files.write_json("visual_budget.json", result)
        print(files.announce())
    return result


if __name__ == "__main__":  # python -m energon_pack.bench.visual_budget DATA [WIDTH]
    import sys

    main(sys.argv[1], width=int(sys.argv[2]) if len(sys.argv) > 2 else 8192)
