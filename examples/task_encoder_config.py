"""The smallest working configurations: Qwen-VL online packing on Energon, and GPT-SFT JSONL in-batch packing.

Copy the part you need. Run it as is to see one packed batch of each on the demo data:

    python examples/task_encoder_config.py
"""

import json
import tempfile
from pathlib import Path

from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from torch.utils.data import DataLoader

from energon_pack import (
    InBatchPacker,
    JsonlSFTDataset,
    QwenVLPackingTaskEncoder,
    TokenBudgetBatchSampler,
    load_tokenizer,
    make_demo_shards,
)

# ---------------------------------------------------------------- 1. Qwen-VL on Energon (MBS 1)
# The model's real tokenizer, built offline from Qwen's published BPE ranks (or your own, e.g.
# transformers.AutoTokenizer.from_pretrained(local_qwen_dir) when you added tokens).
task_encoder = QwenVLPackingTaskEncoder(
    tokenizer=load_tokenizer("qwen2.5-vl"),
    preset="qwen2.5-vl",  # or "qwen2-vl", "qwen3-vl"; override e.g. get_preset("qwen2.5-vl", max_pixels=...)
    seq_length=8192,  # pack width (tokens)
    cp=2,
    tp=4,
    sp=True,  # each segment is aligned to lcm(2*CP, CP*TP) = 8 tokens
    pad_to_max_length=True,  # fixed width: every row is exactly seq_length tokens
    pad_cu_seqlens=True,  # static cu_seqlens shape (CUDA graphs); needs max_segments
    max_segments=64,
    packing_mode="carry",  # "rounds" = Energon's own PackingDataset behaviour
)


def qwen_vl_loader(path: str, rank: int = 0, world_size: int = 1):
    dataset = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        worker_config=WorkerConfig(rank=rank, world_size=world_size, num_workers=2),
        task_encoder=task_encoder,
        packing_buffer_size=64,  # candidate samples held per worker (bytes, not pixels)
    )
    return get_savable_loader(dataset)  # save_state_rank() / restore_state_rank() resume exactly


# ---------------------------------------------------------------- 2. GPT-SFT JSONL, in-batch packing (MBS > 1)
def jsonl_loader(path: str, rank: int = 0, world_size: int = 1, width: int = 4096):
    dataset = JsonlSFTDataset(
        path,
        load_tokenizer("qwen2.5-vl"),
        format="prompt_completion",
        prompt_field="input",
        completion_field="output",
        max_length=width,
    )
    # the sampler and the collate take the same packing knobs (PackingSpec's names): width, cp/tp/sp alignment
    sampler = TokenBudgetBatchSampler(dataset, width, cp=1, tp=1, seed=1234, num_replicas=world_size, rank=rank)
    collate = InBatchPacker.for_dataset(dataset, width, cp=1, tp=1, pad_to_max_length=True)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=2)


if __name__ == "__main__":
    tmp = Path(tempfile.mkdtemp())
    make_demo_shards(tmp / "vlm", samples=200)
    batch = next(iter(qwen_vl_loader(str(tmp / "vlm"))))
    print(
        "Qwen-VL pack:",
        batch["input_ids"].shape,
        "segments",
        batch["num_segments"],
        "real tokens",
        batch["real_tokens"],
        "pixel_values",
        tuple(batch["pixel_values"].shape),
    )
    with open(tmp / "sft.jsonl", "w") as f:
        for i in range(500):
            f.write(
                json.dumps({"input": f"question {i}: " + "why " * (i % 40), "output": "because " * (1 + i % 60)}) + "\n"
            )
    batch = next(iter(jsonl_loader(str(tmp / "sft.jsonl"))))
    print(
        "JSONL pack:", batch["input_ids"].shape, "segments", batch["num_segments"], "real tokens", batch["real_tokens"]
    )
