"""The GPT-SFT JSONL path, measured: index build vs ``wc -l``, lazy ``__getitem__`` throughput,
and in-batch fill vs Megatron-Bridge's concatenate-MBS-rows baseline.

``main(out, size_mb=1024)`` runs on generated prompt/completion files (in a temporary directory,
or ``workdir``, removed afterwards); ``main(out, data=FILE, tokenizer=T, format=F)`` on the
user's JSONL (only read; its caches go to a temporary folder). Both print the figures and
write JSON; the project's targets (issue 5, on generated data) are graded only with ``check``.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from energon_pack.bench.mixes import lognormal_text
from energon_pack.bench.outputs import write_report
from energon_pack.chat.qwen_vocab import describe_qwen_version, load_qwen_tokenizer_raw
from energon_pack.chat.tokenizer import QwenTokenizer
from energon_pack.env import environ_set
from energon_pack.errors import AllSkippedError, skip_counts_text
from energon_pack.sft.dataset import JsonlSFTDataset
from energon_pack.sft.index import cache_path, load_line_index
from energon_pack.sft.inspect import best_baseline
from energon_pack.sft.sampler import TokenBudgetBatchSampler

WORDS = (
    "the of and to in is that for it with as was on be by this are from at or an have not but what all were "
    "when we there can model data train token pack batch width loss answer question user"
).split()
#: the tokenizer every row runs: the real Qwen2.5-VL vocabulary (built offline), as a user's run has it
TOKENIZER = "qwen2.5-vl"
TARGETS = {"index_vs_wc": 3.0, "getitem_per_s": 20000.0, "fill": 0.98, "length_pass_speedup": 3.0}


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def write_jsonl(path: Path, size_bytes: int, seed: int = 0) -> int:
    """A prompt/completion JSONL of about ``size_bytes``: a 4 MiB block of varied lines, repeated."""
    rng = random.Random(seed)
    lines, total = [], 0
    while total < min(size_bytes, 4 << 20):
        line = (
            json.dumps({"prompt": _text(rng, rng.randint(5, 120)), "completion": _text(rng, rng.randint(5, 400))})
            + "\n"
        )
        lines.append(line)
        total += len(line)
    block = "".join(lines).encode()
    with open(path, "wb") as f:
        written = 0
        while written < size_bytes:
            f.write(block)
            written += len(block)
    return written


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def index_timings(path: Path, cache_dir: Path, repeats: int = 3) -> dict[str, Any]:
    """Best-of-``repeats`` ``wc -l`` vs building the line index of ``path`` (cached in ``cache_dir``)."""
    wc = _best_of(lambda: subprocess.run(["wc", "-l", str(path)], check=True, capture_output=True), repeats)
    npy = cache_path(path, ".idx.npy", cache_dir)

    def build() -> None:
        npy.unlink(missing_ok=True)
        load_line_index(path, cache_dir)

    index = _best_of(build, repeats)
    cached = _best_of(lambda: load_line_index(path, cache_dir), repeats)
    lines = len(load_line_index(path, cache_dir))
    return {
        "bytes": path.stat().st_size,
        "lines": lines,
        "wc_l_s": wc,
        "index_build_s": index,
        "index_cached_load_s": cached,
        "ratio": index / wc,
    }


def bench_index(workdir: Path, size_mb: int, repeats: int = 3) -> dict[str, Any]:
    path = workdir / "big.jsonl"
    write_jsonl(path, size_mb << 20)
    result = index_timings(path, workdir / "cache", repeats)
    lines = int(subprocess.run(["wc", "-l", str(path)], check=True, capture_output=True, text=True).stdout.split()[0])
    assert result["lines"] == lines
    path.unlink()
    return result


def getitem_timings(make: Any, samples: int, seed: int = 0) -> dict[str, Any]:
    """Lazy ``__getitem__`` of ``make()`` (a :class:`JsonlSFTDataset`) in random order over up to
    ``samples`` usable lines, then the same with ``make(cache_tokens=True)`` after its length pass."""
    ds = make()
    usable = np.flatnonzero(np.asarray(ds.lengths) > 0)
    order = np.random.default_rng(seed).permutation(usable)[:samples].tolist()
    if not order:
        return {"samples": 0}
    start = time.perf_counter()
    tokens = sum(len(ds[i]) for i in order)
    elapsed = time.perf_counter() - start
    cached = make(cache_tokens=True)
    pass_start = time.perf_counter()
    _ = cached.lengths  # touched on purpose: runs (and so times) the length pass
    pass_s = time.perf_counter() - pass_start
    start = time.perf_counter()
    for i in order:
        cached[i]
    cached_s = time.perf_counter() - start
    n = len(order)
    return {
        "samples": n,
        "mean_tokens": tokens / n,
        "per_s": n / elapsed,
        "us_per_sample": elapsed / n * 1e6,
        "tokens_per_s": tokens / elapsed,
        "cache_tokens_per_s": n / cached_s,
        "length_pass_s": pass_s,
    }


def bench_getitem(workdir: Path, samples: int = 5000) -> dict[str, Any]:
    """One pass in random order over unique ~500-token prompt/completion lines, text memo off
    (so every access really tokenises, as on a large file)."""
    tok = QwenTokenizer(load_qwen_tokenizer_raw(TOKENIZER), cache_size=0)
    rng = random.Random(1)
    path = workdir / "getitem.jsonl"
    with open(path, "w") as f:
        for _ in range(samples):
            f.write(json.dumps({"prompt": _text(rng, 50), "completion": _text(rng, 200)}) + "\n")
    return getitem_timings(lambda **kw: JsonlSFTDataset(path, tok, cache_dir=workdir / "cache", **kw), samples)


def write_unique_jsonl(path: Path, size_bytes: int, seed: int = 0) -> int:
    """A prompt/completion JSONL of about ``size_bytes`` whose every line is distinct (a line
    number starts each prompt), so no text memo can shortcut the length pass."""
    rng = random.Random(seed)
    pairs = [(_text(rng, rng.randint(5, 120)), _text(rng, rng.randint(5, 400))) for _ in range(4000)]
    written = k = 0
    with open(path, "w") as f:
        while written < size_bytes:
            buf = []
            for prompt, completion in pairs:
                buf.append(f'{{"prompt": "{k} {prompt}", "completion": "{completion} {k}"}}\n')
                k += 1
            block = "".join(buf)
            f.write(block)
            written += len(block)
    return written


def bench_length_pass(
    workdir: Path, size_mb: int, workers: int | None = None, sample_lines: int = 20000
) -> dict[str, Any]:
    """Index + length pass over a ``size_mb`` MiB JSONL (the real Qwen2.5-VL tokenizer, prompt/completion): today's
    serial per-line pass vs the batched pass over ``workers`` processes (None: one per core), same
    run; results must be identical. Also the tokenizer-only CPU time (one thread,
    ``encode_batch_fast`` of the same texts in the pass's chunks, from ``sample_lines`` lines
    scaled to the file, in this process's default malloc): the floor a pass on one core pays;
    ``ceiling_on_cores`` = serial time / (that / cores). ``new_cpu_s`` is the CPU time of the new
    pass (its workers included, one pool of processes)."""
    import os
    import resource

    from energon_pack.records import decode_json_record
    from energon_pack.sft import length_pass as length_pass

    path = workdir / "lengths.jsonl"
    size = write_unique_jsonl(path, size_mb << 20)
    raw = load_qwen_tokenizer_raw(TOKENIZER)

    def run(**kw):
        npy = cache_path(path, ".idx.npy", workdir / "cache")
        npy.unlink(missing_ok=True)
        start = time.perf_counter()
        cpu = time.process_time()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        ds = JsonlSFTDataset(path, QwenTokenizer(raw, cache_size=4096), cache_dir=workdir / "cache")
        index_s = time.perf_counter() - start
        result = ds.compute_lengths(**kw)
        total = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = time.process_time() - cpu + (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        return index_s, total, result, len(ds), cpu

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    new_index, new_total, new, lines, new_cpu = run(workers=workers, batch=True)
    old_index, old_total, old, _, _ = run(workers=1, batch=False)
    identical = np.array_equal(new[0], old[0]) and new[1] == old[1] and new[2] == old[2]
    ds = JsonlSFTDataset(path, QwenTokenizer(raw), cache_dir=workdir / "cache")
    n = min(sample_lines, lines)
    records = [decode_json_record(ds.index.line(i)) for i in range(n)]
    texts = [r["prompt"].strip() for r in records] + [r["completion"].strip() for r in records]
    chunk = 2 * length_pass.LENGTH_CHUNK  # the pass's batch: two texts per line (one huge batch is slower)
    with environ_set("TOKENIZERS_PARALLELISM", "false"):
        cpu = time.process_time()
        for k in range(0, len(texts), chunk):
            raw.encode_batch_fast(texts[k : k + chunk], add_special_tokens=False)
        tok_cpu = (time.process_time() - cpu) * lines / n
    for f in workdir.glob("lengths.jsonl*"):
        f.unlink()
    return {
        "bytes": size,
        "lines": lines,
        "cores": cores,
        "workers": workers or cores,
        "serial_index_s": old_index,
        "serial_total_s": old_total,
        "new_index_s": new_index,
        "new_total_s": new_total,
        "speedup": old_total / new_total,
        "identical": bool(identical),
        "tokenizer_only_cpu_s": tok_cpu,
        "ceiling_on_cores": old_total / (tok_cpu / cores),
        "new_cpu_s": new_cpu,
        "tokenizer_only_chunk_texts": chunk,
    }


def fill_timings(lengths: np.ndarray, width: int, window: int = 4096, seed: int = 0) -> dict[str, Any]:
    """The in-batch packer's fill at ``width`` over ``lengths`` vs Bridge's concat baseline (samples that fit)."""
    sampler = TokenBudgetBatchSampler(lengths, width, window=window, seed=seed)
    start = time.perf_counter()
    stats = sampler.stats
    plan_s = time.perf_counter() - start
    good = lengths[(lengths > 0) & (lengths <= width)]
    return {
        "width": width,
        "window": window,
        "fill": stats.fill,
        "packs": stats.packs,
        "plan_s": plan_s,
        "oversize": int(stats.skips.get("oversize", 0)),
        "baseline": best_baseline(good, width, seed) if len(good) else None,
    }


def bench_fill(samples: int = 20000, width: int = 4096, window: int = 4096, seed: int = 0) -> dict[str, Any]:
    return {"samples": samples, **fill_timings(lognormal_text(samples, width, seed)[:, 0], width, window, seed)}


def bench_data(
    path: str | Path,
    tokenizer: Any,
    *,
    format: str = "prompt_completion",
    width: int = 4096,
    getitem_samples: int = 5000,
    **format_kw: Any,
) -> dict[str, Any]:
    """The same figures on the user's JSONL (only read; caches in a temporary folder): index build
    vs ``wc -l``, the length pass, lazy ``__getitem__`` over up to ``getitem_samples`` usable lines,
    and the fill at ``width``."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="sft_bench_cache_") as cache:
        index = index_timings(path, Path(cache))

        def make(**kw: Any) -> JsonlSFTDataset:
            return JsonlSFTDataset(path, tokenizer, format, cache_dir=cache, **format_kw, **kw)

        start = time.perf_counter()
        ds = make()
        lengths = np.asarray(ds.lengths)
        pass_s = time.perf_counter() - start
        usable = lengths[lengths > 0]
        if not len(usable):
            raise AllSkippedError(
                f"{path}: all {len(lengths)} lines were skipped ({skip_counts_text(ds.skips)}), so "
                f"there is nothing to measure: `energon-pack inspect {path} --format {format}` "
                f"names the likely fix"
            )
        getitem = getitem_timings(make, getitem_samples)
        length_pass = {
            "lines": len(lengths),
            "usable": int(len(usable)),
            "skips": dict(ds.skips),
            "seconds": pass_s,
            "lines_per_s": len(lengths) / pass_s,
            "tokens_per_s": float(usable.sum()) / pass_s,
        }
        fill = fill_timings(lengths.astype(np.int64), width)
    return {
        "file": str(path),
        "format": format,
        "index": index,
        "length_pass": length_pass,
        "getitem": getitem,
        "fill": fill,
    }


def _print_index(index: dict[str, Any]) -> None:
    print(
        f"index: {index['bytes'] / 2**20:.0f} MiB, {index['lines']} lines: build {index['index_build_s']:.3f}s, "
        f"wc -l {index['wc_l_s']:.3f}s ({index['ratio']:.1f}x), cached load {index['index_cached_load_s'] * 1e3:.1f}ms"
    )


def _print_getitem(getitem: dict[str, Any]) -> None:
    if not getitem["samples"]:
        print("getitem: no usable line")
        return
    print(
        f"getitem: {getitem['mean_tokens']:.0f} tokens/sample, {getitem['per_s']:.0f} samples/s "
        f"({getitem['us_per_sample']:.1f} us, {getitem['tokens_per_s'] / 1e6:.2f}M tokens/s; {getitem['samples']} "
        f"lines in random order); with cache_tokens {getitem['cache_tokens_per_s']:.0f} samples/s after a "
        f"{getitem['length_pass_s']:.2f}s length pass"
    )


def _print_fill(fill: dict[str, Any]) -> None:
    b = fill["baseline"]
    print(
        f"fill @{fill['width']}: packer {fill['fill']:.2%} ({fill['packs']} packs, plan {fill['plan_s']:.2f}s"
        + (f", {fill['oversize']} samples over the width" if fill.get("oversize") else "")
        + ")"
        + (f" vs concat MBS={b['mbs']} {b['fill']:.2%} ({b['overflow_rate']:.1%} rows over width)" if b else "")
    )


def main(
    out: str | Path = "bench_results/sft.json",
    *,
    size_mb: int = 1024,
    getitem_samples: int = 5000,
    fill_samples: int = 20000,
    workdir: str | Path | None = None,
    length_pass_mb: int | None = None,
    data: str | Path | None = None,
    tokenizer: Any = None,
    tokenizer_name: str | None = None,
    format: str = "prompt_completion",
    width: int = 4096,
    check: bool = False,
    **format_kw: Any,
) -> dict[str, Any]:
    """Print the figures and write them to ``out`` as JSON: on ``data`` (the user's JSONL, read with
    ``tokenizer`` in ``format``; no targets) or on generated files (the project's targets are
    returned, and printed when ``check``)."""
    if data is not None:
        print(f"tokenizer: {tokenizer_name or tokenizer}; {data} ({format}), width {width}", flush=True)
        result = {
            "data": bench_data(
                data, tokenizer, format=format, width=width, getitem_samples=getitem_samples, **format_kw
            ),
            "targets": [],
        }
        d = result["data"]
        _print_index(d["index"])
        lp = d["length_pass"]
        print(
            f"length pass: {lp['lines']} lines ({lp['usable']} usable) in {lp['seconds']:.2f}s: "
            f"{lp['lines_per_s']:.0f} lines/s, {lp['tokens_per_s'] / 1e6:.2f}M tokens/s"
            + (f"; skips {lp['skips']}" if lp["skips"] else "")
        )
        _print_getitem(d["getitem"])
        _print_fill(d["fill"])
        if d["fill"]["oversize"] * 2 > lp["usable"]:
            print(
                f"note: {d['fill']['oversize']} of {lp['usable']} usable samples are longer than the width "
                f"{width}, so the fill covers only those that fit: `energon-pack inspect {data}` suggests a width"
            )
        print(write_report(out, result))
        return result
    print(
        f"tokenizer: {describe_qwen_version(TOKENIZER)}; synthetic prompt/completion "
        f"JSONL, {size_mb} MiB for the index benchmark",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="sft_bench_", dir=workdir))
    length_pass = None
    try:
        index = bench_index(tmp, size_mb)
        getitem = bench_getitem(tmp, getitem_samples)
        if length_pass_mb:
            length_pass = bench_length_pass(tmp, length_pass_mb)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fill = bench_fill(fill_samples)
    targets = [
        {
            "name": "index build / wc -l",
            "value": index["ratio"],
            "target": f"<= {TARGETS['index_vs_wc']}",
            "met": index["ratio"] <= TARGETS["index_vs_wc"],
        },
        {
            "name": "lazy __getitem__ samples/s",
            "value": getitem["per_s"],
            "target": f">= {TARGETS['getitem_per_s']:.0f}",
            "met": getitem["per_s"] >= TARGETS["getitem_per_s"],
        },
        {
            "name": "in-batch fill @4096",
            "value": fill["fill"],
            "target": f">= {TARGETS['fill']}",
            "met": fill["fill"] >= TARGETS["fill"],
        },
    ]
    if length_pass is not None:
        lp = length_pass
        targets.append(
            {
                "name": f"length pass speedup ({lp['cores']} cores)",
                "value": lp["speedup"],
                "target": f">= {TARGETS['length_pass_speedup']}",
                "met": lp["speedup"] >= TARGETS["length_pass_speedup"] and lp["identical"],
            }
        )
    result = {"index": index, "getitem": getitem, "fill": fill, "length_pass": length_pass, "targets": targets}
    _print_index(index)
    _print_getitem(getitem)
    _print_fill(fill)
    if length_pass is not None:
        lp = length_pass
        print(
            f"length pass: {lp['bytes'] / 2**20:.0f} MiB, {lp['lines']} distinct lines: index + serial per-line pass "
            f"{lp['serial_total_s']:.1f}s, index + batched pass on {lp['workers']} processes {lp['new_total_s']:.1f}s "
            f"({lp['speedup']:.2f}x, identical: {lp['identical']}; {lp['new_cpu_s']:.1f} CPU-s"
            f"); tokenizer alone "
            f"{lp['tokenizer_only_cpu_s']:.1f} CPU-s (ceiling on {lp['cores']} cores {lp['ceiling_on_cores']:.2f}x)"
        )
    if check:
        print("\nproject benchmark targets (issue 5, on this generated data)")
        print(f"{'target':<30} {'value':>12} {'goal':>10}  met")
        for t in targets:
            print(f"{t['name']:<30} {t['value']:>12.3f} {t['target']:>10}  {'yes' if t['met'] else 'missed'}")
    print(write_report(out, result))
    return result


if __name__ == "__main__":
    import sys

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    main(size_mb=size, length_pass_mb=int(sys.argv[2]) if len(sys.argv) > 2 else size)
