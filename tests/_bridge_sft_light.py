"""Bridge's GPT-SFT data modules (datasets, offline packing, packed Parquet) on CPU (test and bench helper).

On top of :mod:`_bridge_light`: Bridge's ``data/datasets/gpt_sft.py`` imports names from the real
``data/datasets/utils.py`` (the light route seeds a two-name stand-in: the real module's names
are added to it), HF ``datasets`` at module level (used only for ``hf_dataset=True``: a stand-in
while importing when it is not installed), and Megatron-Core's ``MultiStorageClientFeature``
(a stand-in reporting it off). Every function run is Bridge's own.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from _bridge_light import bridge_module, bridge_version, load_bridge

#: a ChatML template with ``{% generation %}`` around what the assistant writes (its text and
#: <|im_end|>): Bridge's assistant loss mask, the same supervised tokens as our chat format
CHATML_GENERATION_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['role'] == 'assistant' -%}"
    "{% generation %}{{- m['content'] + '<|im_end|>' -}}{% endgeneration %}{{- '\\n' -}}"
    "{%- else -%}{{- m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
)


def gpt_sft_modules() -> types.SimpleNamespace | None:
    """Bridge's ``datasets.gpt_sft``, ``sft_processing``, ``packing.{offline,algorithms,parquet}``;
    None without Bridge."""
    if bridge_version() is None:
        return None
    root = load_bridge()
    msc = importlib.import_module("megatron.core.msc_utils")
    if not hasattr(getattr(msc, "MultiStorageClientFeature", None), "is_enabled"):
        msc.MultiStorageClientFeature = type(
            "MultiStorageClientFeature", (), {"is_enabled": staticmethod(lambda: False)}
        )
    utils = sys.modules["megatron.bridge.data.datasets.utils"]
    if not hasattr(utils, "_JSONLMemMapDataset"):
        spec = importlib.util.spec_from_file_location(
            "megatron.bridge.data.datasets._utils_real", root / "data" / "datasets" / "utils.py"
        )
        real = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(real)
        for name, value in vars(real).items():
            if not name.startswith("__") and not hasattr(utils, name):
                setattr(utils, name, value)
    stand_in = sys.modules.get("datasets") is None and importlib.util.find_spec("datasets") is None
    if stand_in:
        sys.modules["datasets"] = types.SimpleNamespace(load_dataset=None, builder=types.SimpleNamespace())
    try:
        names = (
            "data.datasets.gpt_sft",
            "data.sft_processing",
            "data.packing.offline",
            "data.packing.algorithms",
            "data.packing.parquet",
        )
        mods = {name.split(".")[-1]: bridge_module(name) for name in names}
    finally:
        if stand_in:  # the real HF datasets (a TRL dependency), once imported, stays: a second import of it would
            sys.modules.pop("datasets", None)  # register its pyarrow extension types twice
    return types.SimpleNamespace(**mods)


class BridgeTokenizer:
    """What Bridge's GPT-SFT code reads of a Megatron tokenizer, over a ``tokenizers.Tokenizer``
    (a ``PreTrainedTokenizerFast`` with :data:`CHATML_GENERATION_TEMPLATE` for its chat path)."""

    def __init__(self, raw, eos_token: str = "<|endoftext|>") -> None:
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eos_token)
        hf.chat_template = CHATML_GENERATION_TEMPLATE
        self.tokenizer = self._tokenizer = hf
        self.eos_id = self.eod = hf.eos_token_id
        self.bos_id = None

    def text_to_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def ids_to_text(self, ids) -> str:
        return self.tokenizer.decode(ids)
