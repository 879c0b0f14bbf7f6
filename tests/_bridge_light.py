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

import torch

STUB_PREFIXES = ("megatron.core", "transformer_engine")  # never torchvision: transformers would think it installed
STUB_MODULES = (
    "megatron.bridge.training.config",
    "megatron.bridge.training.losses",
    "megatron.bridge.training.state",
    "megatron.bridge.training.utils.flop_utils",
    "megatron.bridge.training.utils.pg_utils",
    "megatron.bridge.models.gpt_provider",
    "megatron.bridge.utils.common_utils",
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

    qkv_format: str | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_kv: torch.Tensor | None = None
    cu_seqlens_q_padded: torch.Tensor | None = None
    cu_seqlens_kv_padded: torch.Tensor | None = None
    max_seqlen_q: int | None = None
    max_seqlen_kv: int | None = None
    total_tokens: int | None = None


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


# ---------------------------------------------------------------------------------- test stand-ins
#: Qwen2/2.5/3-VL's ids of the special tokens our encoder needs (Bridge's Qwen-VL providers default to these).
QWEN_SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}


def tiny_tokenizer(special_ids: dict[str, int] | None = None):
    """A real, non-demo ``tokenizers.Tokenizer`` small enough to build here: 256 byte tokens, no
    merges, and the Qwen special tokens at Qwen's ids (so Bridge's model token ids match), or at
    ``special_ids``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    special_ids = special_ids or QWEN_SPECIAL_IDS
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update(special_ids)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_ids])
    return tok


#: Defaults, for the knobs ``check_bridge_config`` reads, of the dataclasses a recipe's
#: ``ConfigContainer`` is made of where the Qwen2.5-VL recipe leaves them: Megatron-Core's
#: TransformerConfig / DistributedDataParallelConfig, Megatron-LM's ValidationConfig
#: (``eval_micro_batch_size`` None: Bridge then uses ``train.micro_batch_size``), Bridge's
#: DistributedInitConfig and ConfigContainer (``comm_overlap`` None). Bridge's provider class adds
#: its own literal defaults (the vision token ids) on top of ``model``.
RECIPE_DEFAULTS = {
    "train": dict(micro_batch_size=None, global_batch_size=None),
    "validation": dict(eval_micro_batch_size=None, eval_global_batch_size=None),
    "model": dict(
        calculate_per_token_loss=False,
        pipeline_model_parallel_size=1,
        mtp_num_layers=None,
        cuda_graph_impl="none",
        overlap_moe_expert_parallel_comm=False,
        delay_wgrad_compute=False,
        context_parallel_size=1,
        tensor_model_parallel_size=1,
        sequence_parallel=False,
        expert_model_parallel_size=1,
        seq_length=1024,
    ),
    "ddp": dict(average_in_collective=False),
    "dist": dict(eval_context_parallel_size=None),
}


class RecipeStandIn:
    """A Bridge recipe's config on a machine where the recipe cannot run (it imports Megatron-Core
    and Megatron-LM's training configs, absent here, and downloads the model's HF config).

    Reads the recipe function from the installed Bridge source (``ast``, nothing executed) and
    replays its literal settings in statement order onto nested namespaces with Bridge's attribute
    paths: ``cfg.a.b = literal``, keyword arguments of the config constructors assigned to ``cfg``
    or ``cfg.a`` (a replaced sub-config starts again from :data:`RECIPE_DEFAULTS`), local literal
    variables, and the recipe helpers it calls (``cfg = _sft_common_vlm()``). Anything computed is
    left out.
    """

    def __init__(self, model_provider: tuple[str, str] | None = None):
        self.root = load_bridge()
        if self.root is None:
            raise ImportError("megatron-bridge is not installed (setup.sh installs it for the tests)")
        self.model_provider = model_provider

    def _module(self, module: str):
        import ast

        path = self.root.joinpath(*module.split(".")[2:]).with_suffix(".py")
        return ast.parse(path.read_text())

    def _resolve(self, module: str, name: str):
        """(module, FunctionDef) of ``name`` as seen from ``module`` (defined there or imported)."""
        import ast

        tree = self._module(module)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return module, node
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("megatron.bridge"):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self._resolve(node.module, alias.name)
        return None

    def _fresh(self, top: str) -> types.SimpleNamespace:
        values = dict(RECIPE_DEFAULTS.get(top, {}))
        if top == "model" and self.model_provider is not None:
            values.update(self._class_literals(*self.model_provider))
        return types.SimpleNamespace(**values)

    def _class_literals(self, module: str, cls: str) -> dict:
        import ast

        node = next(n for n in self._module(module).body if isinstance(n, ast.ClassDef) and n.name == cls)
        out = {}
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                try:
                    out[item.target.id] = ast.literal_eval(item.value)
                except ValueError:
                    pass
        return out

    def build(self, module: str, function: str) -> types.SimpleNamespace:
        cfg = types.SimpleNamespace(
            comm_overlap=None, dataset=None, **{top: self._fresh(top) for top in RECIPE_DEFAULTS}
        )
        found = self._resolve(module, function)
        if found is None:
            raise LookupError(f"{module}.{function} not found in the installed Bridge source")
        self._replay(cfg, *found)
        return cfg

    def _set(self, cfg, path: list[str], value) -> None:
        obj = cfg
        for part in path[:-1]:
            if not isinstance(getattr(obj, part, None), types.SimpleNamespace):
                setattr(obj, part, self._fresh(part) if obj is cfg else types.SimpleNamespace())
            obj = getattr(obj, part)
        setattr(obj, path[-1], value)

    def _replay(self, cfg, module: str, func) -> None:
        import ast

        env: dict = {}

        def literal(node):
            if isinstance(node, ast.Name) and node.id in env:
                return env[node.id]
            return ast.literal_eval(node)

        def keywords(call, path):
            for kw in call.keywords:
                if kw.arg is None:
                    continue
                if isinstance(kw.value, ast.Call):
                    if path or kw.arg in RECIPE_DEFAULTS:
                        self._set(cfg, path + [kw.arg], self._fresh(kw.arg) if not path else types.SimpleNamespace())
                    keywords(kw.value, path + [kw.arg])
                    continue
                try:
                    self._set(cfg, path + [kw.arg], literal(kw.value))
                except ValueError:
                    pass

        for stmt in func.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            target, value = stmt.targets[0], stmt.value
            if isinstance(target, ast.Name):
                if target.id == "cfg" and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                    helper = self._resolve(module, value.func.id)
                    if helper is not None:
                        self._replay(cfg, *helper)  # a recipe helper builds the container
                    else:
                        keywords(value, [])  # ConfigContainer(...)
                else:
                    try:
                        env[target.id] = literal(value)
                    except ValueError:
                        pass
                continue
            text = ast.unparse(target)
            if not text.startswith("cfg."):
                continue
            path = text[4:].split(".")
            if isinstance(value, ast.Call):  # a whole sub-config replaced
                self._set(cfg, path, self._fresh(path[0]) if len(path) == 1 else types.SimpleNamespace())
                if isinstance(value.func, ast.Name):
                    keywords(value, path)
                continue
            try:
                self._set(cfg, path, literal(value))
            except ValueError:
                pass


def qwen25_vl_7b_sft_stand_in() -> types.SimpleNamespace:
    """:class:`RecipeStandIn` of ``megatron.bridge.recipes.qwen_vl.qwen25_vl.qwen25_vl_7b_sft_config``."""
    reader = RecipeStandIn(
        model_provider=("megatron.bridge.models.qwen_vl.qwen25_vl_provider", "Qwen25VLModelProvider")
    )
    return reader.build("megatron.bridge.recipes.qwen_vl.qwen25_vl", "qwen25_vl_7b_sft_config")
