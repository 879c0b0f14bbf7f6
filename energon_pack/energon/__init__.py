"""The bridge to Megatron-Energon: ChatML samples, the carry-over packing wrapper and mixin, preparation."""

from .carry_over import CarryOverPackingDataset
from .chatml import CHATML_COOKERS, ChatMLSample, cook_chatml, parse_chatml
from .demo_data import make_demo_shards
from .prepare import prepare_webdataset
from .samples import PackCandidate, PackedSamples, SkippedSample
from .task_encoder import PACKING_MODES, CarryOverPackingMixin, pack_members

__all__ = [
    "CHATML_COOKERS",
    "PACKING_MODES",
    "CarryOverPackingDataset",
    "CarryOverPackingMixin",
    "ChatMLSample",
    "PackCandidate",
    "PackedSamples",
    "SkippedSample",
    "cook_chatml",
    "make_demo_shards",
    "pack_members",
    "parse_chatml",
    "prepare_webdataset",
]
