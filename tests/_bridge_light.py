"""Import Megatron-Bridge's own modules on CPU without Megatron-Core, TE or triton (test helper).

The route of shared/reference/bridge-training-step.md: every ``megatron/bridge/**/__init__.py``
is replaced by an empty package module (the real ones import every model bridge), and modules
Bridge imports but that cannot exist here (``megatron.core.*``, Bridge's training config, ...)
become permissive stubs. ``PackedSeqParams`` is a plain dataclass with Megatron-Core's fields and
``MegatronModule`` a ``torch.nn.Module``. The Bridge functions under test are Bridge's own code.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Optional

import torch

STUB_PREFIXES = ("megatron.core", "transformer_engine")  # never torchvision: transformers would think it installed
STUB_MODULES = (
    "megatron.bridge.training.config", "megatron.bridge.training.losses", "megatron.bridge.training.state",
    "megatron.bridge.training.utils.flop_utils", "megatron.bridge.training.utils.pg_utils",
    "megatron.bridge.models.gpt_provider", "megatron.bridge.utils.common_utils",
    "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config",
    "megatron.bridge.training.tokenizers.tokenizer",
)


def bridge_version() -> str | None:
    try:
        return importlib.metadata.version("megatron-bridge")
    except importlib.metadata.PackageNotFoundError:
        return None


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__init__": lambda self, *a, **k: None, "__module__": self.__name__})
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in STUB_MODULES or any(name == p or name.startswith(p + ".") for p in STUB_PREFIXES):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


@dataclasses.dataclass
class PackedSeqParams:
    """Megatron-Core's ``PackedSeqParams`` fields (a plain stand-in)."""

    qkv_format: Optional[str] = None
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_kv: Optional[torch.Tensor] = None
    cu_seqlens_q_padded: Optional[torch.Tensor] = None
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None
    max_seqlen_q: Optional[int] = None
    max_seqlen_kv: Optional[int] = None
    total_tokens: Optional[int] = None


class MegatronModule(torch.nn.Module):
    def __init__(self, config=None):
        super().__init__()
        self.config = config


_READY = False


def load_bridge():
    """Install the light import route once; returns the root folder of the installed Bridge, or None."""
    global _READY
    if bridge_version() is None:
        return None
    spec = importlib.util.find_spec("megatron.bridge")
    root = Path(next(iter(spec.submodule_search_locations)))
    if _READY:
        return root
    import transformers  # noqa: F401  (before the torchvision stub, as the reference says)

    sys.meta_path.insert(0, _StubFinder())
    for init in sorted(root.rglob("__init__.py")):
        rel = init.parent.relative_to(root.parent.parent)  # megatron/bridge/...
        name = ".".join(rel.parts)
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__path__ = [str(init.parent)]
        module.__package__ = name
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__spec__.submodule_search_locations = [str(init.parent)]
        sys.modules[name] = module
    utils = types.ModuleType("megatron.bridge.data.datasets.utils")
    utils.IGNORE_INDEX = -100
    utils.GENERATION_REGEX = re.compile(r"\{%-?\s+generation\s+-?%\}")
    sys.modules[utils.__name__] = utils
    core = importlib.import_module("megatron.core")
    core.__version__ = "0.16.0"
    importlib.import_module("megatron.core.packed_seq_params").PackedSeqParams = PackedSeqParams
    importlib.import_module("megatron.core.transformer.module").MegatronModule = MegatronModule
    _READY = True
    return root


def bridge_module(name: str):
    """Import ``megatron.bridge.<name>`` (Bridge's real source file) through the light route."""
    if load_bridge() is None:
        raise ImportError("megatron-bridge is not installed (setup.sh installs it for the tests)")
    return importlib.import_module(f"megatron.bridge.{name}")
