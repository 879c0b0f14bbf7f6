"""The rules Megatron-Bridge imposes on packed THD training, in one table for its VLM and GPT-SFT roads.

Bridge enforces these itself only for its own packing (``ConfigContainer.validate``); with our dataset
providers nothing does, so both roads check them from here. :data:`SPEC_NAMES` is the one place where a
Bridge name (``model.context_parallel_size``, ``packed_sequence_size``, ``pad_seq_to_mult`` ...) becomes the
packing spec's name (``cp``, ``seq_length``, ``pad_multiple`` ...): one name per knob in our own API, Bridge's
own name wherever the user sets it in Bridge's config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ...errors import ConfigError
from ...packing.step_cost import cost_model_from
from ...thd import alignment_multiple

#: Bridge's names of the packing knobs -> the packing spec's names. Keys are Bridge config paths
#: (``ConfigContainer``), the names of its offline packs' metadata and ``PackedSequenceSpecs``.
SPEC_NAMES = {
    "model.context_parallel_size": "cp",
    "model.tensor_model_parallel_size": "tp",
    "model.sequence_parallel": "sp",
    "dist.eval_context_parallel_size": "eval_cp",
    "model.seq_length": "seq_length",
    "packed_sequence_size": "seq_length",
    "pack_size": "seq_length",
    "pad_seq_to_mult": "pad_multiple",
    "context_parallel_size": "cp",
    "tensor_model_parallel_size": "tp",
    "sequence_parallel": "sp",
}
#: the topology knobs, as Bridge's config holds them (the alignment ``pad_seq_to_mult`` follows from them)
TOPOLOGY = (
    "model.context_parallel_size",
    "model.tensor_model_parallel_size",
    "model.sequence_parallel",
    "dist.eval_context_parallel_size",
)
_UNSET = {"model.context_parallel_size": 1, "model.tensor_model_parallel_size": 1, "model.sequence_parallel": False}


def get(cfg: Any, path: str, default: Any = None) -> Any:
    """``cfg``'s value at a dotted attribute ``path`` (``"model.seq_length"``), ``default`` where any part is unset."""
    obj = cfg
    for part in path.split("."):
        if obj is None or not hasattr(obj, part):
            return default
        obj = getattr(obj, part)
    return obj


def topology(cfg: Any) -> dict[str, Any]:
    """The spec-named topology of a Bridge config: ``{"cp", "tp", "sp", "eval_cp"}`` (unset sizes are 1, SP off)."""
    out = {}
    for path in TOPOLOGY:
        value = get(cfg, path, None)
        out[SPEC_NAMES[path]] = (value or _UNSET[path]) if path in _UNSET else value
    out["sp"] = bool(out["sp"])
    return out


def spec_named(values: Mapping[str, Any]) -> dict[str, Any]:
    """Bridge-named packing values (metadata, ``PackedSequenceSpecs``) under the spec's names; others dropped."""
    return {SPEC_NAMES[k]: v for k, v in values.items() if k in SPEC_NAMES and v is not None}


def packing_knobs(cfg: Any) -> dict[str, Any]:
    """The packing spec's knobs a Bridge config sets, by the spec's names: the topology (:func:`topology`) and
    ``seq_length`` (``model.seq_length``, where set). ``BridgeQwenVLPackingTaskEncoder(..., **packing_knobs(cfg))``
    packs for the model as configured."""
    seq_length = get(cfg, "model.seq_length", None)
    return {**topology(cfg), **({"seq_length": seq_length} if seq_length is not None else {})}


def trained_model_cost(cfg: Any) -> Any:
    """``cfg.model`` (Bridge's model provider) as the step-cost model ``balance="compute"`` prices: a light
    ``StepCostModel`` an encoder carries into its loader workers; the model itself where its shape cannot be read
    (the encoder's default rule then says why in its log line); None where ``cfg`` has no model."""
    model = get(cfg, "model", None)
    if model is None:
        return None
    try:
        return cost_model_from(model)
    except ConfigError:
        return model


def topology_errors(cfg: Any, packs: Mapping[str, Any], *, packer: str, fix: Callable[[str, Any], str]) -> list:
    """One error per topology knob of ``cfg`` that differs from what ``packs`` (spec-named) were built for.

    Args:
        cfg: the Bridge config. packs: the packer's ``cp``/``tp``/``sp`` (and ``eval_cp`` when it has one).
        packer: who packs, in words ("the task encoder"). fix: (spec name, model value) -> how the packer changes.
    """
    model = topology(cfg)
    errors = []
    for path in TOPOLOGY:
        name = SPEC_NAMES[path]
        if name in packs and model[name] != packs[name]:
            errors.append(
                ConfigError(
                    path,
                    f"is {model[name]!r} but {packer} packs for {name}={packs[name]!r}",
                    f"{fix(name, model[name])} (or set {path}={packs[name]!r})",
                )
            )
    return errors


def model_alignment(cfg: Any) -> int:
    """The segment alignment (``pad_seq_to_mult``) Bridge's parallel sizes call for (0 where one is no size)."""
    t = topology(cfg)
    try:
        return alignment_multiple(t["cp"], t["tp"], t["sp"], t["eval_cp"])
    except ConfigError:  # a size that is no size, named by the checks
        return 0


def is_step(func: Any, module: str) -> bool:
    """Whether ``func`` (through ``functools.partial``) is Bridge's ``<module>.forward_step``."""
    while isinstance(func, partial):
        func = func.func
    return (getattr(func, "__module__", None), getattr(func, "__name__", None)) == (module, "forward_step")


@dataclass(frozen=True)
class Rule:
    """One setting Bridge's packed step needs: ``knob`` (its config path) must satisfy ``ok``.

    ``problem`` is formatted with the value (``{value!r}``); ``roads`` names where it applies: ``"vlm"``
    (:func:`~energon_pack.integrations.bridge.check_bridge_config`) and/or ``"gpt_sft"``."""

    knob: str
    ok: Callable[[Any], bool]
    problem: str
    fix: str
    roads: tuple[str, ...] = ("vlm", "gpt_sft")
    default: Any = None


def _is(value: Any) -> Callable[[Any], bool]:
    return lambda v: v is value


def _one_or_unset(v: Any) -> bool:
    return v in (None, 1)


_COMBINED_1F1B = "is True; the combined-1F1B schedule plan drops visual inputs and packed-sequence metadata"

#: Every config rule of Bridge's packed steps that is not about the packs themselves, in the order checked.
RULES: tuple[Rule, ...] = (
    Rule(
        "train.micro_batch_size",
        lambda v: v == 1,
        "is {value!r}; one packed THD row is one micro-batch",
        "set train.micro_batch_size=1 (and scale global_batch_size in packs)",
        roads=("vlm",),
    ),
    Rule(
        "validation.eval_micro_batch_size",
        _one_or_unset,
        "is {value!r}; validation packs are one THD row per micro-batch too",
        "set validation.eval_micro_batch_size=1 (or None: Bridge then uses train.micro_batch_size)",
        roads=("vlm",),
    ),
    Rule(
        "model.calculate_per_token_loss",
        _is(True),
        "is {value!r}; packs hold different numbers of supervised tokens, so a per-pack mean silently reweights "
        "the loss pack by pack",
        "set model.calculate_per_token_loss=True",
    ),
    Rule(
        "ddp.average_in_collective",
        _is(False),
        "is {value!r}; gradients must be summed and divided by the global token count",
        "set ddp.average_in_collective=False",
        default=False,
    ),
    Rule(
        "model.pipeline_model_parallel_size",
        _one_or_unset,
        "is {value}; Bridge's packed VLM path does not support pipeline parallelism",
        "set model.pipeline_model_parallel_size=1",
        roads=("vlm",),
    ),
    *(
        Rule(f"{owner}.{name}", lambda v: v is not True, _COMBINED_1F1B, f"set {owner}.{name}=False", roads=("vlm",))
        for owner in ("model", "comm_overlap", "comm_overlap.user_comm_overlap_cfg")
        for name in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")
    ),
    Rule(
        "model.dist_train.use_dist_train",
        lambda v: v is not True,
        "is True; Qwen3-VL DistTrain does not take packed batches",
        "disable DistTrain",
        roads=("vlm",),
    ),
)


def rule_errors(cfg: Any, road: str) -> list[ConfigError]:
    """The :data:`RULES` of ``road`` that ``cfg`` breaks, one error each."""
    errors = []
    for rule in RULES:
        if road in rule.roads:
            value = get(cfg, rule.knob, rule.default)
            if not rule.ok(value):
                errors.append(ConfigError(rule.knob, rule.problem.format(value=value), rule.fix))
    return errors


#: The step each road must run, by module: what reads our packs' keys.
STEPS = {"vlm": "megatron.bridge.training.vlm_step", "gpt_sft": "megatron.bridge.training.gpt_step"}
_STEP_WHY = {
    "vlm": "only vlm_step.forward_step reads visual_inputs and packed THD metadata (qwen3_vl_step rejects "
    "pre-packed batches)",
    "gpt_sft": "the GPT-SFT packs are read by Bridge's GPT step",
}


def forward_step_error(func: Callable | None, road: str) -> ConfigError | None:
    """The error for a ``forward_step_func`` that is not ``road``'s Bridge step; None when unchecked or right."""
    if func is None or is_step(func, STEPS[road]):
        return None
    inner = func
    while isinstance(inner, partial):
        inner = inner.func
    name = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__name__', inner)}"
    return ConfigError("forward_step_func", f"is {name}; {_STEP_WHY[road]}", f"pass {STEPS[road]}.forward_step")


def uses_cuda_graphs(cfg: Any) -> bool:
    """Whether ``cfg.model`` captures any CUDA graph of the training step."""
    return (
        get(cfg, "model.cuda_graph_impl", "none") not in (None, "none") or get(cfg, "model.enable_cuda_graph") is True
    )
