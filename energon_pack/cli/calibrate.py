"""``energon-pack calibrate STEPS.jsonl --out cost_model.json``: fit the step-cost model to a run's recorded step
times (:func:`energon_pack.packing.calibrate.fit_cost_model`; the steps written by ``StepTimeCallback`` or
``StepTimer``), print the fit and the line that uses it, and write the fitted cost-model JSON. Exit status 2 with
one line when the fit is unusable: too few steps, steps of one length, or R^2 below the stated threshold."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import CliError
from .options import add_command, non_negative_int

NAME = "calibrate"
#: the knobs this command's flags set (library messages name these flags)
KNOB_FLAGS = {"warmup": "--warmup"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from energon_pack.packing.calibrate import DEFAULT_WARMUP

    p = add_command(subparsers, NAME, "fit the step-cost model to recorded step times: a cost_model file for your GPU")
    p.add_argument("steps", help="the step-times JSONL written by StepTimeCallback / StepTimer during a short run")
    p.add_argument("--out", required=True, help="the fitted cost-model JSON to write (cost_model='PATH' loads it)")
    p.add_argument("--name", default=None, help="the run's name in the model's source fit:NAME (default: --out's stem)")
    p.add_argument(
        "--warmup", type=non_negative_int, default=DEFAULT_WARMUP, help="first steps dropped (compilation, autotuning)"
    )
    return p


def fit_table(model: Any, report: Any) -> str:
    """The fit as printed: each term's ms and token-equivalent price, then R^2 and the residual spread."""
    from energon_pack.packing.calibrate import FIT_TERMS

    lines = [
        f"{'term':<18}{'ms per unit':>14}{'cost_model':>14}",
        f"{'intercept':<18}{report.coefficients_ms['intercept']:>14.4g}{'-':>14}",
    ]
    for term, field in FIT_TERMS.items():
        note = "  (not separable)" if term in report.not_separable else ""
        lines.append(f"{term:<18}{report.coefficients_ms[term]:>14.4g}{getattr(model, field):>14.4g}{note}")
    lines.append(
        f"{report.steps} steps ({report.warmup} warm-up dropped), mean {report.mean_step_ms:.1f} ms: R^2 "
        f"{report.r2:.4f}, residual cv {report.residual_cv:.2%}, max {report.residual_max:.2%} of the mean step"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from energon_pack.packing.calibrate import MIN_R2, fit_cost_model, read_step_times, write_cost_model

    records, skipped = read_step_times(args.steps)
    name = args.name or Path(args.out).stem
    model, report = fit_cost_model(records, name=name, warmup=args.warmup, skipped_lines=skipped)
    print(fit_table(model, report))
    if skipped:
        print(f"skipped {skipped} cut last line (a run stopped mid-write)")
    if not report.usable:
        raise CliError(
            f"R^2 {report.r2:.3f} is below {MIN_R2}: these step times do not follow the packs' cost terms; record "
            "more steps of different lengths on one GPU (and a longer --warmup) before using the fit"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    stable = write_cost_model(args.out, model, report)
    print(f"wrote {args.out} ({stable}); use it as cost_model={str(args.out)!r}")
    return 0
