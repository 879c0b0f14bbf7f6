"""What N data-parallel ranks would wait for, from their real loaders: ``energon-pack bench --ranks N --accum M``.

Each of ``ranks`` ranks streams its own Energon loader (its rank of ``ranks``, ``workers`` worker processes, the
real encoder at ``seq_length``, K = ``buffer``), once with tokens-only packs and once with ``balance="compute"``.
A rank's step trains ``accum`` consecutive packs of its stream; the step of all ranks lasts as long as the
slowest rank's, under the step-cost model (:class:`~energon_pack.packing.step_cost.StepCostModel`, FLOP-derived
for ``cost_model``). Reported per mode: fill, real tokens per step (all ranks), the packs' cost spread and the
predicted DP efficiency: summed mean rank step over summed slowest rank step; and the recommendation
(:func:`recommend`): the mode that trains more real tokens per unit of the slowest rank's step cost. On CPU: no
model runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.packing.step_cost import StepCostModel, named_cost_model

MODES = ("tokens", "compute")


#: the batch keys of the patch grids
GRID_KEYS = ("image_grid_thw", "video_grid_thw")


def pack_segments(batch: dict) -> tuple[list[int], list[list[int]]]:
    """A packed THD row's segment lengths (from ``cu_seqlens_q``) and its images' and videos' (t, h, w) grids."""
    cu = batch["cu_seqlens_q"].tolist()
    grids = [g for key in GRID_KEYS if batch.get(key) is not None for g in batch[key].tolist()]
    return [b - a for a, b in zip(cu, cu[1:])], grids


def pack_step_cost(batch: dict, model: StepCostModel) -> float:
    """The step cost of one packed THD row under ``model``."""
    return model.pack_cost(*pack_segments(batch))


def rank_stream(
    path: str | Path, *, rank: int, ranks: int, balance: str, packs: int, encoder_kw: dict, buffer: int, workers: int
) -> tuple[list[float], list[int]]:
    """``packs`` packs of one rank's loader: their step costs and real tokens."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack.bench.loader_bench import _stop_workers
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    encoder = QwenVLPackingTaskEncoder(balance=balance, **encoder_kw)
    dataset = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=rank, world_size=ranks, num_workers=workers),
        task_encoder=encoder,
        packing_buffer_size=buffer,
        repeat=True,
    )
    loader = get_loader(dataset)
    iterator = iter(loader)
    costs, tokens = [], []
    for batch in iterator:
        costs.append(pack_step_cost(batch, encoder.step_cost_model))
        tokens.append(int(batch["real_tokens"]))
        if len(costs) == packs:
            break
    _stop_workers(iterator, loader)
    return costs, tokens


def simulate(
    path: str | Path,
    *,
    ranks: int,
    accum: int = 1,
    steps: int = 40,
    buffer: int = 64,
    workers: int = 2,
    seq_length: int = 8192,
    preset: str = "qwen2.5-vl",
    tokenizer: Any = None,
    cost_model: str | None = None,
) -> dict[str, Any]:
    """Both modes over ``ranks`` real loaders, ``steps`` steps of ``accum`` packs each (module doc)."""
    encoder_kw = dict(tokenizer=tokenizer, preset=preset, seq_length=seq_length, cost_model=cost_model)
    rows = []
    for balance in MODES:
        streams = [
            rank_stream(
                path,
                rank=r,
                ranks=ranks,
                balance=balance,
                packs=steps * accum,
                encoder_kw=encoder_kw,
                buffer=buffer,
                workers=workers,
            )
            for r in range(ranks)
        ]
        costs = np.asarray([s[0] for s in streams])  # [ranks, packs]
        tokens = np.asarray([s[1] for s in streams])
        per_step = costs.reshape(ranks, steps, accum).sum(-1)  # [ranks, steps]
        rows.append(
            {
                "mode": balance,
                "fill": float(tokens.sum() / (tokens.size * seq_length)),
                "tokens_per_step": float(tokens.sum() / steps),
                "cost_cv": float(costs.std() / costs.mean()),
                "dp_efficiency": float(per_step.mean(0).sum() / per_step.max(0).sum()),
                # what a step's wall time buys: real tokens per rank over the slowest rank's step cost
                "tokens_per_step_cost": float(tokens.sum() / ranks / per_step.max(0).sum()),
            }
        )
    model = named_cost_model(cost_model) if cost_model else None
    return {
        "data": str(path),
        "ranks": ranks,
        "accum": accum,
        "steps": steps,
        "buffer": buffer,
        "width": seq_length,
        "cost_model": cost_model or "the preset's default",
        "cost_source": None if model is None else model.source,
        "rows": rows,
        "recommendation": recommend(rows),
    }


def recommend(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mode whose steps train the most real tokens per unit of the slowest rank's step cost (fill, the cost of
    its tokens and the wait for the slowest rank in one number), and its gain over the other."""
    best, other = sorted(rows, key=lambda r: r["tokens_per_step_cost"], reverse=True)[:2]
    gain = best["tokens_per_step_cost"] / other["tokens_per_step_cost"] - 1
    return {"balance": best["mode"], "gain": gain, "over": other["mode"]}


def format_table(result: dict[str, Any]) -> str:
    head = (
        f"{result['ranks']} ranks x {result['steps']} steps of {result['accum']} pack(s), K={result['buffer']}, "
        f"width {result['width']}, cost model {result['cost_model']}"
    )
    lines = [head, f"{'mode':<9}{'fill':>9}{'tokens/step':>13}{'cost cv':>9}{'DP efficiency':>15}"]
    for r in result["rows"]:
        lines.append(
            f"{r['mode']:<9}{r['fill'] * 100:8.2f}%{r['tokens_per_step']:13.0f}{r['cost_cv'] * 100:8.2f}%"
            f"{r['dp_efficiency']:15.3f}"
        )
    rec = result["recommendation"]
    lines.append(
        f"recommended: balance={rec['balance']!r}: {rec['gain']:+.1%} real tokens per unit of step time "
        f"over {rec['over']!r} (fill, token cost and the wait for the slowest rank)"
    )
    return "\n".join(lines)
