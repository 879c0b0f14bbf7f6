"""Bin packing over multi-budget integer costs: offline FFD/BFD, the streaming OnlinePacker, stats.

Pure Python + numpy: no torch, no Energon, so it is reusable by every loader path. The packing spec
(:mod:`.spec`, built on the THD layout) is imported on first use.
"""

from typing import Any

from .balanced import ComputeBalancedPacker
from .costs import Cost, as_capacity, as_cost, as_cost_matrix
from .offline import BinPacking, OversizeError, best_fit_decreasing, decreasing_order, first_fit_decreasing
from .online import OnlinePacker
from .stats import PackingStats, PackingStatsTracker
from .step_cost import FITTED, SHAPES, StepCostModel, cost_model_names, named_cost_model

__all__ = [
    "FITTED",
    "SHAPES",
    "BinPacking",
    "ComputeBalancedPacker",
    "Cost",
    "OnlinePacker",
    "OversizeError",
    "PackingStats",
    "PackingStatsTracker",
    "StepCostModel",
    "as_capacity",
    "as_cost",
    "as_cost_matrix",
    "best_fit_decreasing",
    "cost_model_names",
    "decreasing_order",
    "first_fit_decreasing",
    "named_cost_model",
    "PackingSpec",
    "default_balance",
]

_SPEC_NAMES = ("PackingSpec", "default_balance")


def __getattr__(name: str) -> Any:
    """:class:`~.spec.PackingSpec` and its default rule, imported when first asked for (the spec needs torch's
    THD layout; the rest of this package does not)."""
    if name in _SPEC_NAMES:
        from . import spec

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
