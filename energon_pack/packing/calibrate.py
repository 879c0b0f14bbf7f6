"""Calibrate the step-cost model on your own GPU: a short run's step times and pack terms -> a fitted cost-model file.

A training step's time is, to a good approximation, linear in the terms :class:`~.step_cost.StepCostModel` prices:

    ms = intercept + a * slots + b * tokens_squared + c * patches + d * patches_squared

(``slots``: the token positions the step computes, padding included; the other terms as
:meth:`StepCostModel.pack_terms`). Each recorded step is a :class:`StepTimeRecord` (its seconds and the terms of
the micro-batches it trained, :func:`pack_cost_terms` of each); :func:`fit_cost_model` drops the warm-up steps,
fits the terms' coefficients by non-negative least squares (Lawson-Hanson's active set, below: a negative cost
would be an artefact of terms that move together; the intercept is free) and returns the fitted
:class:`StepCostModel` in token-equivalents (the per-slot cost is the unit) with a :class:`FitReport` (R^2,
residual spread, what was dropped).
:func:`write_cost_model` saves it as the JSON ``cost_model="path.json"`` loads.

The recorders (``energon_pack.integrations.step_times``) write the records; ``energon-pack calibrate`` fits them.
Record on one GPU: with data parallelism every rank's step waits for the slowest, so its time is not its own pack's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from energon_pack.errors import ConfigError

from .step_cost import StepCostModel, cost_model_name

#: the terms a step's time is fitted on, each with the StepCostModel coefficient it becomes (``slots``: the unit)
FIT_TERMS = {
    "slots": "per_token",
    "tokens_squared": "per_token_squared",
    "patches": "per_patch",
    "patches_squared": "per_patch_squared",
}
#: the counts a record carries beside the fitted terms (what a residual can be checked against)
COUNT_TERMS = ("tokens", "segments", "images", "videos", "micro_batches")
#: the fewest steps a fit takes (after the warm-up)
MIN_STEPS = 8
#: the R^2 below which a fit is not usable as a cost model (``energon-pack calibrate`` exits 2)
MIN_R2 = 0.8
#: warm-up steps dropped by default (allocator growth, autotuning, compilation)
DEFAULT_WARMUP = 3
#: the key of a batch's grids per kind of medium
GRID_KEYS = ("image_grid_thw", "video_grid_thw")


# ---------------------------------------------------------------------------------------------- terms of a batch
def _ints(value: Any) -> list:
    """A tensor / array / list as nested Python ints (a device tensor syncs here: call it after the step)."""
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _grids(batch: Mapping[str, Any]) -> tuple[list[list[int]], int, int]:
    """The batch's (t, h, w) patch grids, images then videos, and their counts (also inside Bridge's
    ``visual_inputs`` object)."""
    visual = batch.get("visual_inputs")
    found: list[list[list[int]]] = []
    for key in GRID_KEYS:
        grid = batch.get(key)
        if grid is None and visual is not None:
            grid = getattr(visual, key, None)
        rows = [[int(x) for x in row] for row in _ints(grid)] if grid is not None else []
        found.append([row for row in rows if len(row) == 3])
    return found[0] + found[1], len(found[0]), len(found[1])


def _segments(batch: Mapping[str, Any]) -> tuple[list[int], int]:
    """The batch's segment lengths (zero-length static padding segments left out) and its token slots."""
    ids = batch.get("input_ids")
    slots = int(np.prod(ids.shape)) if hasattr(ids, "shape") else None
    for key in ("cu_seqlens_q", "cu_seq_lens_q", "cu_seqlens"):
        cu = batch.get(key)
        if cu is None:
            continue
        flat = np.asarray(_ints(cu), dtype=np.int64).reshape(-1)
        flat = flat[: int(np.argmax(flat < 0))] if (flat < 0).any() else flat  # Bridge pads cu_seqlens with -1
        lengths = [int(x) for x in np.diff(flat) if x > 0]
        return lengths, slots if slots is not None else int(flat[-1] - flat[0])
    if ids is None:
        raise ConfigError(
            "batch",
            f"has neither cu_seqlens nor input_ids (keys: {sorted(batch)})",
            "pass a packed THD batch (cu_seqlens_q, image_grid_thw, video_grid_thw) or the model's forward kwargs",
        )
    rows = np.asarray(_ints(ids)).reshape(-1, ids.shape[-1])  # unpacked rows: each row one segment
    mask = batch.get("attention_mask")
    lengths = [int(x) for x in np.asarray(_ints(mask)).reshape(len(rows), -1).sum(-1)] if mask is not None else None
    return [x for x in lengths or [rows.shape[1]] * len(rows) if x > 0], int(rows.size)


def pack_cost_terms(batch: Mapping[str, Any]) -> dict[str, float]:
    """The cost terms of one micro-batch, the one function both recorders use.

    Reads our THD batch (``cu_seqlens_q``: logical segments, what the packer priced), the HF forward kwargs of
    ``hf_forward_kwargs`` / ``PackedCollator`` (``cu_seq_lens_q``: the segments HF's varlen attention runs), Bridge's
    batch (``cu_seqlens_q`` or legacy ``cu_seqlens``; grids in ``visual_inputs``), or unpacked rows (each row one
    segment); ``image_grid_thw`` / ``video_grid_thw`` give the media. ``slots`` is the row width (padding included:
    the GPU computes it), ``tokens`` the segments' sum."""
    lengths, slots = _segments(batch)
    grids, images, videos = _grids(batch)
    return {
        "slots": float(slots),
        **StepCostModel.pack_terms(lengths, grids),
        "segments": float(len(lengths)),
        "images": float(images),
        "videos": float(videos),
        "micro_batches": 1.0,
    }


def sum_terms(terms: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The terms of one optimizer step: the sum over its micro-batches' :func:`pack_cost_terms`."""
    total = dict.fromkeys((*FIT_TERMS, *COUNT_TERMS), 0.0)
    for t in terms:
        for key in total:
            total[key] += float(t.get(key, 0.0))
    return total


# ---------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class StepTimeRecord:
    """One optimizer step: its index, its time in seconds and the terms of what it trained (:func:`sum_terms`).

    One JSON line each (:meth:`as_json`): ``{"step": 7, "seconds": 0.412, "slots": 8192.0, ...}``."""

    step: int
    seconds: float
    terms: Mapping[str, float] = field(default_factory=dict)

    def as_json(self) -> str:
        return json.dumps({"step": self.step, "seconds": self.seconds, **self.terms})

    @classmethod
    def from_dict(cls, data: Any, where: str = "a step record") -> StepTimeRecord:
        """A record from its JSON object; anything else is one ConfigError naming the record."""
        fix = "write the steps with energon_pack.integrations.step_times (StepTimeCallback or StepTimer)"
        if not isinstance(data, Mapping):
            raise ConfigError("steps", f"{where} is a {type(data).__name__}, not a JSON object", fix)
        missing = [k for k in ("step", "seconds", *FIT_TERMS) if k not in data]
        if missing:
            raise ConfigError("steps", f"{where} has no {missing[0]!r}", fix)
        values = {}
        for key in ("seconds", *FIT_TERMS, *COUNT_TERMS):
            value = data.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError("steps", f"{where} has {key}={value!r}", "every term is a finite number >= 0")
            values[key] = float(value)
        if values["seconds"] <= 0:
            raise ConfigError("steps", f"{where} has seconds={data['seconds']!r}", "a step takes a positive time")
        seconds = values.pop("seconds")
        return cls(step=int(data["step"]), seconds=seconds, terms=values)


def read_step_times(path: str | os.PathLike) -> tuple[list[StepTimeRecord], int]:
    """The records of a step-times JSONL file and how many lines were skipped: only a cut last line (a run killed
    mid-write) is skipped; any other bad line is one ConfigError naming the file and line."""
    name = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError(
            "steps", f"cannot read {name!r} ({e.strerror or e})", "pass the JSONL the recorder wrote"
        ) from None
    records, skipped = [], 0
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    for n, (i, line) in enumerate(numbered):
        try:
            data = json.loads(line)
        except ValueError:
            if n == len(numbered) - 1 and not line.rstrip().endswith("}"):
                skipped += 1  # cut by a killed run
                continue
            raise ConfigError(
                "steps", f"{name} line {i} is not JSON", "pass the JSONL StepTimeCallback / StepTimer wrote"
            ) from None
        records.append(StepTimeRecord.from_dict(data, where=f"{name} line {i}"))
    return records, skipped


# ---------------------------------------------------------------------------------------------- the fit
def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0: Lawson and Hanson's active-set method (their NNLS, 1974), each inner
    solve a numpy ``lstsq`` over the free columns. ``a`` should have columns of similar scale."""
    m, n = a.shape
    x = np.zeros(n)
    free = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(float(np.abs(a).sum(0).max()), 1.0)
    for _ in range(3 * n + 3):
        gradient = a.T @ (b - a @ x)
        candidates = np.where(~free, gradient, -np.inf)
        if free.all() or candidates.max() <= tol:
            break
        free[int(np.argmax(candidates))] = True
        while True:
            trial = np.zeros(n)
            trial[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if (trial[free] > 0).all():
                x = trial
                break
            blocked = free & (trial <= 0)
            step = np.min(x[blocked] / (x[blocked] - trial[blocked]))
            x = x + step * (trial - x)
            free &= x > tol
            x[~free] = 0.0
    return x


@dataclass(frozen=True)
class FitReport:
    """What a fit says about itself.

    Attributes:
        name: the run's name (the model's source is ``fit:<name>``).
        steps: steps fitted; ``warmup`` dropped before them; ``skipped_lines`` cut lines of the file.
        coefficients_ms: ms per unit of each term, >= 0, and ``intercept`` (ms per step, free: not priced).
        terms_kept: terms with a positive coefficient; ``not_separable``: terms no different from the ones before
            them in these steps (e.g. ``patches_squared`` when every image has one size), fitted as 0.
        r2: the fit's R^2; ``residual_cv``: the residuals' std over the mean step; ``residual_max``: the largest
            residual over the mean step; ``mean_step_ms``.
        method: how the coefficients were constrained.
    """

    name: str
    steps: int
    warmup: int
    coefficients_ms: dict[str, float]
    terms_kept: list[str]
    not_separable: list[str]
    r2: float
    residual_cv: float
    residual_max: float
    mean_step_ms: float
    residuals_ms: list[float]
    skipped_lines: int = 0
    method: str = "nnls (Lawson-Hanson active set, columns scaled and centred; the intercept free)"

    @property
    def usable(self) -> bool:
        """Whether the fit explains the steps well enough to balance packs by it (R^2 >= :data:`MIN_R2`)."""
        return self.r2 >= MIN_R2

    def token_equivalents(self) -> dict[str, float] | None:
        """The fitted coefficients over the per-slot one (the unit of a cost model), None when that is 0."""
        unit = self.coefficients_ms["slots"]
        return {FIT_TERMS[k]: self.coefficients_ms[k] / unit for k in FIT_TERMS} if unit > 0 else None

    def cost_model(self) -> StepCostModel:
        """The fitted :class:`StepCostModel` (source ``fit:<name>``); a per-slot cost of 0 is a ConfigError."""
        prices = self.token_equivalents()
        if prices is None:
            raise ConfigError(
                "steps",
                "the fitted cost of a token slot is 0 (the step times do not grow with the steps' lengths)",
                "record steps of different lengths, after the warm-up, on one GPU",
            )
        return StepCostModel(**prices, source=f"fit:{self.name}")

    def as_dict(self) -> dict[str, Any]:
        """The report without its per-step residuals (what the cost-model file keeps)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "residuals_ms"}
        return {**out, "min_r2": MIN_R2, "usable": self.usable}


def fit_step_times(
    terms: Sequence[Mapping[str, float]],
    ms: Sequence[float],
    *,
    name: str = "run",
    extra: Sequence[str] = (),
    warmup: int = 0,
    skipped_lines: int = 0,
) -> FitReport:
    """The regression alone: step ``ms`` on an intercept, the :data:`FIT_TERMS` and ``extra`` terms of each step
    (e.g. a count a residual may follow; reported, not priced by the model): the terms' coefficients >= 0
    (:func:`nnls` on columns scaled to 1 and centred), the intercept free (a step's fixed cost, which no pack
    changes, is not priced; pinning it at 0 would bend the terms' prices). A term that is constant, or no
    different from the terms before it, is fitted as 0 (the latter listed in ``not_separable``).
    :func:`fit_cost_model` adds the refusals a cost model needs."""
    names = (*FIT_TERMS, *extra)
    y = np.asarray(ms, dtype=float)
    if not len(y):
        raise ConfigError("steps", "there are no steps to fit", "record steps (StepTimeCallback / StepTimer)")
    x = np.asarray([[1.0, *(float(t.get(k, 0.0)) for k in names)] for t in terms], dtype=float)
    scale = np.abs(x).max(0)
    scale[scale == 0] = 1.0
    xs = x / scale
    columns, not_separable = [0], []
    for j in range(1, x.shape[1]):
        if xs[:, j].std() == 0:
            continue
        if np.linalg.matrix_rank(xs[:, [*columns, j]], tol=1e-9 * len(y)) > len(columns):
            columns.append(j)
        else:
            not_separable.append(names[j - 1])
    coef = np.zeros(x.shape[1])
    terms_at = columns[1:]  # the intercept is free: the terms' NNLS on centred columns, the intercept from the means
    if terms_at:
        centred = xs[:, terms_at] - xs[:, terms_at].mean(0)
        coef[terms_at] = nnls(centred, y - y.mean()) / scale[terms_at]
    coef[0] = float(y.mean() - x[:, 1:].mean(0) @ coef[1:])
    residual = y - x @ coef
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / spread if spread > 0 else 0.0
    full = dict(zip(("intercept", *names), (float(c) for c in coef)))
    mean = float(y.mean())
    return FitReport(
        name=name,
        steps=len(y),
        warmup=warmup,
        coefficients_ms=full,
        terms_kept=["intercept", *(k for k, c in full.items() if k != "intercept" and c > 0)],
        not_separable=not_separable,
        r2=round(r2, 4),
        residual_cv=round(float(residual.std() / mean), 4),
        residual_max=round(float(np.abs(residual).max() / mean), 4),
        mean_step_ms=round(mean, 3),
        residuals_ms=residual.tolist(),
        skipped_lines=skipped_lines,
    )


def fit_cost_model(
    records: Sequence[StepTimeRecord], *, name: str = "run", warmup: int = DEFAULT_WARMUP, skipped_lines: int = 0
) -> tuple[StepCostModel, FitReport]:
    """The step-cost model of recorded steps: the first ``warmup`` records (in order) dropped, the rest fitted
    (:func:`fit_step_times`), the model in token-equivalents (:meth:`FitReport.cost_model`, source ``fit:<name>``).

    Refused (one ConfigError naming ``steps``): fewer than :data:`MIN_STEPS` steps after the warm-up, steps that
    all compute one slot count (the per-token cost cannot be told from the fixed one), a per-token cost fitted to 0.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError("warmup", f"is {warmup!r}", "pass the number of first steps to drop, an int >= 0")
    kept = list(records)[warmup:]
    if len(kept) < MIN_STEPS:
        raise ConfigError(
            "steps",
            f"{len(kept)} steps after the {min(warmup, len(records))} warm-up steps; a fit needs at least {MIN_STEPS}",
            "record more steps (or drop fewer with warmup)",
        )
    slots = {r.terms["slots"] for r in kept}
    if len(slots) == 1:
        raise ConfigError(
            "steps",
            f"every step computes {int(slots.pop())} token slots, so the per-token cost cannot be told from the fixed "
            "cost of a step",
            "record steps of different lengths (packs of several widths, or packs not padded to one width)",
        )
    report = fit_step_times(
        [r.terms for r in kept],
        [r.seconds * 1e3 for r in kept],
        name=name,
        warmup=min(warmup, len(records)),
        skipped_lines=skipped_lines,
    )
    return report.cost_model(), report


def write_cost_model(path: str | os.PathLike, model: StepCostModel, report: FitReport) -> str:
    """Save the fitted model as a cost-model JSON (:meth:`StepCostModel.as_dict` plus the report under ``"fit"``),
    the file ``cost_model="path.json"`` loads; returns the model's stable name (what stats and fingerprints say)."""
    data = {**model.as_dict(), "fit": report.as_dict()}
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return cost_model_name(model)
