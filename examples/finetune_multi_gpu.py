"""A data-parallel finetuning loop fed by the packer: one fixed-width THD row per micro-batch.

Launch one process per GPU (NCCL), or per CPU process for a smoke test (gloo):

    torchrun --nproc-per-node 2 examples/finetune_multi_gpu.py --data demo_data --steps 50
    torchrun --nproc-per-node 2 examples/finetune_multi_gpu.py --device cpu --steps 3 --width 2048 --dim 64

Each rank reads its own shard range through Energon (``WorkerConfig.default_worker_config``
takes rank and world size from ``torch.distributed``). The model is a small causal LM with a
Qwen-style vision projector: ``pixel_values`` patches are embedded, merged 2x2 and written
into the ``<|image_pad|>`` positions. Attention never crosses a segment boundary: the mask is
built from ``cu_seqlens_q_padded`` / ``cu_seqlens_q`` (a block-diagonal causal mask; swap in
a varlen kernel such as Transformer Engine's THD attention for real models). The loss is
summed over ``loss_mask`` and averaged over the supervised tokens of all ranks.

Reported per step: loss, real tokens, fill, and real (not padded) tokens/s over all ranks; at
the end, the packing stats of rank 0's workers and the share of time rank 0 waited for data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from energon_pack import PackingStatsTracker, thd_attention_mask

warnings.filterwarnings("ignore", message=".*pin_memory.*")


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, d // self.heads).permute(1, 2, 0, 3)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [heads, T, head_dim]
        x = x + self.proj(attn.transpose(0, 1).reshape(t, d))
        return x + self.mlp(self.norm2(x))


def rope_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of rotary embeddings for per-segment positions (they restart at 0 in every segment)."""
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class TinyVLM(nn.Module):
    def __init__(self, vocab: int, patch_dim: int, image_pad_id: int, dim: int = 256, layers: int = 4, heads: int = 4):
        super().__init__()
        self.image_pad_id, self.heads = image_pad_id, heads
        self.embed = nn.Embedding(vocab, dim)
        self.vision = nn.Linear(patch_dim, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, batch: dict) -> torch.Tensor:
        ids = batch["input_ids"][0]
        x = self.embed(ids)
        pixels = batch.get("pixel_values")
        if pixels is None:  # a text-only pack runs the projector on no rows, so DDP still sees its grads
            pixels = x.new_zeros(0, self.vision.in_features)
        patches = self.vision(pixels.to(x.dtype))
        merged = patches.view(-1, 4, patches.shape[-1]).mean(1)  # 2x2 merge groups are consecutive rows
        x = x.masked_scatter((ids == self.image_pad_id)[:, None], merged.to(x.dtype))
        mask = thd_attention_mask(batch["cu_seqlens_q_padded"], batch["cu_seqlens_q"], ids.numel()).to(x.device)
        rope = rope_tables(batch["position_ids"][0], x.shape[-1] // self.heads)
        for block in self.blocks:
            x = block(x, mask, rope)
        return self.head(self.norm(x))


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="demo_data")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--buffer", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--report", default=None, help="write a JSON summary here (rank 0)")
    args = p.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from energon_pack.cli import ensure_demo_data
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    if rank == 0:
        ensure_demo_data(args.data, 1200)
    dist.barrier()
    encoder = QwenVLPackingTaskEncoder(seq_length=args.width, pad_to_max_length=True)
    dataset = get_train_dataset(
        args.data, batch_size=1, shuffle_buffer_size=64, max_samples_per_sequence=64,
        worker_config=WorkerConfig.default_worker_config(num_workers=args.workers),
        task_encoder=encoder, packing_buffer_size=args.buffer,
    )
    loader = get_savable_loader(dataset)

    torch.manual_seed(0)
    tok = encoder.tokenizer
    inner = tok.inner
    vocab = inner.get_vocab_size(with_added_tokens=True) if hasattr(inner, "get_vocab_size") else len(inner)
    model = TinyVLM(vocab, encoder.preset.patch_dim, tok.special.image_pad, dim=args.dim, layers=args.layers).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    tracker = PackingStatsTracker()
    history = []
    tokens_total, start, data_wait = 0, None, 0.0
    batches = iter(loader)
    for step in range(args.steps):
        fetch = time.perf_counter()
        batch = next(batches)
        if start is not None:
            data_wait += time.perf_counter() - fetch  # time the GPU step waited for the loader
        tracker.update(batch["packing_stats"])
        batch = to_device(batch, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = ddp(batch)
        labels, loss_mask = batch["labels"][0], batch["loss_mask"][0]
        token_loss = F.cross_entropy(logits.float(), labels.clamp(min=0), reduction="none")
        local_sum = (token_loss * loss_mask).sum()
        counts = torch.stack([loss_mask.sum(), torch.tensor(float(batch["real_tokens"]), device=device),
                              local_sum.detach()])
        dist.all_reduce(counts)  # supervised tokens, real tokens and loss sum of all ranks
        loss = local_sum * world / counts[0].clamp(min=1)  # DDP averages gradients over ranks
        global_loss = (counts[2] / counts[0].clamp(min=1)).item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == 1:  # time from the second step on (the first includes loader start-up)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, tokens_total = time.perf_counter(), 0
        elif start is not None:
            tokens_total += int(counts[1])
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            rate = tokens_total / (time.perf_counter() - start) if start and tokens_total else float("nan")
            print(f"step {step:4d}  loss {global_loss:.3f}  real tokens/row {batch['real_tokens']:5d} "
                  f"({batch['real_tokens'] / args.width:.1%})  real tokens/s (all ranks) {rate:,.0f}", flush=True)
        history.append({"step": step, "loss": global_loss, "real_tokens": batch["real_tokens"]})
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start if start else float("nan")
    stats = tracker.total.summary()
    summary = {"world_size": world, "device": str(device), "steps": len(history), "width": args.width,
               "real_tokens_per_s_all_ranks": tokens_total / elapsed if elapsed and not math.isnan(elapsed) else None,
               "rank0_data_wait_fraction": data_wait / elapsed if elapsed and not math.isnan(elapsed) else None,
               "rank0_packing_stats": stats, "history": history}
    if rank == 0:
        print(f"rank 0 packing: {stats}; rank 0 waited for data {summary['rank0_data_wait_fraction']:.1%} of the time")
        if args.report:
            with open(args.report, "w") as f:
                json.dump(summary, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
