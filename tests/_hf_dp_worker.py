"""One rank of tests/integrations/test_hf_trainer_dp.py, run by ``torchrun --nproc_per_node 2`` (gloo, CPU).

argv: OUT SHARDS JSONL. Trains a tiny text-only Qwen2 through ``transformers.Trainer`` twice: one epoch of the GPT-SFT
road (TokenBudgetBatchSampler(num_replicas=2, rank)) and 3 steps of the Energon road (WorkerConfig rank and world
size from torch.distributed). Writes ``rank<r>.json`` (the ``__keys__`` trained, the Energon packs the rank's own
loader reads) and, on rank 0, the first SFT step's gradients (``grads.pt``).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from megatron.energon import WorkerConfig

from _hf_trainer_helpers import Grads, Recording, energon_loader, sft_loader, tiny_text_model, trainer_args
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import load_demo_tokenizer


def _train(out, dataset, steps=None, **kw):
    model = H.prepare_model(tiny_text_model(load_demo_tokenizer()).train())
    collator, grads = Recording(model), Grads()
    args = trainer_args(out, max_steps=steps or -1, num_train_epochs=1, ddp_backend="gloo", **kw)
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        compute_loss_func=H.packed_trainer_loss,
        callbacks=[grads, H.PackedDataCallback(dataset)],
    )
    trainer.train()
    return collator.keys, grads.grads


def main(out, shards, jsonl):
    out = Path(out)
    # the arguments set up the gloo process group (Accelerate), before the loaders read rank and world size
    trainer_args(out / "probe", ddp_backend="gloo").device
    rank, world = dist.get_rank(), dist.get_world_size()
    loader, _ = sft_loader(jsonl, num_replicas=world, rank=rank)
    sft_keys, grads = _train(out / "sft", H.PackedIterableDataset(loader))
    if rank == 0:
        torch.save(grads, out / "grads.pt")

    def energon():
        wc = WorkerConfig(rank=rank, world_size=world, num_workers=0, seed_offset=3)
        return energon_loader(shards, "qwen2.5-vl", worker_config=wc, repeat=False)

    direct = [list(p["__keys__"]) for p in energon()]
    energon_keys, _ = _train(out / "energon", H.PackedIterableDataset(energon()), steps=3)
    (out / f"rank{rank}.json").write_text(
        json.dumps({"sft": sft_keys, "energon": energon_keys, "energon_direct": direct, "world": world})
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(*sys.argv[1:])
