"""Train a tiny random Qwen-VL (Hugging Face transformers) on packs the real Energon loader streams, on CPU.

    python examples/train_hf.py [--data DIR] [--preset qwen2-vl|qwen2.5-vl|qwen3-vl] [--steps N] \\
        [--seq-length W] [--device cpu|cuda]

The model is a transformers ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` /
``Qwen3VLForConditionalGeneration`` built from its config classes with tiny layers (2 decoder layers of width 64, a
2-block vision tower) and randomly initialised: nothing is downloaded. Its embedding and LM head have the real
models' 151,936 rows, because the packs are tokenised with the preset's real tokenizer (built offline). Without
``--data`` it trains on ``demo_data/`` (written first if missing, as ``energon-pack demo`` does).

Each step is the library's HF path: ``prepare_model`` once (our varlen attention: per-segment SDPA on CPU, flash
``varlen_attn`` on CUDA in bf16), then ``packed_hidden_states`` (the forward without the LM head) and
``packed_loss_from_hidden`` (the cross entropy on our pre-shifted labels, chunked over the supervised tokens), so
neither a ``T x T`` mask nor the ``T x 151,936`` logits exist: at width 8192 a step stays well under 4 GB.
Prints the loss per step and, at the end, the process's peak RSS.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_multi_gpu  # noqa: E402  (the tiny model is that example's --size tiny)
from energon_pack.integrations.manual_gc import ManualGC  # noqa: E402

PRESETS = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")


def tiny_model(preset: Any, tokenizer: Any, seed: int = 0) -> Any:
    """A tiny randomly initialised HF model of ``preset``'s version (fp32, train mode), ids from ``tokenizer``:
    ``examples/finetune_multi_gpu.py``'s ``--size tiny`` (2 layers of width 64, 2-layer vision tower), with the
    real models' 151,936-row vocabulary."""
    from energon_pack import qwen_vocab_version

    if qwen_vocab_version(tokenizer) is None:
        raise SystemExit("train_hf.py needs a real Qwen-VL tokenizer (its ids index the 151,936-row vocabulary)")
    return finetune_multi_gpu.build_model(preset.name, "tiny", tokenizer, seed=seed)


def make_loader(data: str | Path, preset: Any, tokenizer: Any, seq_length: int) -> Any:
    """The Energon loader of packed rows (micro-batch size 1) built with our task encoder; in this process."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack import PackingConfig, QwenVLPackingTaskEncoder

    encoder = QwenVLPackingTaskEncoder(tokenizer=tokenizer, preset=preset, config=PackingConfig(seq_length=seq_length))
    dataset = get_train_dataset(
        data,
        batch_size=1,
        shuffle_buffer_size=64,
        max_samples_per_sequence=64,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=encoder,
        packing_buffer_size=64,
    )
    return get_loader(dataset)


def peak_rss_gb() -> float:
    """This process's peak resident set size (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="a prepared Energon dataset (default: demo_data/, written if missing)")
    p.add_argument("--preset", default="qwen2.5-vl", choices=PRESETS, help="the Qwen-VL version (model and packs)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq-length", type=int, default=8192, help="the pack width W (tokens per packed row)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--manual-gc",
        type=int,
        default=1,
        metavar="N",
        help="Python's garbage collector off, one collection after every N-th step, never inside one "
        "(energon_pack.integrations.manual_gc); 0: Python's own thresholds",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[float]:
    """Train for ``--steps`` steps; returns the losses (mean cross entropy per supervised token)."""
    args = parse_args(argv)
    from energon_pack import (
        get_preset,
        load_tokenizer,
        normalize_by_global_tokens,
        packed_hidden_states,
        packed_loss_from_hidden,
        prepare_model,
    )
    from energon_pack.cli.common import DEMO_DIR, demo_dataset

    data = args.data or demo_dataset(DEMO_DIR, 1200)
    preset = get_preset(args.preset)
    tokenizer = load_tokenizer(args.preset)  # the model's real tokenizer, built offline
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = prepare_model(tiny_model(preset, tokenizer).to(device=device, dtype=dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.preset}: {params / 1e6:.1f}M parameters (vocabulary {model.config.text_config.vocab_size:,}), "
        f"{dtype}, {device}, width {args.seq_length}, data {data}",
        flush=True,
    )
    losses: list[float] = []
    batches = iter(make_loader(data, preset, tokenizer, args.seq_length))
    collector = ManualGC(args.manual_gc).start() if args.manual_gc else None
    for step in range(args.steps):
        t0 = time.perf_counter()
        batch = next(batches)
        t1, cpu1 = time.perf_counter(), time.process_time()
        hidden = packed_hidden_states(model, batch)  # (1, T, 64): the forward without the LM head
        loss_sum, n_tokens = packed_loss_from_hidden(hidden, model.lm_head, batch)  # labels are pre-shifted
        loss = normalize_by_global_tokens(loss_sum, n_tokens)  # / supervised tokens (of all ranks under DDP)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            raise SystemExit(f"step {step}: the loss is {losses[-1]}")
        print(
            f"step {step}  loss {losses[-1]:.4f}  tokens {int(batch['real_tokens'])}  "
            f"supervised {int(n_tokens)}  segments {int(batch['num_segments'])}  "
            f"data {t1 - t0:.2f} s  train {time.perf_counter() - t1:.2f} s (CPU {time.process_time() - cpu1:.2f} s)",
            flush=True,
        )
        if collector is not None:
            collector.step()  # between steps: a collection never lands inside one
    if collector is not None:
        collector.stop()
    print(f"peak RSS {peak_rss_gb():.2f} GB", flush=True)
    return losses


if __name__ == "__main__":
    main()
