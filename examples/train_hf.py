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
import inspect
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

PRESETS = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")
#: tiny vision towers per version (the text model is the same for all: 2 layers, width 64, 4 heads / 2 KV heads)
_VISION = {
    "qwen2-vl": dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=64),
    "qwen2.5-vl": dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, fullatt_block_indexes=[1]
    ),
    "qwen3-vl": dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        num_position_embeddings=64,
        deepstack_visual_indexes=[0],
    ),
}


def tiny_model(preset: Any, tokenizer: Any, seed: int = 0) -> Any:
    """A tiny randomly initialised HF model of ``preset``'s version (fp32, train mode), ids from ``tokenizer``.

    The vocabulary is the real models' (``QWEN_VL_VOCAB_ROWS``) for a real Qwen-VL tokenizer; M-RoPE settings in
    the form the installed transformers takes (``rope_parameters`` from 5.0, ``rope_scaling`` in 4.57)."""
    import transformers as tf

    from energon_pack import QWEN_VL_VOCAB_ROWS, qwen_vocab_version

    if qwen_vocab_version(tokenizer) is None:
        raise SystemExit("train_hf.py needs a real Qwen-VL tokenizer (its ids index the 151,936-row vocabulary)")
    name = preset.name
    config_cls, text_cls, model_cls = {
        "qwen2-vl": (tf.Qwen2VLConfig, tf.Qwen2VLTextConfig, tf.Qwen2VLForConditionalGeneration),
        "qwen2.5-vl": (tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLTextConfig, tf.Qwen2_5_VLForConditionalGeneration),
        "qwen3-vl": (tf.Qwen3VLConfig, tf.Qwen3VLTextConfig, tf.Qwen3VLForConditionalGeneration),
    }[name]
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3]}
    if "rope_parameters" in inspect.signature(text_cls.__init__).parameters:
        rope_kwargs: dict[str, Any] = {"rope_parameters": {**rope, "rope_theta": 10000.0}}
    else:
        rope_kwargs = {"rope_theta": 10000.0, "rope_scaling": rope}
    sp = tokenizer.special
    text = dict(
        vocab_size=QWEN_VL_VOCAB_ROWS,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=32768,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=sp.im_end,
        pad_token_id=sp.pad,
        attention_dropout=0.0,
        **rope_kwargs,
    )
    vision = dict(
        _VISION[name],
        patch_size=preset.patch_size,
        temporal_patch_size=preset.temporal_patch_size,
        spatial_merge_size=preset.merge_size,
        in_channels=3,
        initializer_range=0.1,
    )
    if name == "qwen2.5-vl":
        vision.update(window_size=112, tokens_per_second=int(preset.tokens_per_second))
    config = config_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=sp.image_pad,
        video_token_id=sp.video_pad,
        vision_start_token_id=sp.vision_start,
        vision_end_token_id=sp.vision_end,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return model_cls(config).float().train()


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
    print(f"peak RSS {peak_rss_gb():.2f} GB", flush=True)
    return losses


if __name__ == "__main__":
    main()
