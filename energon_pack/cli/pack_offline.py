"""``energon-pack pack-offline``: GPT-SFT JSONL -> Megatron-Bridge's offline packs
(:func:`energon_pack.sft.pack_offline.pack_offline`), checked against the GPT-SFT config check
of the flags' topology, with the Bridge settings that read them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import jsonl_file, resolve_tokenizer
from .options import (
    FORMAT_HELP,
    JSONL_FORMATS,
    add_command,
    field_kw,
    positive_int,
    preference_option,
    spec_flags,
    spec_options,
)

NAME = "pack-offline"
#: the packing spec knobs this command takes (flags generated from the spec: --seq-length, --cp, ...)
SPEC_KNOBS = ("seq_length", "cp", "tp", "sp", "seed")
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {
    **spec_flags(*SPEC_KNOBS),
    "prompt_field": "--prompt-field",
    "completion_field": "--completion-field",
    "preference": "--preference",
    "overwrite": "--overwrite",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        NAME,
        "GPT-SFT JSONL -> Megatron-Bridge's offline packs (OUT/training_N.idx.parquet + "
        "OUT/N_metadata.jsonl), streamed in bounded memory, best-fit packed, deterministic",
    )
    p.add_argument("path", help="a prompt/completion or chat JSONL file (only read)")
    p.add_argument("out", help="output folder (Bridge's packed_train_data_path / packed_metadata_path go there)")
    p.add_argument("--format", default="prompt_completion", choices=JSONL_FORMATS, help=FORMAT_HELP)
    p.add_argument(
        "--tokenizer",
        default=None,
        help="qwen2-vl | qwen2.5-vl | qwen3-vl, a tokenizer.json or a local "
        "Hugging Face folder (never downloaded), or demo; default: qwen2.5-vl",
    )
    spec_options(
        p,
        *SPEC_KNOBS,
        defaults={"seq_length": 4096},
        notes={
            "seq_length": " (Bridge: packed_sequence_size = model.seq_length = dataset.seq_length)",
            "seed": " (the same seed writes the same bytes)",
        },
    )
    p.add_argument(
        "--pad-seq-to-mult",
        type=positive_int,
        default=None,
        help="per-sample alignment (default: the rule from --cp/--tp/--sp; an explicit value must be a multiple of it)",
    )
    p.add_argument("--workers", type=positive_int, default=None, help="tokenizer processes (default: the usable cores)")
    p.add_argument("--split", default="training", choices=["training", "validation", "test"], help="file name prefix")
    p.add_argument(
        "--eos-id",
        type=int,
        default=None,
        help="the id Bridge's tokenizer reports as eos_id (alignment padding; default: the tokenizer's EOS)",
    )
    p.add_argument(
        "--prompt-field", default=None, help="the prompt's field, --format prompt_completion only (default: prompt)"
    )
    p.add_argument(
        "--completion-field",
        default=None,
        help="the completion's field, --format prompt_completion only (default: completion)",
    )
    preference_option(p)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace this split's finished output in OUT (default: refuse it; other splits are kept)",
    )
    p.add_argument("--json-out", default=None, help="also write the summary as JSON to this path")
    return p


def run(args: argparse.Namespace) -> int:
    """Write the packs, print the summary, run the GPT-SFT config check for the offline route of a
    training config of the flags' topology with the written metadata (the packs must pass it), and
    print the Bridge settings that read them."""
    from energon_pack.integrations.bridge_sft import check_gpt_sft_config
    from energon_pack.sft.pack_offline import pack_offline

    tok, described = resolve_tokenizer(args.tokenizer)
    path = jsonl_file(args.path)
    print(f"tokenizer: {described}", flush=True)
    summary = pack_offline(
        path,
        args.out,
        seq_length=args.seq_length,
        tokenizer=tok,
        format=args.format,
        pad_seq_to_mult=args.pad_seq_to_mult,
        cp=args.cp,
        tp=args.tp,
        sp=args.sp,
        seed=args.seed,
        workers=args.workers,
        split=args.split,
        eos_id=args.eos_id,
        overwrite=args.overwrite,
        **field_kw(args),
    )
    print(summary.describe())
    entries = json.loads(Path(summary.metadata_path).read_text())
    width = args.seq_length
    check_gpt_sft_config(
        route="offline",
        micro_batch_size=1,
        global_batch_size=1,
        data_parallel_size=1,
        model_seq_length=width,
        dataset_seq_length=width,
        packed_sequence_size=width,
        context_parallel_size=args.cp,
        tensor_model_parallel_size=args.tp,
        sequence_parallel=args.sp,
        pad_seq_to_mult=entries[-1]["pad_seq_to_mult"],
        pad_to_max_length=True,
        pad_cu_seqlens=True,
        packing_metadata=entries,
    )
    meta = entries[-1]["energon_pack"]
    split = "train" if args.split == "training" else "val"
    print(
        f"Bridge: PackedSequenceSpecs(packed_sequence_size={width}, packed_{split}_data_path={summary.packs_path!r}, "
        f"packed_metadata_path={summary.metadata_path!r}, pad_seq_to_mult={meta['pad_seq_to_mult']}) with "
        f"model.seq_length = dataset.seq_length = {width}, micro_batch_size 1, and a tokenizer whose eos_id is "
        f"{meta['eos_id']}"
    )
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(summary.to_json(), indent=2))
        print(f"wrote the summary to {args.json_out}")
    return 0
