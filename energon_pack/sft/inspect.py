"""A JSONL file's report (``energon-pack inspect``): counts, length percentiles, skips by reason, packing fill.

The fill is what :class:`TokenBudgetBatchSampler` reaches at the width (real tokens over
``packs x width``, over the samples that fit the width), next to a baseline: Megatron-Bridge's
in-batch packing, which concatenates MBS samples as given (no bin packing), at the largest MBS
whose rows overflow the width at most 1% of the time, over the same samples that fit. When most
samples are longer than the width the baseline is dropped (``None``) and a hint says so.

``hints`` (printed under the table) name the likely mistake: most lines skipped with
``missing_field`` / ``bad_conversation`` (the report lists the fields the records do have and
which format fits them), or a width below most samples; they name the keywords of :func:`inspect_jsonl`
unless ``names`` says otherwise (the CLI passes its flags). ``tokenizer`` names the tokenizer
used (``demo`` is the offline demo tokenizer: not your model's lengths). ``cache`` says where the
line index and lengths are cached (never beside the file) and whether they were reused.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..packing.spec import alignment_knobs
from ..thd import accepts_old_width
from . import length_pass
from .dataset import JsonlSFTDataset
from .index import cache_folder, cache_key
from .sampler import TokenBudgetBatchSampler

PERCENTILES = (50, 90, 95, 99)
MAX_OVERFLOW = 0.01


#: a hint is given when at least this share of the lines (or of the usable samples) is affected
HINT_SHARE = 0.5
FIELD_SCAN_LINES = 2000
CHAT_FIELDS = ("messages", "conversations", "conversation")


def load_tokenizer(spec: Any = None, *, stacklevel: int = 3) -> Any:
    """:func:`energon_pack.chat.tokenizer.load_tokenizer` for ``inspect`` (``None`` warns: no silent default)."""
    from ..chat.tokenizer import load_tokenizer as load

    return load(spec, where="inspect", stacklevel=stacklevel + 1)


def concat_baseline(lengths: np.ndarray, width: int, mbs: int, seed: int = 0) -> dict[str, float]:
    """Bridge's in-batch packing: MBS shuffled rows concatenated as given, each row ``width`` slots."""
    order = np.random.default_rng(seed).permutation(lengths)
    rows = np.add.reduceat(order, np.arange(0, len(order), mbs)) if len(order) else np.zeros(0, np.int64)
    fill = float(np.minimum(rows, width).sum()) / (len(rows) * width) if len(rows) else 0.0
    return {
        "mbs": mbs,
        "fill": fill,
        "rows": int(len(rows)),
        "overflow_rate": float((rows > width).mean()) if len(rows) else 0.0,
    }


def record_fields(ds: JsonlSFTDataset, limit: int = FIELD_SCAN_LINES) -> Counter:
    """Top-level field names of the first ``limit`` JSON-object lines, with how many records have each."""
    from ..errors import SampleSkipped
    from ..records import decode_json_record

    fields: Counter = Counter()
    for i in range(min(limit, len(ds))):
        try:
            record = decode_json_record(ds.index.line(i))
        except SampleSkipped:
            continue
        if isinstance(record, dict):
            fields.update(str(k) for k in record)
    return fields


def _field_hint(
    report: dict[str, Any], ds: JsonlSFTDataset, format: str, format_kw: dict[str, Any], names: Mapping[str, str]
) -> str | None:
    lines = report["lines"]
    reason = next(
        (
            r
            for r in ("missing_field", "bad_conversation")
            if lines and report["skips"].get(r, {}).get("count", 0) >= HINT_SHARE * lines
        ),
        None,
    )
    if reason is None:
        return None
    n = report["skips"][reason]["count"]
    fields = record_fields(ds)
    scanned = ", ".join(f"{k!r}" for k, _ in fields.most_common(8)) or "none (no JSON object lines)"
    head = f"{n} of {lines} lines skip with {reason}: the records have the fields {scanned}"
    if format != "chat" and any(f in fields for f in CHAT_FIELDS):
        chat = next(f for f in CHAT_FIELDS if f in fields)
        return f"{head}; {chat!r} holds chat turns: use {_knob(names, 'chat')}"
    if format != "text" and "text" in fields and not any(f in fields for f in ("prompt", "input", *CHAT_FIELDS)):
        return f"{head}; they are documents ('text'): use {_knob(names, 'text')} (pretraining-style, all supervised)"
    if format != "prompt_completion" and "prompt" in fields and "completion" in fields:
        return f"{head}; they are prompt/completion records: use {_knob(names, 'prompt_completion')}"
    if format == "prompt_completion":
        want = (format_kw.get("prompt_field") or "prompt", format_kw.get("completion_field") or "completion")
        return (
            f"{head}, not the prompt field {want[0]!r} and completion field {want[1]!r}: name yours with "
            f"{_knob(names, 'fields')}, or use "
            f"{_knob(names, 'chat')} for chat turns"
        )
    return (
        f"{head}, none of {list(CHAT_FIELDS)} (the chat turns): use "
        f"{_knob(names, 'prompt_completion')} with "
        f"{_knob(names, 'fields')} for "
        f"prompt/completion records"
    )


#: how a hint names a setting, as keywords of :func:`inspect_jsonl` (``width`` is followed by a value)
KNOBS = {
    "chat": 'format="chat"',
    "prompt_completion": 'format="prompt_completion"',
    "text": 'format="text"',
    "fields": "prompt_field= / completion_field=",
    "width": "seq_length=",
}


def _knob(names: Mapping[str, str], name: str) -> str:
    """How a hint names a setting: from ``names`` (a tool's own), else the keyword."""
    return names.get(name, KNOBS[name])


def _width_hint(report: dict[str, Any], width: int, names: Mapping[str, str]) -> str | None:
    usable, over = report["usable"], report["packing"]["oversize"]
    if not usable or over < HINT_SHARE * usable:
        return None
    L = report["length"]
    return (
        f"the width {width} is below {over} of {usable} usable samples (median length {L['p50']:.0f}, "
        f"p99 {L['p99']:.0f}): they are never packed, and the fill above covers only the "
        f"{usable - over} that fit. Use a width of at least the p99 length, better several times the median "
        f"(e.g. {_knob(names, 'width')}{_suggest_width(L['p50'], L['p99'])})"
    )


def _suggest_width(median: float, p99: float) -> int:
    target = max(p99, 4 * median, 1.0)
    return int(2 ** int(np.ceil(np.log2(target))))


def best_baseline(lengths: np.ndarray, width: int, seed: int = 0) -> dict[str, float]:
    """The concat baseline at the largest MBS whose rows exceed the width at most 1% of the time."""
    best = concat_baseline(lengths, width, 1, seed)
    for mbs in range(2, max(2, width // max(1, int(lengths.min(initial=1))) + 1)):
        trial = concat_baseline(lengths, width, mbs, seed)
        if trial["overflow_rate"] > MAX_OVERFLOW:
            break
        best = trial
    return best


def _cache_entries(path: str | os.PathLike, cache_dir: Any) -> dict[str, int]:
    """This file's cache files (name -> mtime_ns) as it is now."""
    folder = cache_folder(cache_dir)
    return (
        {
            p.name: p.stat().st_mtime_ns
            for p in folder.glob(f"{Path(path).name}.{cache_key(path)}.*")
            if p.suffix in (".npy", ".json")
        }
        if folder.is_dir()
        else {}
    )


@accepts_old_width
def inspect_jsonl(
    path: str | os.PathLike,
    *,
    tokenizer: Any = None,
    format: str = "prompt_completion",
    seq_length: int = 4096,
    pad_multiple: int = 1,
    window: int = 4096,
    max_length: int | None = None,
    overlength: str = "skip",
    seed: int = 0,
    names: Mapping[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    **format_kw: Any,
) -> dict[str, Any]:
    """The report as a dict (see :func:`format_report`); runs (or reuses) the cached length pass.

    ``tokenizer``: ``"demo"``, a ``tokenizer.json`` path, a local HF folder or a tokenizer object;
    ``None`` uses the demo tokenizer with a ``DemoTokenizerWarning``. The report names it.
    ``names``: how hints name the settings of :data:`KNOBS` (a tool's flags; default: the keywords).
    ``progress(lines_done, lines)``: called as the length pass measures lines (not when reused).
    """
    from ..chat.tokenizer import describe_tokenizer

    tok = load_tokenizer(tokenizer, stacklevel=4)  # the caller of inspect_jsonl, past accepts_old_width
    width = seq_length  # the pack width (``width=`` is its deprecated keyword)
    before = _cache_entries(path, format_kw.get("cache_dir"))
    ds = JsonlSFTDataset(path, tok, format, max_length=max_length, overlength=overlength, **format_kw)
    lines = len(ds)
    report_lines = (lambda done: progress(done, lines)) if progress is not None else None
    with length_pass.progress(report_lines) if report_lines is not None else contextlib.nullcontext():
        lengths = np.asarray(ds.lengths, dtype=np.int64)
    after = _cache_entries(path, format_kw.get("cache_dir"))
    good = lengths[lengths > 0]
    align = alignment_knobs(pad_multiple)  # the report's explicit alignment as the spec's cp/tp/sp
    sampler = TokenBudgetBatchSampler(lengths, width, **align, window=window, seed=seed)
    stats = sampler.stats
    first_lines: dict[str, list[int]] = {}
    for line, reason, _ in ds.skipped_lines:
        if len(first_lines.setdefault(reason, [])) < 5:
            first_lines[reason].append(line)
    oversize = int(stats.skips.get("oversize", 0))
    fits = good[good <= width]
    report = {
        "file": str(ds.path),
        "format": format,
        "tokenizer": describe_tokenizer(ds.format.tokenizer),
        "cache": {
            "folder": str(cache_folder(format_kw.get("cache_dir"))),
            "state": "reused" if after and after == before else "written" if after else "in memory only",
        },
        "lines": len(ds),
        "usable": int(len(good)),
        "skips": {r: {"count": n, "first_lines": first_lines.get(r, [])} for r, n in sorted(ds.skips.items())},
        "tokens": int(good.sum()),
        "length": {
            "min": int(good.min()) if len(good) else 0,
            "mean": float(good.mean()) if len(good) else 0.0,
            **{f"p{p}": float(np.percentile(good, p)) if len(good) else 0.0 for p in PERCENTILES},
            "max": int(good.max(initial=0)),
        },
        "packing": {
            "width": width,
            "pad_multiple": pad_multiple,
            "window": window,
            "packs": stats.packs,
            "fill": stats.fill,
            "mean_samples_per_pack": stats.mean_samples_per_pack,
            "oversize": oversize,
        },
        # Bridge-style concat over the samples that fit; meaningless when most do not fit
        "baseline_concat": (
            best_baseline(fits, width, seed) if len(fits) and oversize < HINT_SHARE * len(good) else None
        ),
    }
    names = names or {}
    report["hints"] = [
        h for h in (_field_hint(report, ds, format, format_kw, names), _width_hint(report, width, names)) if h
    ]
    return report


def format_report(report: dict[str, Any]) -> str:
    """A short human-readable table of :func:`inspect_jsonl`'s dict."""
    L, P, B = report["length"], report["packing"], report["baseline_concat"]
    out = [
        f"{report['file']} ({report['format']}, tokenizer {report.get('tokenizer', '?')})",
        f"  lines {report['lines']}, usable {report['usable']}, skipped {report['lines'] - report['usable']}, "
        f"tokens {report['tokens']}",
        "  length  " + "  ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in L.items()),
    ]
    for reason, info in report["skips"].items():
        out.append(f"  skip {reason:<20} {info['count']:>8}  first lines {info['first_lines']}")
    out.append(
        f"  packer  width {P['width']} (align {P['pad_multiple']}): {P['packs']} packs, fill {P['fill']:.2%}, "
        f"{P['mean_samples_per_pack']:.1f} samples/pack, {P['oversize']} over the width"
    )
    if B:
        out.append(
            f"  baseline (Bridge in-batch concat of MBS={B['mbs']} samples as given, no bin packing, over the "
            f"samples that fit): fill {B['fill']:.2%} ({B['overflow_rate']:.1%} rows over the width)"
        )
    if "cache" in report:
        C = report["cache"]
        out.append(f"  cache   {C['folder']} ({C['state']}; --cache-dir or ENERGON_PACK_CACHE_DIR moves it)")
    for hint in report.get("hints", []):
        out.append(f"  hint: {hint}")
    return "\n".join(out)
