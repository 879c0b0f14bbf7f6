"""energon_pack: streaming online sequence packing for Megatron-Energon (THD batches, no dropped samples, exact resume).

The public face: import what you need from here, e.g.::

    from energon_pack import PackingConfig, QwenVLPackingTaskEncoder, load_tokenizer

Every name is imported on first use (PEP 562), so ``import energon_pack`` costs nothing and a training job
pays only for the parts it touches (torch, Megatron-Energon, transformers stay unloaded until needed).
Subpackages stay importable for what is not listed here; the documented ones are
:mod:`energon_pack.integrations.hf` and :mod:`energon_pack.integrations.bridge`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from energon_pack.lazy_exports import lazy_exports

__version__ = "0.1.0"

#: public name -> the module that defines it (the one place the public face is declared)
_EXPORTS: dict[str, str] = {
    # outcomes for bad input
    "AllSkippedError": "energon_pack.errors",
    "SkipRateWarning": "energon_pack.errors",
    "ResumeConfigError": "energon_pack.energon",
    "ConfigError": "energon_pack.errors",
    "SampleSkipped": "energon_pack.errors",
    # Energon task encoders and their configuration (the packing knobs every road shares: PackingSpec)
    "PackingSpec": "energon_pack.packing",
    "PackingConfig": "energon_pack.energon",
    "TextPackingTaskEncoder": "energon_pack.energon",
    "QwenVLPackingTaskEncoder": "energon_pack.qwen_vl.task_encoder",
    "ChatConfig": "energon_pack.chat",
    "load_tokenizer": "energon_pack.chat",
    "describe_tokenizer": "energon_pack.chat",
    "as_qwen_tokenizer": "energon_pack.chat",
    "is_demo_tokenizer": "energon_pack.chat.tokenizer",
    "qwen_vocab_version": "energon_pack.chat.tokenizer",
    "QWEN_VL_VOCAB_ROWS": "energon_pack.chat",
    "get_preset": "energon_pack.qwen_vl",
    "PRESETS": "energon_pack.qwen_vl",
    "VisionPreset": "energon_pack.qwen_vl",
    # datasets, resume and storage
    "make_demo_shards": "energon_pack.energon",
    "prepare": "energon_pack.energon",
    "save_state_rank": "energon_pack.energon",
    "restore_state_rank": "energon_pack.energon",
    "split_changed_dataset": "energon_pack.energon",
    "configure_object_reads": "energon_pack.object_reads",
    "configure_object_waits": "energon_pack.object_waits",
    "ObjectStoreTimeout": "energon_pack.object_waits",
    # GPT-SFT JSONL
    "InBatchPacker": "energon_pack.sft",
    "JsonlSFTDataset": "energon_pack.sft",
    "TokenBudgetBatchSampler": "energon_pack.sft",
    "inspect_jsonl": "energon_pack.sft",
    # Megatron-Bridge
    "BRIDGE_BATCH_KEYS": "energon_pack.integrations.bridge",
    "BridgeQwenVLPackingTaskEncoder": "energon_pack.integrations.bridge",
    "check_bridge_config": "energon_pack.integrations.bridge",
    "make_bridge_dataset_provider": "energon_pack.integrations.bridge",
    "bridge_dataset_kwargs": "energon_pack.integrations.bridge",
    "to_bridge_batch": "energon_pack.integrations.bridge",
    "check_bridge_sft_config": "energon_pack.integrations.bridge",
    "make_bridge_sft_dataset_provider": "energon_pack.integrations.bridge",
    # Hugging Face transformers
    "prepare_model": "energon_pack.integrations.hf",
    "hf_forward_kwargs": "energon_pack.integrations.hf",
    "packed_forward": "energon_pack.integrations.hf",
    "packed_loss": "energon_pack.integrations.hf",
    "packed_loss_from_hidden": "energon_pack.integrations.hf",
    "packed_hidden_states": "energon_pack.integrations.hf",
    "normalize_by_global_tokens": "energon_pack.integrations.hf",
    "use_varlen_attention": "energon_pack.integrations.hf",
    "PackedIterableDataset": "energon_pack.integrations.hf",
    "PackedCollator": "energon_pack.integrations.hf",
    "packed_trainer_loss": "energon_pack.integrations.hf",
    "EnergonStateCallback": "energon_pack.integrations.hf",
    "ManualGC": "energon_pack.integrations.manual_gc",
    "StepTimer": "energon_pack.integrations.step_times",
    "StepTimeCallback": "energon_pack.integrations.step_times",
    "fit_cost_model": "energon_pack.packing.calibrate",
    "write_cost_model": "energon_pack.packing.calibrate",
    "manual_gc_callback": "energon_pack.integrations.manual_gc",
    # the packing core (no torch, no Energon) and the THD batch
    "BinPacking": "energon_pack.packing",
    "OnlinePacker": "energon_pack.packing",
    "ComputeBalancedPacker": "energon_pack.packing",
    "StepCostModel": "energon_pack.packing",
    "OversizeError": "energon_pack.packing",
    "PackingStats": "energon_pack.packing",
    "PackingStatsTracker": "energon_pack.packing",
    "best_fit_decreasing": "energon_pack.packing",
    "first_fit_decreasing": "energon_pack.packing",
    "PADDED_BOUNDARY_KEYS": "energon_pack.thd",
    "ThdLayout": "energon_pack.thd",
    "ThdSegment": "energon_pack.thd",
    "aligned_length": "energon_pack.thd",
    "alignment_multiple": "energon_pack.thd",
    "build_thd_batch": "energon_pack.thd",
    "shifted_labels_and_loss_mask": "energon_pack.thd",
    "thd_attention_mask": "energon_pack.thd",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # static analysers see the real names
    from energon_pack.chat import QWEN_VL_VOCAB_ROWS, ChatConfig, as_qwen_tokenizer, describe_tokenizer, load_tokenizer
    from energon_pack.chat.tokenizer import is_demo_tokenizer, qwen_vocab_version
    from energon_pack.energon import (
        PackingConfig,
        ResumeConfigError,
        TextPackingTaskEncoder,
        make_demo_shards,
        prepare,
        restore_state_rank,
        save_state_rank,
        split_changed_dataset,
    )
    from energon_pack.errors import AllSkippedError, ConfigError, SampleSkipped, SkipRateWarning
    from energon_pack.integrations.bridge import (
        BRIDGE_BATCH_KEYS,
        BridgeQwenVLPackingTaskEncoder,
        bridge_dataset_kwargs,
        check_bridge_config,
        check_bridge_sft_config,
        make_bridge_dataset_provider,
        make_bridge_sft_dataset_provider,
        to_bridge_batch,
    )
    from energon_pack.integrations.hf import (
        EnergonStateCallback,
        PackedCollator,
        PackedIterableDataset,
        hf_forward_kwargs,
        normalize_by_global_tokens,
        packed_forward,
        packed_hidden_states,
        packed_loss,
        packed_loss_from_hidden,
        packed_trainer_loss,
        prepare_model,
        use_varlen_attention,
    )
    from energon_pack.integrations.manual_gc import ManualGC, manual_gc_callback
    from energon_pack.integrations.step_times import StepTimeCallback, StepTimer
    from energon_pack.object_reads import configure_object_reads
    from energon_pack.object_waits import ObjectStoreTimeout, configure_object_waits
    from energon_pack.packing import (
        BinPacking,
        ComputeBalancedPacker,
        OnlinePacker,
        OversizeError,
        PackingStats,
        PackingStatsTracker,
        StepCostModel,
        best_fit_decreasing,
        first_fit_decreasing,
    )
    from energon_pack.packing.calibrate import fit_cost_model, write_cost_model
    from energon_pack.qwen_vl import PRESETS, VisionPreset, get_preset
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
    from energon_pack.sft import InBatchPacker, JsonlSFTDataset, TokenBudgetBatchSampler, inspect_jsonl
    from energon_pack.thd import (
        PADDED_BOUNDARY_KEYS,
        ThdLayout,
        ThdSegment,
        aligned_length,
        alignment_multiple,
        build_thd_batch,
        shifted_labels_and_loss_mask,
        thd_attention_mask,
    )
