"""Data-parallel finetuning of a real Hugging Face Qwen-VL model on packed THD rows (one row per micro-batch).

The model is a transformers ``Qwen2_5_VLForConditionalGeneration`` (default; ``--model qwen2-vl |
qwen2.5-vl | qwen3-vl``) built from a config and randomly initialised, never downloaded:
``--size tiny`` (CPU tests) or ``--size 3b`` (Qwen2.5-VL-3B shape: vision 32 x 1280, LLM 36 x 2048,
16 heads / 2 KV heads, MLP 11008; Qwen3-VL uses the 4B shape). The tokenizer is the model's real one
(``--tokenizer``, default the ``--model``'s: Qwen's 151,643-token BPE, built offline) and the
embedding/LM head has the real models' 151,936 rows; ``--tokenizer demo`` (tests only) gives a
vocabulary of the demo tokenizer's size rounded up to 64. Special ids come from the tokenizer.
bf16 weights on CUDA, fp32 on CPU; AdamW.

One process per GPU (NCCL) or per CPU process (gloo):

    torchrun --nproc-per-node 2 examples/finetune_multi_gpu.py --data demo_data --steps 50 --size 3b
    torchrun --nproc-per-node 2 examples/finetune_multi_gpu.py --device cpu --size tiny --steps 3 --width 1024

Several nodes (the same command on every node; c10d rendezvous on the first node's address):

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank R --rdzv-backend c10d --rdzv-id job1 \\
        --rdzv-endpoint HOST:29500 examples/finetune_multi_gpu.py --data /shared/data --size 3b
    # SLURM, one torchrun per node:
    srun --nodes 2 --ntasks-per-node 1 bash -c 'torchrun --nnodes $SLURM_NNODES --nproc-per-node 8 \\
        --node-rank $SLURM_NODEID --rdzv-backend c10d --rdzv-id $SLURM_JOB_ID \\
        --rdzv-endpoint $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):29500 \\
        examples/finetune_multi_gpu.py --data /shared/data --size 3b'

Every rank builds its own Energon savable loader (``WorkerConfig.default_worker_config`` reads rank
and world size from ``torch.distributed``, so ranks read disjoint shard ranges) with
``QwenVLPackingTaskEncoder``. The model: ``prepare_model`` (our varlen attention, torch's flash ``varlen_attn``
on CUDA in bf16 for the LLM and the vision tower, SDPA on each cu_seqlens segment on CPU; the hooks static packs
need). Loss:
``packed_loss`` summed over ``loss_mask``, divided by the supervised tokens of all ranks
(``normalize_by_global_tokens``, x world size because DDP averages gradients).

``--save-at K --ckpt DIR`` saves the model, the optimizer and every rank's loader state
(``loader.save_state_rank()``) after K steps; ``--resume DIR`` restores all three and continues with
step K: the losses equal those of an uninterrupted run (seeded init, no dropout, same packs).

``--static`` packs have one shape (fixed width, static cu_seqlens, patch rows padded to the patch budget,
budgets recommended from the data unless ``--patch-budget``): ``--compile-model`` (whole forward,
``dynamic=False``) then compiles in the first step only, ``--cuda-graphs`` / ``--graph-vision`` add CUDA
graphs (whole model / vision tower); ``--grad-checkpoint`` recomputes activations (long widths).

Per step: loss, real tokens, step time and the time spent waiting for the loader. Rank 0 writes
``--report JSON``: losses per step, real tokens/s (all ranks), fill, data-wait share, and the
``__keys__`` each rank trained on.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from energon_pack import hf_forward_kwargs, normalize_by_global_tokens, packed_loss
from energon_pack import prepare_model as prepare_hf_model
from energon_pack.integrations.manual_gc import ManualGC

warnings.filterwarnings("ignore", message=".*pin_memory.*")

MODELS = {"qwen2-vl": "qwen2_vl", "qwen2.5-vl": "qwen2_5_vl", "qwen3-vl": "qwen3_vl"}
SIZES = ("tiny", "3b")


# --------------------------------------------------------------------------------- model
def vocab_size(tokenizer: Any, multiple: int = 64) -> int:
    """Embedding rows: the real Qwen-VL models' 151,936 for their tokenizer (Qwen2-VL-2B, Qwen2.5-VL-3B,
    Qwen3-VL-4B); for any other tokenizer its size rounded up to ``multiple``."""
    from energon_pack import QWEN_VL_VOCAB_ROWS, qwen_vocab_version

    inner = tokenizer.inner
    n = inner.get_vocab_size(with_added_tokens=True) if hasattr(inner, "get_vocab_size") else len(inner)
    if qwen_vocab_version(tokenizer) is not None:
        assert n <= QWEN_VL_VOCAB_ROWS, n
        return QWEN_VL_VOCAB_ROWS
    return int(math.ceil(n / multiple) * multiple)


def rope_settings(name: str, theta: float, mrope_section: list[int]) -> dict[str, Any]:
    """The text config's M-RoPE settings in the form the installed transformers takes: ``rope_parameters`` from
    5.0, ``rope_theta`` with ``rope_scaling`` in 4.57 (read off the text config class's signature)."""
    import transformers as tf

    text_config_cls = {
        "qwen2-vl": tf.Qwen2VLTextConfig,
        "qwen2.5-vl": tf.Qwen2_5_VLTextConfig,
        "qwen3-vl": tf.Qwen3VLTextConfig,
    }[name]
    rope = {"rope_type": "default", "mrope_section": list(mrope_section)}
    if "rope_parameters" in inspect.signature(text_config_cls.__init__).parameters:
        return {"rope_parameters": {**rope, "rope_theta": theta}}
    return {"rope_theta": theta, "rope_scaling": rope}


def model_config(name: str, size: str, tokenizer: Any) -> Any:
    """A transformers config of the Qwen-VL version ``name`` in shape ``size``; ids from ``tokenizer``."""
    import transformers as tf

    from energon_pack import get_preset

    if name not in MODELS:
        raise SystemExit(f"--model must be one of {sorted(MODELS)}")
    if size not in SIZES:
        raise SystemExit(f"--size must be one of {SIZES}")
    preset = get_preset(name)
    sp = tokenizer.special
    ids = dict(
        image_token_id=sp.image_pad,
        video_token_id=sp.video_pad,
        vision_start_token_id=sp.vision_start,
        vision_end_token_id=sp.vision_end,
    )
    vision = dict(
        patch_size=preset.patch_size,
        temporal_patch_size=preset.temporal_patch_size,
        spatial_merge_size=preset.merge_size,
        in_channels=3,
    )
    tiny = size == "tiny"
    if name == "qwen3-vl":  # Qwen3-VL-4B shape
        hidden, layers, heads, kv, inter, head_dim = (64, 2, 4, 2, 128, 16) if tiny else (2560, 36, 32, 8, 9728, 128)
        section = [2, 3, 3] if tiny else [24, 20, 20]
    else:  # Qwen2-VL / Qwen2.5-VL 3B LLM shape
        hidden, layers, heads, kv, inter = (64, 2, 4, 2, 128) if tiny else (2048, 36, 16, 2, 11008)
        head_dim = hidden // heads
        section = [2, 3, 3] if tiny else [16, 24, 24]
    text = dict(
        vocab_size=vocab_size(tokenizer),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        bos_token_id=None,
        eos_token_id=sp.im_end,
        pad_token_id=sp.pad,
        attention_dropout=0.0,
        **rope_settings(name, 10000.0 if tiny else 1000000.0, section),
    )
    if tiny:
        text["initializer_range"] = vision["initializer_range"] = 0.1
    if name == "qwen2-vl":
        v = (
            dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2)
            if tiny
            else dict(depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4)
        )
        return tf.Qwen2VLConfig(
            text_config=text, vision_config=dict(vision, hidden_size=hidden, **v), tie_word_embeddings=not tiny, **ids
        )
    if name == "qwen2.5-vl":
        v = (
            dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, fullatt_block_indexes=[1])
            if tiny
            else dict(
                depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, fullatt_block_indexes=[7, 15, 23, 31]
            )
        )
        return tf.Qwen2_5_VLConfig(
            text_config=text,
            vision_config=dict(
                vision, out_hidden_size=hidden, window_size=112, tokens_per_second=int(preset.tokens_per_second), **v
            ),
            tie_word_embeddings=not tiny,
            **ids,
        )
    v = (
        dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        )
        if tiny
        else dict(
            depth=24,
            hidden_size=1024,
            intermediate_size=4096,
            num_heads=16,
            num_position_embeddings=2304,
            deepstack_visual_indexes=[5, 11, 17],
        )
    )
    return tf.Qwen3VLConfig(
        text_config=dict(text, head_dim=head_dim),
        vision_config=dict(vision, out_hidden_size=hidden, **v),
        tie_word_embeddings=not tiny,
        **ids,
    )


def build_model(
    name: str,
    size: str,
    tokenizer: Any,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Any:
    """Randomly initialised HF Qwen-VL model (seeded: every rank builds the same weights), in train mode.

    Stock attention (sdpa); :func:`prepare_model` switches it to our varlen attention. Built
    directly on ``device`` in ``dtype`` (a 3B model initialises in seconds on a GPU).
    """
    import transformers as tf

    cfg = model_config(name, size, tokenizer)
    cls = {
        "qwen2-vl": tf.Qwen2VLForConditionalGeneration,
        "qwen2.5-vl": tf.Qwen2_5_VLForConditionalGeneration,
        "qwen3-vl": tf.Qwen3VLForConditionalGeneration,
    }[name]
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls._from_config(cfg, dtype=dtype)
    assert model.config.model_type == MODELS[name]
    return model.to(device=device, dtype=dtype).train()


def prepare_model(model: Any) -> Any:
    """The library's ``prepare_model`` (our varlen attention for the LLM and the vision tower, flash ``varlen_attn``
    on CUDA bf16; the vision tower guards and static-visual hooks), and the vision patch embedding as one matmul
    (:func:`linear_patch_embed`)."""
    prepare_hf_model(model)
    linear_patch_embed(model)
    return model


def _linear_patch_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    proj = self.proj
    weight = proj.weight.reshape(proj.weight.shape[0], -1)  # (embed, C*T*P*P): the conv kernel, flattened
    x = hidden_states.reshape(-1, weight.shape[1]).to(weight.dtype)
    return torch.nn.functional.linear(x, weight, proj.bias).view(-1, self.embed_dim)


def linear_patch_embed(model: Any) -> int:
    """Run the Qwen-VL vision patch embedding (``Conv3d`` with stride == kernel, no padding) as one
    ``F.linear`` on the same weight: the same function (each patch is one kernel-sized block, flattened
    in the kernel's (C, T, P, P) order), the same parameters and state dict, but a plain GEMM instead of
    cuDNN's 3-D convolution (slow in bf16 on several torch/cuDNN versions; transformers' own
    "patch embedding fusion" does the same for loaded checkpoints). Returns the modules changed."""
    import types

    changed = 0
    for module in model.modules():
        proj = getattr(module, "proj", None)
        if (
            type(module).__name__.endswith("PatchEmbed")
            and isinstance(proj, torch.nn.Conv3d)
            and hasattr(module, "embed_dim")
            and proj.stride == proj.kernel_size
            and proj.padding == (0, 0, 0)
            and proj.dilation == (1, 1, 1)
            and proj.groups == 1
        ):
            module.forward = types.MethodType(_linear_patch_forward, module)
            changed += 1
    return changed


def compile_elementwise(model: Any) -> list[str]:
    """``torch.compile`` (inductor, dynamic shapes) of the memory-bound pieces HF runs op by op: every
    RMSNorm and MLP module (LLM and vision tower; the MLP's matmuls stay cuBLAS, its activation and
    product fuse) and the rotary functions of the model's modeling module. Attention, embeddings,
    the vision merger and the loss stay eager. Returns what was compiled."""
    import importlib

    # One RMSNorm class serves the LLM (3-D input) and the vision tower (2-D), a padded batch adds
    # batch 4 vs 1: each is its own graph. Dynamo's default limit (8 per function) was hit on the
    # H200 run with the padded feed and later shapes then ran eager; allow more (each compiles once).
    import torch._dynamo

    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 64))
    done = []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls.endswith(("RMSNorm", "MLP", "Mlp")) and not name.endswith("merger.mlp"):
            module.compile(dynamic=True)
            done.append(cls)
    modeling = importlib.import_module(type(model).__module__)
    for fn in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_vision"):
        if callable(getattr(modeling, fn, None)) and not hasattr(getattr(modeling, fn), "_torchdynamo_orig_callable"):
            setattr(modeling, fn, torch.compile(getattr(modeling, fn), dynamic=True))
            done.append(fn)
    return sorted(set(done))


def make_optimizer(model: Any, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; on CUDA the fused kernel (one multi-tensor kernel per step instead of a dozen passes)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=device.type == "cuda")


def wrap_ddp(model: Any, device: torch.device, bucket_mb: float | None = None) -> Any:
    """DDP with gradients living in the all-reduce buckets (``gradient_as_bucket_view``: no copy in or
    out of the buckets, one gradient-sized buffer less); ``bucket_mb`` sets the bucket size (torch's
    default, 25 MB, when None)."""
    extra = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True, **extra
    )


def param_counts(model: Any) -> dict[str, int]:
    visual = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "vision": visual, "llm": total - visual}


def vision_params(model: Any) -> list[torch.nn.Parameter]:
    return [p for n, p in model.named_parameters() if ".visual." in f".{n}"]


def has_visual(batch: dict) -> bool:
    """Whether the vision tower runs on this pack (always for static packs: their rows are padded)."""
    return any(batch.get(k) is not None for k in ("pixel_values", "pixel_values_videos", "visual_pixel_values"))


def compile_model(model: Any, *, cuda_graphs: bool = False, backend: str = "inductor") -> Any:
    """``torch.compile`` of the whole model forward (static shapes: ``dynamic=False``; with static packs every
    pack has the shapes of the first, so nothing compiles after warm-up). ``cuda_graphs``: inductor's
    ``reduce-overhead`` mode (CUDA-graph trees over each compiled region, forward and backward)."""
    import torch._dynamo

    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 64))
    model.compile(dynamic=False, backend=backend, **({"mode": "reduce-overhead"} if cuda_graphs else {}))
    return model


def graph_vision(model: Any, backend: str = "inductor") -> None:
    """The vision tower alone under ``torch.compile`` (``dynamic=False``; on CUDA mode ``reduce-overhead``:
    CUDA graphs): with static packs its inputs have one shape, so it is captured once."""
    tower = getattr(model, "model", model).visual
    cuda = next(tower.parameters()).is_cuda
    tower.compile(
        dynamic=False, backend=backend, **({"mode": "reduce-overhead"} if cuda and backend == "inductor" else {})
    )


def compiled_graphs() -> int:
    """How many graphs torch.compile has built in this process so far (0 without compiling)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def grad_checkpoint(model: Any) -> None:
    """Activation checkpointing of every decoder layer and vision block (HF's own, non-reentrant)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def forward_loss(
    model: Any,
    batch: dict,
    *,
    runner: Any = None,
    device: Any = None,
    touch_vision: list | None = None,
    one_vision_call: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training loss of one packed row: ``(loss, loss_sum, local_count)``.

    ``runner`` is what is called (the DDP wrapper; ``model`` itself by default); the kwargs are
    built from the bare HF ``model`` (a DDP wrapper has no config). ``loss`` is normalised by
    the supervised tokens of all ranks (only this process's without torch.distributed).

    DDP needs a gradient for every parameter on every rank, but a pack without images or
    videos never runs the vision tower. ``touch_vision`` (the vision parameters) adds
    ``0 * sum(p)`` for such packs only: exact zero gradients, one cheap elementwise pass over the
    vision weights on the rare image-free pack, and nothing on all others. The alternative,
    ``find_unused_parameters=True``, walks the autograd graph after every forward, for all packs.

    ``one_vision_call=False`` runs HF's vision-tower call per kind (images, then videos) instead of one for both
    (:func:`~energon_pack.integrations.hf.hf_forward_kwargs`): the benchmarks' comparison.
    """
    device = device if device is not None else next(model.parameters()).device
    kwargs = hf_forward_kwargs(batch, model=model, device=device, one_vision_call=one_vision_call)
    out = (runner or model)(**kwargs)
    loss_sum, count = packed_loss(out.logits, batch)
    if touch_vision and not has_visual(batch):
        loss_sum = loss_sum + 0.0 * torch.stack([p.sum() for p in touch_vision]).sum().float()
    return normalize_by_global_tokens(loss_sum, count), loss_sum, count


# --------------------------------------------------------------------------------- data
def make_loader(
    data: str,
    *,
    width: int,
    preset: Any,
    buffer: int,
    workers: int,
    packing_mode: str = "carry",
    seed: int = 0,
    tokenizer: Any = None,
    static: dict | None = None,
    balance: str | None = None,
) -> tuple[Any, Any]:
    """One Energon savable loader for this rank (rank and world size from torch.distributed).

    ``tokenizer``: a name (``"qwen2.5-vl"``, ``"demo"``, ...), a path or an object; None: the preset's
    real tokenizer. ``static``: static packs (every tensor one shape: fixed width, static cu_seqlens, patch rows
    padded to the budget; ``static_visual``) with these budgets (:func:`static_budgets`); ``max_segments``
    defaults to the most samples a pack can hold. ``balance``: the carry packer's ``"tokens"`` or ``"compute"``
    (packs equal in step cost too, under the preset's FLOP cost model); None: the library's default."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from energon_pack import QwenVLPackingTaskEncoder, load_tokenizer

    kw = dict(
        tokenizer=load_tokenizer(tokenizer) if tokenizer else None,
        preset=preset,
        seq_length=width,
        pad_to_max_length=True,
        packing_mode=packing_mode,
        seed=seed,
        balance=balance,
    )
    if static:
        segments = static.get("max_segments") or QwenVLPackingTaskEncoder(**kw).max_possible_segments
        kw.update(
            pad_cu_seqlens=True,
            max_segments=segments,
            max_patches_per_pack=static["max_patches_per_pack"],
            max_vision_frames=static.get("max_vision_frames"),
            static_visual=True,
        )
    encoder = QwenVLPackingTaskEncoder(**kw)
    dataset = get_train_dataset(
        data,
        batch_size=1,
        shuffle_buffer_size=64,
        max_samples_per_sequence=64,
        worker_config=WorkerConfig.default_worker_config(num_workers=workers),
        task_encoder=encoder,
        packing_buffer_size=buffer,
    )
    return get_savable_loader(dataset), encoder


def vision_preset(name: str, size: str, max_pixels: int | None = None) -> Any:
    """The model's preset; tiny runs use small images (4-16 merged tokens each) unless ``max_pixels``."""
    from energon_pack import get_preset

    f2 = get_preset(name).factor ** 2
    if max_pixels is None and size == "tiny":
        max_pixels = 16 * f2
    if max_pixels is None:
        return get_preset(name)
    return get_preset(name, min_pixels=min(4 * f2, max_pixels), max_pixels=max_pixels)


# --------------------------------------------------------------------------------- distributed
def setup_distributed(device_name: str) -> tuple[torch.device, int, int]:
    device = torch.device(device_name)
    if "RANK" not in os.environ:  # plain `python`: one process, no torch.distributed
        return device, 0, 1
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return device, dist.get_rank(), dist.get_world_size()


def all_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def gather(obj: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(ckpt: Path, step: int, model: Any, opt: Any, loader: Any, rank: int) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    torch.save(loader.save_state_rank(), ckpt / f"loader_rank{rank}.pt")
    if rank == 0:  # DDP keeps model and optimizer identical on all ranks
        torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt / "train.pt")
    barrier()


# --------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="demo_data")
    p.add_argument("--model", default="qwen2.5-vl", choices=sorted(MODELS))
    p.add_argument("--size", default="3b", choices=SIZES)
    p.add_argument(
        "--tokenizer",
        default=None,
        help="qwen2-vl | qwen2.5-vl | qwen3-vl, a tokenizer.json or a local HF folder (default: the --model's "
        "real tokenizer, built offline); demo: the 773-token test tokenizer",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--buffer", type=int, default=64, help="packing_buffer_size")
    p.add_argument("--workers", type=int, default=2, help="loader workers per rank")
    p.add_argument("--max-pixels", type=int, default=None, help="image budget of the preset (tiny: 16 merged tokens)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-at", type=int, default=None, help="save after this many steps (needs --ckpt)")
    p.add_argument("--ckpt", default=None)
    p.add_argument("--resume", default=None, help="checkpoint folder written by --save-at")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--manual-gc",
        type=int,
        default=0,
        metavar="N",
        help="Python's garbage collector off, one collection after every N-th step (Megatron's --manual-gc): a "
        "collection inside a step stalls every data-parallel rank (docs/concepts/compute_balance.md); 0: Python's own",
    )
    p.add_argument("--report", default=None, help="rank 0 writes a JSON summary here")
    add_static_args(p)
    args = p.parse_args(argv)
    if args.save_at is not None and not args.ckpt:
        p.error("--save-at needs --ckpt")
    return args


def add_static_args(p: argparse.ArgumentParser) -> None:
    """``--static`` / ``--patch-budget`` / ``--grad-checkpoint`` / ``--compile-model`` / ``--cuda-graphs``."""
    p.add_argument(
        "--static",
        action="store_true",
        help="static packs: fixed width, static cu_seqlens, patch rows padded to --patch-budget (static_visual)",
    )
    p.add_argument(
        "--patch-budget",
        type=int,
        default=None,
        help="max_patches_per_pack of --static packs (default: recommended from the data, "
        "energon_pack.bench.visual_budget)",
    )
    p.add_argument(
        "--grad-checkpoint", action="store_true", help="activation checkpointing (LLM layers and vision blocks)"
    )
    p.add_argument("--compile-model", action="store_true", help="torch.compile the whole model forward (dynamic=False)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (aot_eager: CPU tests)")
    p.add_argument(
        "--cuda-graphs", action="store_true", help="with --compile-model: mode reduce-overhead (CUDA graphs)"
    )
    p.add_argument(
        "--graph-vision",
        action="store_true",
        help="--static: the vision tower alone compiled with mode reduce-overhead (CUDA graphs of its forward "
        "and backward), the rest eager",
    )


def static_budgets(args: argparse.Namespace, preset: Any, static: bool = False) -> dict | None:
    """The static packs' budgets (``--static`` or ``static``; None for dynamic packs): ``--patch-budget`` alone,
    or all three recommended from --data (energon_pack.bench.visual_budget: patches, segments, frames)."""
    if not (args.static or static):
        return None
    if args.patch_budget:
        return {"max_patches_per_pack": args.patch_budget}
    from energon_pack.bench.visual_budget import candidate_costs, recommend_patch_budget

    costs = candidate_costs(args.data, width=args.width, preset=preset, tokenizer=args.tokenizer)
    rec = recommend_patch_budget(costs, args.width, buffer=args.buffer, multiple=4 * preset.merge_size**2)
    return {
        "max_patches_per_pack": rec["budget"],
        "max_segments": rec["max_segments"],
        "max_vision_frames": rec["max_vision_frames"],
        "fill_delta_points": rec["fill_delta_points"],
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device, rank, world = setup_distributed(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    from energon_pack import PackingStatsTracker, make_demo_shards

    if rank == 0 and args.data == "demo_data" and not (Path(args.data) / ".nv-meta").is_dir():
        make_demo_shards(args.data, 1200)
    barrier()
    preset = vision_preset(args.model, args.size, args.max_pixels)
    budget = static_budgets(args, preset)
    loader, encoder = make_loader(
        args.data,
        width=args.width,
        preset=preset,
        buffer=args.buffer,
        workers=args.workers,
        seed=args.seed,
        tokenizer=args.tokenizer,
        static=budget,
    )
    model = prepare_model(
        build_model(args.model, args.size, encoder.tokenizer, device=device, dtype=dtype, seed=args.seed)
    )
    if args.grad_checkpoint:
        grad_checkpoint(model)
    if args.compile_model:
        compile_model(model, cuda_graphs=args.cuda_graphs, backend=args.compile_backend)
    elif args.graph_vision:
        graph_vision(model, backend=args.compile_backend)
    opt = make_optimizer(model, args.lr, device)
    start_step = 0
    if args.resume:
        ckpt = Path(args.resume)
        state = torch.load(ckpt / "train.pt", map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.restore_state_rank(torch.load(ckpt / f"loader_rank{rank}.pt", weights_only=False))
        start_step = state["step"]
    runner = wrap_ddp(model, device) if world > 1 else model
    touch = vision_params(model) if world > 1 and not budget else None  # static packs always run the tower
    counts = param_counts(model)
    if rank == 0:
        print(
            f"{args.model} ({args.size}): {counts['total'] / 1e6:,.1f}M parameters "
            f"(vision {counts['vision'] / 1e6:,.1f}M), {dtype}, world {world}, width {args.width}",
            flush=True,
        )

    tracker = PackingStatsTracker()
    history, keys = [], []
    batches = iter(loader)
    collector = ManualGC(args.manual_gc).start() if args.manual_gc else None
    for step in range(start_step, args.steps):
        t0 = time.perf_counter()
        graphs = compiled_graphs()
        batch = next(batches)
        wait = time.perf_counter() - t0
        tracker.update(batch["packing_stats"])
        keys.extend(batch["__keys__"])
        loss, loss_sum, count = forward_loss(model, batch, runner=runner, device=device, touch_vision=touch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        g_sum, g_count, g_real, g_wait = all_sum(
            [float(loss_sum.detach()), float(count), float(batch["real_tokens"]), wait], device
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_s = time.perf_counter() - t0
        entry = {
            "step": step,
            "loss": g_sum / max(g_count, 1),
            "real_tokens": int(g_real),
            "supervised_tokens": int(g_count),
            "step_s": step_s,
            "data_wait_s": wait,
            "graphs_compiled": compiled_graphs() - graphs,
        }
        history.append(entry)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(
                f"step {step:4d}  loss {entry['loss']:.6f}  real tokens {int(g_real):6d} (all ranks)  "
                f"step {step_s * 1e3:7.1f} ms  data wait {wait * 1e3:6.1f} ms",
                flush=True,
            )
        if args.save_at is not None and step + 1 == args.save_at:
            save_checkpoint(Path(args.ckpt), step + 1, model, opt, loader, rank)
        if collector is not None:
            collector.step()  # between steps, on every rank at the same step
    if collector is not None:
        collector.stop()
    timed = history[1:] if len(history) > 1 else history  # the first step includes loader and kernel start-up
    elapsed = sum(h["step_s"] for h in timed)
    waits = gather(sum(h["data_wait_s"] for h in timed))
    all_keys = gather(keys)
    stats = tracker.total.summary()
    summary = {
        "model": args.model,
        "size": args.size,
        "params": counts,
        "dtype": str(dtype),
        "world_size": world,
        "device": str(device),
        "width": args.width,
        "steps": len(history),
        "start_step": start_step,
        "losses": {str(h["step"]): h["loss"] for h in history},
        "real_tokens_per_s": sum(h["real_tokens"] for h in timed) / elapsed if elapsed else None,
        "fill": sum(h["real_tokens"] for h in history) / (len(history) * world * args.width) if history else None,
        "data_wait_share": max(waits) / elapsed if elapsed else None,
        "median_step_s": sorted(h["step_s"] for h in timed)[len(timed) // 2] if timed else None,
        "static_budgets": budget,
        "graphs_compiled_after_first_step": sum(h["graphs_compiled"] for h in history[1:]),
        "rank0_packing_stats": stats,
        "keys_per_rank": all_keys,
        "history": history,
    }
    if rank == 0:
        print(
            f"real tokens/s (all ranks) {summary['real_tokens_per_s'] or float('nan'):,.0f}  "
            f"fill {summary['fill']:.2%}  "
            f"data wait {summary['data_wait_share'] or 0:.1%} of the step time (worst rank)",
            flush=True,
        )
        if args.report:
            Path(args.report).write_text(json.dumps(summary, indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
