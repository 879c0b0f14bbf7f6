"""Bin packing over multi-budget integer costs: offline FFD/BFD, the streaming OnlinePacker, stats.

Pure Python + numpy: no torch, no Energon, so it is reusable by every loader path (the packing spec, :mod:`.spec`,
imports the THD layer only when a spec is built or laid out).
"""

from .balanced import ComputeBalancedPacker
from .costs import Cost, as_capacity, as_cost, as_cost_matrix
from .offline import BinPacking, OversizeError, best_fit_decreasing, decreasing_order, first_fit_decreasing
from .online import OnlinePacker
from .spec import PackingSpec, default_balance
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
