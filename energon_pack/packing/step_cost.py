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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

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


def named_cost_model(name: str) -> StepCostModel:
    """A fitted model of :data:`FITTED`, or the FLOP-derived model of a :data:`SHAPES` shape."""
    if name in FITTED:
        return FITTED[name]
    if name not in SHAPES:
        from energon_pack.errors import ConfigError

        raise ConfigError(
            "cost_model", f"unknown step-cost model {name!r}", f"use one of {', '.join(cost_model_names())}"
        )
    return StepCostModel.from_shape(name)
