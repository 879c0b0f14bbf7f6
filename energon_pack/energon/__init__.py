"""The bridge to Megatron-Energon: ChatML samples, the carry-over packing wrapper and mixin, preparation."""

from .carry_over import CarryOverPackingDataset
from .chatml import CHATML_COOKERS, ChatMLSample, cook_chatml, parse_chatml
from .demo_data import make_demo_shards
from .prepare import prepare, prepare_jsonl, prepare_webdataset
from .samples import EncodedSegment, PackCandidate, PackedSamples, SkippedSample
from .config import OVERLENGTH_POLICIES, PACKING_MODES, PackingConfig
from .stream import AllSkippedError
from .checkpoint import (guard_energon_restore_state_rank, guard_energon_save_state_rank, guard_energon_worker_checkpoint,
                         restore_state_rank, save_state_rank)
from .dataset_change import DatasetViews, split_changed_dataset
from .task_encoder import CarryOverPackingMixin, pack_members
from .text import TextPackingTaskEncoder

guard_energon_save_state_rank()
guard_energon_restore_state_rank()
guard_energon_worker_checkpoint()

__all__ = [
    "CHATML_COOKERS",
    "OVERLENGTH_POLICIES",
    "PackingConfig",
    "EncodedSegment",
    "PACKING_MODES",
    "CarryOverPackingDataset",
    "DatasetViews",
    "CarryOverPackingMixin",
    "ChatMLSample",
    "PackCandidate",
    "PackedSamples",
    "SkippedSample",
    "TextPackingTaskEncoder",
    "AllSkippedError",
    "restore_state_rank",
    "save_state_rank",
    "split_changed_dataset",
    "cook_chatml",
    "make_demo_shards",
    "pack_members",
    "parse_chatml",
    "prepare",
    "prepare_jsonl",
    "prepare_webdataset",
]
