"""GPT-SFT JSONL: mmap line index, lazy tokenisation, token-budget sampler, in-batch THD packer."""

from .collate import InBatchPacker
from .dataset import PADDING_INDEX, PADDING_KEY, JsonlSFTDataset
from .formats import ChatFormat, Encoded, PlainTokenizer, PromptCompletionFormat, TextFormat, make_format
from .index import LineIndex, load_line_index
from .inspect import inspect_jsonl
from .sampler import TokenBudgetBatchSampler

__all__ = [
    "PADDING_INDEX",
    "PADDING_KEY",
    "ChatFormat",
    "Encoded",
    "InBatchPacker",
    "JsonlSFTDataset",
    "LineIndex",
    "PlainTokenizer",
    "PromptCompletionFormat",
    "TextFormat",
    "TokenBudgetBatchSampler",
    "inspect_jsonl",
    "load_line_index",
    "make_format",
]
