"""``energon-pack inspect FILE.jsonl``: counts, length percentiles, skips by reason, packing fill.

The fill is what :class:`TokenBudgetBatchSampler` reaches at the width (real tokens over
``packs x width``), next to Megatron-Bridge's in-batch baseline that concatenates MBS rows as
given (no bin packing), at the largest MBS whose rows overflow the width at most 1% of the time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .dataset import JsonlSFTDataset
from .sampler import TokenBudgetBatchSampler

PERCENTILES = (50, 90, 95, 99)
MAX_OVERFLOW = 0.01


def load_tokenizer(spec: Any = None) -> Any:
    """None -> the shipped demo tokenizer; a ``tokenizer.json`` path or a local HF directory (never downloads)."""
    from ..chat.tokenizer import load_demo_tokenizer

    if spec is None or spec == "demo":
        return load_demo_tokenizer()
    if not isinstance(spec, (str, os.PathLike)):
        return spec
    path = Path(spec)
    if path.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))
    if path.is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    raise FileNotFoundError(f"tokenizer not found: {str(spec)!r} (give a tokenizer.json file or a local directory)")


def concat_baseline(lengths: np.ndarray, width: int, mbs: int, seed: int = 0) -> dict[str, float]:
    """Bridge's in-batch packing: MBS shuffled rows concatenated as given, each row ``width`` slots."""
    order = np.random.default_rng(seed).permutation(lengths)
    rows = np.add.reduceat(order, np.arange(0, len(order), mbs)) if len(order) else np.zeros(0, np.int64)
    fill = float(np.minimum(rows, width).sum()) / (len(rows) * width) if len(rows) else 0.0
    return {"mbs": mbs, "fill": fill, "rows": int(len(rows)), "overflow_rate": float((rows > width).mean()) if len(rows) else 0.0}


def best_baseline(lengths: np.ndarray, width: int, seed: int = 0) -> dict[str, float]:
    """The concat baseline at the largest MBS whose rows exceed the width at most 1% of the time."""
    best = concat_baseline(lengths, width, 1, seed)
    for mbs in range(2, max(2, width // max(1, int(lengths.min(initial=1))) + 1)):
        trial = concat_baseline(lengths, width, mbs, seed)
        if trial["overflow_rate"] > MAX_OVERFLOW:
            break
        best = trial
    return best


def inspect_jsonl(path: str | os.PathLike, *, tokenizer: Any = None, format: str = "prompt_completion", width: int = 4096,
                  pad_multiple: int = 1, window: int = 4096, max_length: int | None = None, overlength: str = "skip",
                  seed: int = 0, **format_kw: Any) -> dict[str, Any]:
    """The report as a dict (see :func:`format_report`); runs (or reuses) the cached length pass."""
    ds = JsonlSFTDataset(path, load_tokenizer(tokenizer), format, max_length=max_length, overlength=overlength, **format_kw)
    lengths = np.asarray(ds.lengths, dtype=np.int64)
    good = lengths[lengths > 0]
    sampler = TokenBudgetBatchSampler(lengths, width, pad_multiple=pad_multiple, window=window, seed=seed)
    stats = sampler.stats
    first_lines: dict[str, list[int]] = {}
    for line, reason, _ in ds.skipped_lines:
        if len(first_lines.setdefault(reason, [])) < 5:
            first_lines[reason].append(line)
    return {
        "file": str(ds.path), "format": format, "lines": len(ds), "usable": int(len(good)),
        "skips": {r: {"count": n, "first_lines": first_lines.get(r, [])} for r, n in sorted(ds.skips.items())},
        "tokens": int(good.sum()),
        "length": {"min": int(good.min()) if len(good) else 0, "mean": float(good.mean()) if len(good) else 0.0,
                   **{f"p{p}": float(np.percentile(good, p)) if len(good) else 0.0 for p in PERCENTILES},
                   "max": int(good.max(initial=0))},
        "packing": {"width": width, "pad_multiple": pad_multiple, "window": window, "packs": stats.packs,
                    "fill": stats.fill, "mean_samples_per_pack": stats.mean_samples_per_pack,
                    "over_width": int(stats.skips.get("over_width", 0))},
        "baseline_concat": best_baseline(good, width, seed) if len(good) else None,
    }


def format_report(report: dict[str, Any]) -> str:
    """A short human-readable table of :func:`inspect_jsonl`'s dict."""
    L, P, B = report["length"], report["packing"], report["baseline_concat"]
    out = [f"{report['file']} ({report['format']})",
           f"  lines {report['lines']}, usable {report['usable']}, skipped {report['lines'] - report['usable']}, tokens {report['tokens']}",
           "  length  " + "  ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in L.items())]
    for reason, info in report["skips"].items():
        out.append(f"  skip {reason:<20} {info['count']:>8}  first lines {info['first_lines']}")
    out.append(f"  packer  width {P['width']} (align {P['pad_multiple']}): {P['packs']} packs, fill {P['fill']:.2%}, "
               f"{P['mean_samples_per_pack']:.1f} samples/pack, {P['over_width']} over the width")
    if B:
        out.append(f"  baseline concat MBS={B['mbs']}: fill {B['fill']:.2%} ({B['overflow_rate']:.1%} rows over the width)")
    return "\n".join(out)


def main(path: str | os.PathLike, *, json_out: str | os.PathLike | None = None, **kw: Any) -> int:
    """CLI entry: print the report (and write it as JSON); 0 when at least one line is usable."""
    report = inspect_jsonl(path, **kw)
    print(format_report(report))
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(report, indent=2))
    return 0 if report["usable"] else 1
