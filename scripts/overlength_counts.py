"""Skips and adjustments of each ``overlength`` policy on a converted dataset, costs only (no pixel is decoded):

    .venv/bin/python scripts/overlength_counts.py DATA [--widths 4096,2048] [--policies skip,fit,split]

Each (width, policy) runs the real Energon loader (2 workers, ``packing_buffer_size`` 64, the Qwen2.5-VL preset
and its real tokenizer) through the encoder's own pre-encode and packer; post-encode is replaced by the identity,
so the packs hold candidates (their costs) instead of pixels. One JSON line each: packs, delivered samples (split
pieces counted one by one), packs over the width (must be 0), ``skips`` and ``adjustments`` from the merged
``packing_stats``, fill.
"""

from __future__ import annotations

import argparse
import json
import time

from megatron.energon import WorkerConfig, get_loader, get_train_dataset, stateless

from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder


class CostOnlyEncoder(QwenVLPackingTaskEncoder):
    """The encoder with post-encode and batching replaced: a pack is its members' costs and the worker's stats."""

    @stateless
    def postencode_sample(self, sample):
        return sample

    @stateless
    def batch(self, samples):
        members = [m for s in samples for m in s.samples]
        return {"stats": samples[-1].packing_stats, "tokens": sum(m.cost[0] for m in members), "n": len(members)}


def run(path: str, width: int, policy: str) -> dict:
    encoder = CostOnlyEncoder(seq_length=width, overlength=policy)
    dataset = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        task_encoder=encoder,
        packing_buffer_size=64,
        repeat=False,
    )
    tracker, packs, over, delivered = PackingStatsTracker(), 0, 0, 0
    for batch in get_loader(dataset):
        tracker.update(batch["stats"])
        packs, delivered, over = packs + 1, delivered + batch["n"], over + (batch["tokens"] > width)
    total = tracker.total
    return {
        "width": width,
        "policy": policy,
        "packs": packs,
        "delivered": delivered,
        "packs_over_width": over,
        "skips": dict(total.skips),
        "adjustments": dict(total.adjustments),
        "fill": round(total.fill, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--widths", default="4096,2048")
    parser.add_argument("--policies", default="skip,fit,split")
    args = parser.parse_args()
    for width in map(int, args.widths.split(",")):
        for policy in args.policies.split(","):
            start = time.perf_counter()
            row = run(args.data, width, policy)
            print(json.dumps({**row, "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
