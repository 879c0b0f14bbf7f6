"""Peak host memory of one Trainer step on a GPT-SFT pack, a tiny Qwen2 with Qwen's vocabulary (151,936 rows).

``python tests/_hf_logits_memory.py MODE...`` prints one JSON line per MODE: ``{"mode", "tokens", "supervised",
"peak_mib"}``, the peak resident memory of the step above the resident memory just before it (``ru_maxrss``, a
lifetime peak: give the modes in the order of their peaks, lowest first, or one process per mode).
MODE: ``full`` (PackedCollator(supervised_logits=False): the model's T x vocab logits), ``supervised`` (the default:
logits_to_keep names the supervised positions), ``sft`` (TRL's SFTTrainer and its fused LM head).
"""

import json
import resource
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from _hf_trainer_helpers import demo_processing_class, sft_loader, trainer_args
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import load_demo_tokenizer

VOCAB = 151_936
WIDTH = 2048


def _rss_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main(modes):
    for mode in modes:
        step(mode)


def step(mode):
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    words = "pack row token image answer model sample width shard loader".split()
    with open(tmp / "train.jsonl", "w") as f:  # 4 lines: long prompts, shorter completions (about 1/4 supervised)
        for i in range(4):
            prompt = " ".join(words[(i + j) % 10] for j in range(300))
            f.write(json.dumps({"prompt": prompt, "completion": " ".join(words[j % 10] for j in range(100))}) + "\n")
    loader, _ = sft_loader(tmp / "train.jsonl", width=WIDTH)
    tok = load_demo_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tok.special.im_end,
        pad_token_id=tok.special.pad,
    )
    model = H.prepare_model(transformers.Qwen2ForCausalLM(cfg).train())
    pack = next(iter(loader))
    dataset = H.PackedIterableDataset([pack])
    if mode == "sft":
        import trl

        trainer = trl.SFTTrainer(
            model=H.for_sft_trainer(model),
            args=trainer_args(tmp, trl.SFTConfig, optim="sgd"),
            train_dataset=H.trl_dataset([pack]),
            data_collator=H.PackedCollator(model, supervised_logits=False),
            processing_class=demo_processing_class(),
        )
    else:
        trainer = transformers.Trainer(
            model=model,
            args=trainer_args(tmp, optim="sgd"),
            train_dataset=dataset,
            data_collator=H.PackedCollator(model, supervised_logits=mode == "supervised"),
            compute_loss_func=H.packed_trainer_loss,
        )
    before = _rss_mib()
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = int(pack["input_ids"].shape[1])
    print(
        json.dumps(
            {
                "mode": mode,
                "tokens": tokens,
                "supervised": int(pack["loss_mask"].sum()),
                "peak_mib": round(peak - before, 1),
            }
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1:])
