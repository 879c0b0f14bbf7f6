"""Shared pieces of the Trainer / SFTTrainer / DP tests: shards and JSONL written here, the real Energon loader and
the GPT-SFT road over them, tiny models (Qwen-VL from _hf_helpers, a text-only Qwen2), our own step to compare with.
"""

import io
import json

import numpy as np
import torch
import transformers
import webdataset as wds
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from PIL import Image

from _hf_helpers import small_preset, tiny_text_kwargs
from energon_pack.energon import prepare_webdataset
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

WORDS = "pack row token image answer model sample width shard loader".split()


def _jpeg(w, h, seed):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def write_shards(root, n=24, per_shard=8, *, images=True):
    """``n`` samples ``s00``..: every third with an image (``images``), answers of 2-12 words; an Energon dataset."""
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(root / "tr-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            image = images and i % 3 == 0
            user = ("<image>\n" if image else "") + f"question {i}?"
            answer = " ".join(rng.choice(WORDS, size=2 + i % 11))
            conv = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            fields = {"__key__": f"s{i:02d}", "json": json.dumps(conv).encode()}
            if image:
                fields["0.jpg"] = _jpeg(40 + i, 48, i)
            sink.write(fields)
    prepare_webdataset(root)
    return root


def energon_loader(root, name, *, workers=0, worker_config=None, **kw):
    """The savable Energon loader of packs (width 128, buffer 6) for the model version ``name``."""
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=small_preset(name), seq_length=128)
    ds = get_train_dataset(
        str(root),
        batch_size=1,
        shuffle_buffer_size=8,
        max_samples_per_sequence=4,
        worker_config=worker_config or WorkerConfig(rank=0, world_size=1, num_workers=workers, seed_offset=3),
        task_encoder=te,
        packing_buffer_size=6,
        **kw,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def write_jsonl(path, n=30):
    """``n`` prompt/completion lines with completions of 1-9 words."""
    rng = np.random.default_rng(1)
    with open(path, "w") as f:
        for i in range(n):
            answer = " ".join(rng.choice(WORDS, size=1 + i % 9))
            f.write(json.dumps({"prompt": f"question {i}?", "completion": answer}) + "\n")
    return path


def sft_loader(path, *, num_replicas=1, rank=0, width=128):
    """The GPT-SFT road: a DataLoader of in-batch packs over a token-budget plan; ``(loader, sampler)``."""
    from torch.utils.data import DataLoader

    from energon_pack.qwen_vl import load_demo_tokenizer
    from energon_pack.sft import InBatchPacker, JsonlSFTDataset, TokenBudgetBatchSampler

    sft = JsonlSFTDataset(path, load_demo_tokenizer())
    sampler = TokenBudgetBatchSampler(sft, width, shuffle=False, balance="tokens", num_replicas=num_replicas, rank=rank)
    return DataLoader(sft, batch_sampler=sampler, collate_fn=InBatchPacker.for_dataset(sft, width)), sampler


def tiny_text_model(tok):
    """A tiny random-init text-only Qwen2 causal LM (fp32, seeded), default sdpa attention."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(**tiny_text_kwargs(tok.special))
    return transformers.Qwen2ForCausalLM(cfg).float().eval()


def demo_processing_class():
    """The demo tokenizer as a transformers tokenizer: what TRL's SFTTrainer wants as ``processing_class`` (it would
    download the model's processor otherwise); it only saves it with the checkpoints."""
    from energon_pack.chat.tokenizer import load_demo_tokenizer_raw

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=load_demo_tokenizer_raw(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def trainer_args(out, cls=None, **kw):
    """TrainingArguments (or ``cls``, e.g. trl.SFTConfig) for one exact CPU step: fp32, no clipping, no saving."""
    settings = H.SFT_SETTINGS if cls is not None else H.TRAINER_SETTINGS
    base = dict(
        output_dir=str(out),
        **settings,
        max_steps=1,
        learning_rate=1e-3,
        max_grad_norm=0.0,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        bf16=False,
    )
    if cls is not None:
        base["gradient_checkpointing"] = False
    base.update(kw)
    return (cls or transformers.TrainingArguments)(**base)


class Grads(transformers.TrainerCallback):
    """The gradients of the first optimizer step, before the optimizer sees them."""

    grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class Recording(H.PackedCollator):
    """The collator, recording the ``__keys__`` of every pack it turns into kwargs (the Trainer reads one ahead)."""

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.keys = []

    def __call__(self, features):
        self.keys.append(list(features[0]["__keys__"]))
        return super().__call__(features)


def our_step(model, packs):
    """Our own loop's step over ``packs`` (gradient accumulation): the loss sums over the step's supervised tokens."""
    total = sum(int(p["loss_mask"].sum()) for p in packs)
    loss = 0.0
    for p in packs:
        out = H.packed_forward(model, p)
        part, _ = H.packed_loss(out.logits, p, num_supervised_tokens=total)
        part.backward()
        loss += float(part.detach())
    return loss, {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None}
