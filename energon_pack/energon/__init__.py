"""The bridge to Megatron-Energon: ChatML samples, the carry-over packing wrapper and mixin, preparation.

Importing it patches nothing: the Energon guards (:mod:`.compat`) are installed when one of our task
encoders is built.
"""

from .carry_over import CarryOverPackingDataset
from .chatml import CHATML_COOKERS, ChatMLSample, cook_chatml, parse_chatml
from .checkpoint import restore_state_rank, save_state_rank
from .compat import TESTED_ENERGON_VERSIONS, energon_guards_installed, install_energon_guards, uninstall_energon_guards
from .config import OVERLENGTH_POLICIES, PACKING_MODES, PackingConfig
from .dataset_change import DatasetViews, split_changed_dataset
from .demo_data import make_demo_shards
from .fingerprint import ResumeConfigError
from .prepare import prepare, prepare_jsonl, prepare_webdataset
from .samples import EncodedSegment, PackCandidate, PackedSamples, SkippedSample
from .stream import AllSkippedError
from .task_encoder import CarryOverPackingMixin, pack_members
from .text import TextPackingTaskEncoder

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
    "ResumeConfigError",
    "TESTED_ENERGON_VERSIONS",
    "energon_guards_installed",
    "install_energon_guards",
    "uninstall_energon_guards",
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
