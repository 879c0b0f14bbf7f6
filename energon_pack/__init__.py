"""energon_pack: streaming online sequence packing for Megatron-Energon (THD batches, no dropped samples, exact resume).

The public face: import what you need from here.
"""

from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.packing import (
    BinPacking,
    OnlinePacker,
    OversizeError,
    PackingStats,
    PackingStatsTracker,
    best_fit_decreasing,
    first_fit_decreasing,
)
from energon_pack.sft import InBatchPacker, JsonlSFTDataset, TokenBudgetBatchSampler, inspect_jsonl
from energon_pack.thd import (
    ThdLayout,
    ThdSegment,
    aligned_length,
    alignment_multiple,
    build_thd_batch,
    shifted_labels_and_loss_mask,
    thd_attention_mask,
)

__version__ = "0.1.0"

__all__ = [
    "BinPacking",
    "ConfigError",
    "InBatchPacker",
    "JsonlSFTDataset",
    "OnlinePacker",
    "OversizeError",
    "PackingStats",
    "PackingStatsTracker",
    "SampleSkipped",
    "ThdLayout",
    "ThdSegment",
    "TokenBudgetBatchSampler",
    "aligned_length",
    "alignment_multiple",
    "best_fit_decreasing",
    "build_thd_batch",
    "first_fit_decreasing",
    "inspect_jsonl",
    "shifted_labels_and_loss_mask",
    "thd_attention_mask",
]
