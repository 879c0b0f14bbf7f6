"""What a sample costs a training step, as an additive model: the budget that makes packs equal in GPU time.

Packs with equal tokens take unequal time: attention grows with the square of each segment, the vision tower
with each image's and video's patches (and their square in its full-attention blocks). The cost of a sample is
a sum of terms, so a pack's cost is the sum of its samples' and the cost can be a packer budget:

- LLM dense, per token (every projection and MLP, the LM head);
- LLM causal attention, per segment length squared;
- vision dense, per patch row (patch embedding, every block's projections and MLP, the merger);
- vision attention per image or video time slice: windowed blocks per patch (a window's patches each), full
  blocks per patch count squared (Qwen-VL's vision attention runs per ``t`` slice of a grid).

:meth:`StepCostModel.from_shape` derives the coefficients from a model shape (training FLOPs: forward and
backward, 6 per parameter per token for the dense terms, 12 per head dimension for attention); a fitted model
(:data:`FITTED`, by name through :func:`named_cost_model`) has coefficients measured against step times. Costs are
reported in *token-equivalents*: FLOPs over one token's LLM dense FLOPs, so a pack of text costs a little more
than its token count and the number reads against the width.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: patches per window of the windowed vision blocks (Qwen2.5-VL: a 112-pixel window of 14-pixel patches)
QWEN25_WINDOW_PATCHES = (112 // 14) ** 2


@dataclass(frozen=True)
class LLMShape:
    """The LLM's shape (a transformers text config's fields)."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    gated_mlp: bool = True


@dataclass(frozen=True)
class VisionShape:
    """The vision tower's shape: blocks, their width, MLP and attention layout, patch and merger."""

    hidden: int
    depth: int
    intermediate: int
    out_hidden: int
    patch_size: int
    temporal_patch_size: int = 2
    merge_size: int = 2
    gated_mlp: bool = False
    #: blocks that attend over the whole image (the rest attend within windows); None: every block is full
    full_blocks: int | None = None
    window_patches: int = QWEN25_WINDOW_PATCHES
    #: extra mergers (Qwen3-VL's deepstack) that run on the patches of some blocks
    extra_mergers: int = 0


@dataclass(frozen=True)
class ModelShape:
    name: str
    llm: LLMShape
    vision: VisionShape | None = None


#: the published configs of the models users finetune (config.json of each Hugging Face repo), and the 3.75B
#: Qwen2.5-VL shape of ``examples/gpu_benchmark.py --size 3b``
SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in (
        ModelShape(
            "qwen2-vl-2b",
            LLMShape(1536, 28, 8960, 12, 2, 128, 151936),
            VisionShape(1280, 32, 5120, 1536, 14),
        ),
        ModelShape(
            "qwen2-vl-7b",
            LLMShape(3584, 28, 18944, 28, 4, 128, 152064),
            VisionShape(1280, 32, 5120, 3584, 14),
        ),
        ModelShape(
            "qwen2.5-vl-3b",
            LLMShape(2048, 36, 11008, 16, 2, 128, 151936),
            VisionShape(1280, 32, 3420, 2048, 14, gated_mlp=True, full_blocks=4),
        ),
        ModelShape(
            "qwen2.5-vl-7b",
            LLMShape(3584, 28, 18944, 28, 4, 128, 152064),
            VisionShape(1280, 32, 3420, 3584, 14, gated_mlp=True, full_blocks=4),
        ),
        ModelShape(
            "qwen3-vl-4b",
            LLMShape(2560, 36, 9728, 32, 8, 128, 151936),
            VisionShape(1024, 24, 4096, 2560, 16, extra_mergers=3),
        ),
        ModelShape(
            "qwen3-vl-8b",
            LLMShape(4096, 36, 12288, 32, 8, 128, 151936),
            VisionShape(1152, 27, 4304, 4096, 16, extra_mergers=3),
        ),
    )
}


@dataclass(frozen=True)
class StepCostModel:
    """Additive step cost of a sample, in token-equivalents (see the module doc).

    Args:
        per_token: LLM dense, per token (1.0 for a model derived from its shape: the unit).
        per_token_squared: LLM causal attention, per segment length squared.
        per_patch: vision dense, per patch row.
        per_window_patch: windowed vision attention, per patch (its window's patches each).
        per_patch_squared: full vision attention, per (patches of a time slice) squared.
        source: where the coefficients come from (``"flops:<shape>"`` or ``"fit:<run>"``).
    """

    per_token: float
    per_token_squared: float
    per_patch: float = 0.0
    per_window_patch: float = 0.0
    per_patch_squared: float = 0.0
    source: str = "custom"

    @classmethod
    def from_shape(cls, shape: ModelShape | str) -> StepCostModel:
        """Training FLOPs of ``shape`` (a :data:`SHAPES` name or a :class:`ModelShape`) in token-equivalents."""
        if isinstance(shape, str):
            if shape not in SHAPES:
                from energon_pack.errors import ConfigError

                raise ConfigError("shape", f"unknown model shape {shape!r}", f"use one of {', '.join(SHAPES)}")
            shape = SHAPES[shape]
        t = shape.llm
        attention_params = t.hidden * t.head_dim * (2 * t.heads + 2 * t.kv_heads)
        mlp_params = (3 if t.gated_mlp else 2) * t.hidden * t.intermediate
        token = 6.0 * (t.layers * (attention_params + mlp_params) + t.hidden * t.vocab)
        # QK^T and AV, 2 FLOPs per multiply-add each, half the square for a causal mask, x3 for fwd + bwd
        token_squared = 6.0 * t.layers * t.heads * t.head_dim
        patch = window_patch = patch_squared = 0.0
        v = shape.vision
        if v is not None:
            block = 4 * v.hidden * v.hidden + (3 if v.gated_mlp else 2) * v.hidden * v.intermediate
            embed = 3 * v.temporal_patch_size * v.patch_size**2 * v.hidden
            merged = v.hidden * v.merge_size**2
            merger = (merged * merged + merged * v.out_hidden) / v.merge_size**2  # per patch
            patch = 6.0 * (embed + v.depth * block + merger * (1 + v.extra_mergers))
            full = v.depth if v.full_blocks is None else v.full_blocks
            window_patch = 12.0 * v.hidden * (v.depth - full) * v.window_patches
            patch_squared = 12.0 * v.hidden * full
        return cls(
            per_token=1.0,
            per_token_squared=token_squared / token,
            per_patch=patch / token,
            per_window_patch=window_patch / token,
            per_patch_squared=patch_squared / token,
            source=f"flops:{shape.name}",
        )

    @staticmethod
    def pack_terms(segment_lengths: Iterable[int], grids: Iterable[Sequence[int]] = ()) -> dict[str, float]:
        """The cost terms of a pack (or of one sample): real tokens, the sum of segment lengths squared, vision
        patch rows and the sum of (patches of a time slice) squared over the (t, h, w) patch grids."""
        lengths, grids = [int(x) for x in segment_lengths], [tuple(int(x) for x in g) for g in grids]
        return {
            "tokens": float(sum(lengths)),
            "tokens_squared": float(sum(x * x for x in lengths)),
            "patches": float(sum(t * h * w for t, h, w in grids)),
            "patches_squared": float(sum(t * (h * w) ** 2 for t, h, w in grids)),
        }

    def terms_cost(self, terms: Mapping[str, float]) -> float:
        """The cost of :meth:`pack_terms` under this model: the model's one formula."""
        return (
            self.per_token * terms["tokens"]
            + self.per_token_squared * terms["tokens_squared"]
            + (self.per_patch + self.per_window_patch) * terms["patches"]
            + self.per_patch_squared * terms["patches_squared"]
        )

    def pack_cost(self, segment_lengths: Iterable[int], grids: Iterable[Sequence[int]] = ()) -> float:
        """The cost of a pack: its segments' lengths and its images' and videos' (t, h, w) patch grids."""
        return self.terms_cost(self.pack_terms(segment_lengths, grids))

    def sample_cost(self, tokens: int, grids: Iterable[Sequence[int]] = ()) -> float:
        """The cost of one sample: ``tokens`` in one segment, and its images' and videos' (t, h, w) patch grids."""
        return self.pack_cost((tokens,), grids)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> StepCostModel:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


#: step-cost models fitted to measured step times (``examples/step_cost_fit.py`` on one H200: the least-squares fit
#: of step ms on the terms, in token-equivalents of the per-slot cost; each names its run's JSON in
#: ``docs/benchmarks/``), as ``"<shape>@<device>-<path>"``
FITTED: dict[str, StepCostModel] = {
    # docs/benchmarks/step_cost_h200_fit_eager.json: 150 steps (packs of widths 2048-8192), R^2 0.994, residual
    # 1.6% (the FLOP model alone: R^2 0.971); the vision terms cost 2.8-3x their FLOP share of the LLM's there
    "qwen2.5-vl-3b@h200-eager": StepCostModel(
        per_token=1.0,
        per_token_squared=4.813e-05,
        per_patch=0.6304,
        per_patch_squared=9.348e-06,
        source="fit:step_cost_h200_fit_eager",
    ),
    # docs/benchmarks/step_cost_h200_compiled_diag.json: 148 steps, elementwise pieces compiled, R^2 0.975, residual
    # 2.8% (the FLOP model alone: R^2 0.966); compiling makes the vision terms cheaper relative to the LLM
    "qwen2.5-vl-3b@h200-compiled": StepCostModel(
        per_token=1.0,
        per_token_squared=9.555e-05,
        per_patch=0.4068,
        per_patch_squared=9.436e-06,
        source="fit:step_cost_h200_compiled_diag",
    ),
}


def cost_model_names() -> tuple[str, ...]:
    """The names :func:`named_cost_model` resolves: the shapes, then the fitted models."""
    return (*SHAPES, *FITTED)


#: what ``cost_model`` accepts, for the fix of every error about it
ACCEPTED = (
    "a shape or fitted name ({names}), a path to a fitted cost-model JSON (StepCostModel.as_dict()), a Qwen2-VL / "
    "Qwen2.5-VL / Qwen3-VL transformers config or model, or a Megatron-Bridge Qwen-VL model provider (cfg.model)"
)


def _bad(problem: str, fix: str | None = None) -> Exception:
    from energon_pack.errors import ConfigError

    return ConfigError("cost_model", problem, fix or "pass " + ACCEPTED.format(names=", ".join(cost_model_names())))


def named_cost_model(name: str) -> StepCostModel:
    """A fitted model of :data:`FITTED`, the FLOP-derived model of a :data:`SHAPES` shape, or the model of a
    fitted cost-model JSON file (a path ending in ``.json``; :func:`cost_model_from_file`)."""
    if name in FITTED:
        return FITTED[name]
    if name in SHAPES:
        return StepCostModel.from_shape(name)
    if str(name).endswith(".json"):
        return cost_model_from_file(name)
    raise _bad(f"unknown step-cost model {name!r}")


#: the coefficients of a cost-model JSON file (the first two required), as :meth:`StepCostModel.as_dict` writes them
COEFFICIENTS = ("per_token", "per_token_squared", "per_patch", "per_window_patch", "per_patch_squared")


def cost_model_from_dict(data: Any, where: str = "the cost model") -> StepCostModel:
    """A :class:`StepCostModel` from :meth:`StepCostModel.as_dict` data: finite non-negative coefficients
    (``per_token`` > 0 and ``per_token_squared`` required), an optional ``source`` string; other keys starting
    with ``per_`` are refused (a misspelt coefficient would price nothing), the rest (fit metadata) ignored."""
    if not isinstance(data, Mapping):
        raise _bad(f"{where} is a {type(data).__name__}, not a JSON object of coefficients")
    unknown = sorted(k for k in data if str(k).startswith("per_") and k not in COEFFICIENTS)
    missing = [k for k in COEFFICIENTS[:2] if k not in data]
    if unknown or missing:
        what = f"has unknown coefficient {unknown[0]!r}" if unknown else f"has no {missing[0]!r}"
        raise _bad(f"{where} {what}", f"write the coefficients {', '.join(COEFFICIENTS)} (StepCostModel.as_dict())")
    values = {}
    for key in COEFFICIENTS:
        value = data.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise _bad(f"{where} has {key}={value!r}", "every coefficient is a finite number >= 0")
        values[key] = float(value)
    if values["per_token"] <= 0:
        raise _bad(f"{where} has per_token=0", "per_token is the unit of the costs: 1.0 for a fitted model")
    source = data.get("source", "custom")
    if not isinstance(source, str):
        raise _bad(f"{where} has source={source!r}", "source is a string (e.g. 'fit:<run>') or absent")
    return StepCostModel(**values, source=source)


def cost_model_from_file(path: str | os.PathLike) -> StepCostModel:
    """The model of a fitted cost-model JSON file: one object as :meth:`StepCostModel.as_dict` writes it
    (``cost_model_from_dict``); its ``source`` defaults to ``file:<name>``."""
    name = os.path.basename(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise _bad(f"cannot read the cost-model file {os.fspath(path)!r} ({e.strerror or e})") from None
    except ValueError as e:
        raise _bad(
            f"the cost-model file {os.fspath(path)!r} is not JSON ({e})",
            "write StepCostModel.as_dict() with json.dump",
        ) from None
    if isinstance(data, Mapping) and "source" not in data:
        data = {**data, "source": f"file:{name}"}
    return cost_model_from_dict(data, where=f"the cost-model file {name!r}")


def _field(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


def _vision_shape(v: Any, out_hidden: int) -> VisionShape:
    """A transformers Qwen-VL vision config (also what Bridge providers hold as ``vision_config``)."""
    patch = int(v.patch_size)
    common = dict(patch_size=patch, temporal_patch_size=int(_field(v, "temporal_patch_size", default=2)))
    common["merge_size"] = int(_field(v, "spatial_merge_size", default=2))
    if getattr(v, "embed_dim", None) is not None:  # Qwen2-VL: blocks embed_dim wide, MLP mlp_ratio x, hidden_size out
        width = int(v.embed_dim)
        intermediate = int(width * float(_field(v, "mlp_ratio", default=4)))
        return VisionShape(
            width, int(v.depth), intermediate, int(_field(v, "hidden_size", default=out_hidden)), **common
        )
    width, intermediate = int(v.hidden_size), int(v.intermediate_size)
    out = int(_field(v, "out_hidden_size", default=out_hidden))
    full = getattr(v, "fullatt_block_indexes", None)
    if full is not None:  # Qwen2.5-VL: gated MLP, windowed blocks except the full-attention ones
        window = (int(_field(v, "window_size", default=112)) // patch) ** 2
        return VisionShape(width, int(v.depth), intermediate, out, gated_mlp=True, full_blocks=len(full),
                           window_patches=window, **common)  # fmt: skip
    deepstack = len(getattr(v, "deepstack_visual_indexes", None) or ())  # Qwen3-VL: a merger per deepstack block
    return VisionShape(width, int(v.depth), intermediate, out, extra_mergers=deepstack, **common)


def shape_from_config(config: Any) -> ModelShape:
    """The :class:`ModelShape` of a transformers Qwen2-VL / Qwen2.5-VL / Qwen3-VL config (its ``text_config`` and
    ``vision_config``, or the text fields at its top level), or of a Megatron-Bridge model provider (Megatron's
    names: ``num_layers``, ``ffn_hidden_size``, ``num_query_groups``, ``kv_channels``; its ``vision_config``); named
    after the :data:`SHAPES` entry it equals, else ``<model_type>-<hidden>x<layers>``."""
    try:
        if getattr(config, "num_layers", None) is not None and getattr(config, "ffn_hidden_size", None) is not None:
            t, heads = config, int(config.num_attention_heads)  # Megatron-Core / Bridge provider
            llm = LLMShape(
                hidden=int(t.hidden_size),
                layers=int(t.num_layers),
                intermediate=int(t.ffn_hidden_size),
                heads=heads,
                kv_heads=int(_field(t, "num_query_groups", default=heads)),
                head_dim=int(_field(t, "kv_channels", default=int(t.hidden_size) // heads)),
                vocab=int(_field(t, "vocab_size", "padded_vocab_size")),
                gated_mlp=bool(_field(t, "gated_linear_unit", default=True)),
            )
        else:
            t = _field(config, "text_config", default=config)
            heads = int(t.num_attention_heads)
            llm = LLMShape(
                hidden=int(t.hidden_size),
                layers=int(t.num_hidden_layers),
                intermediate=int(t.intermediate_size),
                heads=heads,
                kv_heads=int(_field(t, "num_key_value_heads", default=heads)),
                head_dim=int(_field(t, "head_dim", default=int(t.hidden_size) // heads)),
                vocab=int(_field(t, "vocab_size", default=_field(config, "vocab_size"))),
            )
        v = getattr(config, "vision_config", None)
        vision = _vision_shape(v, llm.hidden) if v is not None else None
    except (AttributeError, TypeError, ValueError) as e:
        kind = type(config).__name__
        raise _bad(f"cannot read a model shape from the {kind} ({e})") from None
    for shape in SHAPES.values():
        if shape.llm == llm and shape.vision == vision:
            return shape
    kind = str(_field(config, "model_type", default=type(config).__name__)).lower()
    return ModelShape(f"{kind}-{llm.hidden}x{llm.layers}", llm, vision)


def cost_model_from(spec: Any) -> StepCostModel:
    """Every form ``cost_model=`` accepts, resolved: a :class:`StepCostModel` (as it is), a name or a ``.json`` path
    (:func:`named_cost_model`), a path object, a mapping (:func:`cost_model_from_dict`), a :class:`ModelShape`, a
    transformers model (its ``config``) or config, or a Megatron-Bridge model provider (:func:`shape_from_config`).
    Anything else is one ConfigError naming ``cost_model``."""
    if isinstance(spec, StepCostModel):
        return spec
    if isinstance(spec, str):
        return named_cost_model(spec)
    if isinstance(spec, os.PathLike):
        return cost_model_from_file(spec)
    if isinstance(spec, Mapping):
        return cost_model_from_dict(spec)
    if isinstance(spec, ModelShape):
        return StepCostModel.from_shape(spec)
    config = spec
    if getattr(spec, "config", None) is not None and getattr(spec, "num_layers", None) is None:
        config = spec.config  # a transformers model
    if getattr(config, "vision_config", None) is None and getattr(config, "text_config", None) is None:
        if getattr(config, "num_hidden_layers", None) is None and getattr(config, "num_layers", None) is None:
            raise _bad(f"a {type(spec).__name__} is not a model, config or cost model")
    return StepCostModel.from_shape(shape_from_config(config))


#: what a stable name says of a model chosen by the default rule (no ``cost_model`` given, no model seen)
DEFAULT_MARK = " (default)"


def cost_model_name(model: StepCostModel, *, defaulted: bool = False) -> str:
    """A stable name of a resolved model for stats and the resume fingerprint: its source and a short hash of its
    coefficients (``flops:qwen2.5-vl-3b#1a2b3c4d``), marked when the default rule chose it."""
    digest = hashlib.blake2b(repr([getattr(model, k) for k in COEFFICIENTS]).encode(), digest_size=4).hexdigest()
    return f"{model.source}#{digest}{DEFAULT_MARK if defaulted else ''}"


def same_cost_model(saved: Any, current: Any) -> bool:
    """Whether a saved ``cost_model`` entry (a stable name; a name or None in states saved before stable names)
    prices as ``current`` (a stable name): None meant the road's default, so it matches a defaulted model."""
    if saved is None or current is None:
        return saved == current or str(saved if current is None else current).endswith(DEFAULT_MARK)

    def canonical(value: Any) -> Any:
        if isinstance(value, str) and value in cost_model_names():
            return cost_model_name(named_cost_model(value))
        return value.removesuffix(DEFAULT_MARK) if isinstance(value, str) else value

    return canonical(saved) == canonical(current)


#: the shape ``balance="compute"`` prices when the road knows neither ``cost_model`` nor the model: the preset
#: version's 7B/8B model (by ``rope_style``), Qwen2.5-VL-7B for a text road
DEFAULT_SHAPES = {"qwen2": "qwen2-vl-7b", "qwen2.5": "qwen2.5-vl-7b", "qwen3": "qwen3-vl-8b"}
DEFAULT_SHAPE = DEFAULT_SHAPES["qwen2.5"]

_log = logging.getLogger("energon_pack")
_said: set[str] = set()


def _say_once(level: int, message: str) -> None:
    if message not in _said:
        _said.add(message)
        _log.log(level, message)


def resolve_cost_model(
    cost_model: Any = None, *, seen_model: Any = None, default_shape: str = DEFAULT_SHAPE, road: str = "this road"
) -> tuple[StepCostModel, str]:
    """The one default rule of ``balance="compute"``, for every road: ``(model, stable name)``.

    ``cost_model`` given: that model (:func:`cost_model_from`). Otherwise the model the road can see
    (``seen_model``: e.g. Bridge's ``cfg.model``), said in one INFO line per process; otherwise ``default_shape``
    (the preset's), said in one WARNING line per process naming the knob and how to name the right model."""
    if cost_model is not None:
        model = cost_model_from(cost_model)
        return model, cost_model_name(model)
    how = (
        "pass cost_model=<your transformers config or model, a Megatron-Bridge model provider, a shape name of "
        f"{', '.join(cost_model_names())}, or a fitted cost-model JSON> to price the model you train"
    )
    if seen_model is not None:
        try:
            model = cost_model_from(seen_model)
        except Exception as e:  # noqa: BLE001 - a model we cannot read falls back to the default, said below
            _say_once(logging.WARNING, f"balance='compute' cannot price the model of {road} ({e})")
        else:
            name = cost_model_name(model)
            _say_once(logging.INFO, f"balance='compute' prices {model.source.removeprefix('flops:')} ({name}), the "
                                    f"model of {road}")  # fmt: skip
            return model, name
    model = named_cost_model(default_shape)
    _say_once(logging.WARNING, f"balance='compute' prices {default_shape} ({road}'s default shape); {how}")
    return model, cost_model_name(model, defaulted=True)
