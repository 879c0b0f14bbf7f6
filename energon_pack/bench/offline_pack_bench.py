"""Offline packing side by side: ``pack-offline`` (ours) vs Megatron-Bridge's offline packer.

Bridge's path is its own ``prepare_gpt_sft_packed_data`` (``tokenize_dataset`` with its
``GPTSFTDataset`` / ``GPTSFTChatDataset`` -> ``create_hist`` -> ``create_packing_strategy`` with
``first_fit_shuffle`` or ``first_fit_decreasing`` -> ``fill_packing_strategy`` -> its Parquet
writer), imported on CPU through ``tests/_bridge_sft_light.py`` and run with the same tokenizer
and the same number of tokenizer processes. Every run is a fresh child process; its peak memory
is the largest sum of ``Pss`` over its process tree (workers included; pages a forked worker
shares with its parent counted once), polled from ``/proc/<pid>/smaps_rollup``, beside the sum of
``VmRSS`` and the main process's own ``VmHWM`` (``/proc/<pid>/status``). Fill is Bridge's
``packing_efficiency`` (runtime tokens / capacity) for both. Not a timed test: it prints a table
and writes JSON; the targets are enforced only with ``--check``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .outputs import OUT_HELP, write_report
from .targets import check, format_target

ALGORITHMS = ("first_fit_shuffle", "first_fit_decreasing")
TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"


def write_chat_jsonl(path: Path, size_bytes: int, seed: int = 0) -> int:
    """A chat JSONL (``messages``, 1-4 user/assistant turns) of about ``size_bytes``, every line distinct."""
    from .sft_bench import WORDS

    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    written = k = 0
    with open(path, "w") as f:
        while written < size_bytes:
            turns = []
            for _ in range(rng.randint(1, 4)):
                turns += [
                    {"role": "user", "content": f"{k} {text(3, 80)}"},
                    {"role": "assistant", "content": text(3, 250)},
                ]
            line = json.dumps({"messages": turns}) + "\n"
            f.write(line)
            written += len(line)
            k += 1
    return written


# ---------------------------------------------------------------------------------- memory of a tree
def _status(pid: int, field: str, name: str = "status") -> int:
    """``field`` (kB) of ``/proc/<pid>/<name>`` in bytes; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def run_child(
    spec: dict[str, Any], poll_s: float = 0.1, *, timeout_s: float | None = None, cpus: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """Run one side in a fresh interpreter: its result, wall time, peak tree PSS and RSS, main VmHWM.

    ``cpus`` pins the side (and the tokenizer processes it forks) to those cores, so sides can run
    at once on one large host without sharing cores. Past ``timeout_s`` the side's process tree is
    killed and the row says ``timed_out``: its wall time and peaks are then lower bounds."""
    with tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "energon_pack.bench.offline_pack_bench", "--child", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        peak = {"pss": 0, "rss": 0, "main_hwm": 0}

        def watch() -> None:
            while proc.poll() is None:
                tree = _tree(proc.pid)
                peak["pss"] = max(peak["pss"], sum(_status(p, "Pss", "smaps_rollup") for p in tree))
                peak["rss"] = max(peak["rss"], sum(_status(p, "VmRSS") for p in tree))
                peak["main_hwm"] = max(peak["main_hwm"], _status(proc.pid, "VmHWM"))
                time.sleep(poll_s)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            watcher.join()
            return {
                "timed_out": True,
                "error": f"killed after {timeout_s:.0f} s (lower bounds below)",
                "wall_s": round(time.perf_counter() - start, 3),
                "peak_pss_bytes": peak["pss"],
                "peak_rss_sum_bytes": peak["rss"],
                "main_vmhwm_bytes": peak["main_hwm"],
            }
        wall = time.perf_counter() - start
        watcher.join()
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read()[-2000:]
            return {
                "error": f"exit {proc.returncode}: {tail.strip().splitlines()[-1] if tail.strip() else ''}",
                "wall_s": wall,
                "stderr_tail": tail,
            }
    result = json.loads(out.strip().splitlines()[-1])
    return {
        **result,
        "wall_s": round(wall, 3),
        "peak_pss_bytes": peak["pss"],
        "peak_rss_sum_bytes": peak["rss"],
        "main_vmhwm_bytes": peak["main_hwm"],
    }


# ---------------------------------------------------------------------------------- the two sides
def _ours(spec: dict[str, Any]) -> dict[str, Any]:
    from energon_pack.chat.tokenizer import load_tokenizer
    from energon_pack.sft.pack_offline import pack_offline

    s = pack_offline(
        spec["path"],
        spec["out"],
        seq_length=spec["width"],
        tokenizer=load_tokenizer(spec["tokenizer"]),
        format=spec["format"],
        seed=spec["seed"],
        workers=spec["workers"],
        cache_dir=spec["cache"],
    )
    return {
        "packs": s.packs,
        "samples": s.samples,
        "fill": s.fill,
        "real_fill": s.real_fill,
        "skips": s.skips,
        "max_samples_per_bin": s.bridge_metadata["max_samples_per_bin"],
        "seconds": s.seconds,
    }


def _bridge(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(TESTS_DIR))
    from _bridge_sft_light import BridgeTokenizer, gpt_sft_modules
    from energon_pack.chat.tokenizer import as_qwen_tokenizer, load_tokenizer

    mods = gpt_sft_modules()
    if mods is None:
        raise RuntimeError("megatron-bridge is not installed")
    tok = BridgeTokenizer(as_qwen_tokenizer(load_tokenizer(spec["tokenizer"])).inner)

    def builder(path, *, tokenizer, seq_length, memmap_workers, seed, packed_sequence_size, is_test, dataset_kwargs):
        kw = dict(
            file_path=str(path),
            tokenizer=tokenizer,
            max_seq_length=seq_length,
            memmap_workers=memmap_workers,
            seed=seed,
            is_test=is_test,
            pad_seq_length_to_mult=dataset_kwargs.get("pad_seq_length_to_mult", 1),
            index_mapping_dir=spec["cache"],
        )
        if spec["format"] == "chat":
            return mods.gpt_sft.GPTSFTChatDataset(use_hf_tokenizer_chat_template=True, **kw)
        return mods.gpt_sft.GPTSFTDataset(
            prompt_completion_config=mods.sft_processing.PromptCompletionSFTPreprocessingConfig(), **kw
        )

    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    packs_path, meta_path = out / f"training_{spec['width']}.idx.parquet", out / f"{spec['width']}_metadata.jsonl"
    start = time.perf_counter()
    mods.offline.prepare_gpt_sft_packed_data(
        input_path=Path(spec["path"]),
        output_path=packs_path,
        output_metadata_path=meta_path,
        packed_sequence_size=spec["width"],
        tokenizer=tok,
        max_seq_length=spec["width"],
        seed=spec["seed"],
        packing_algorithm=spec["algorithm"],
        dataset_kwargs={},
        pad_seq_to_mult=1,
        num_tokenizer_workers=spec["workers"],
        dataset_builder=builder,
    )
    seconds = time.perf_counter() - start
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    meta = json.loads(meta_path.read_text())[-1]
    table = pq.read_table(packs_path, columns=["input_ids", "seq_start_id"])
    packs = table.num_rows
    samples = int(pc.sum(pc.list_value_length(table.column("seq_start_id"))).as_py())
    stored = int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py())
    # pad_seq_to_mult 1: a sample of n stored tokens takes n - 1 runtime positions (packing_efficiency, unrounded)
    return {
        "packs": packs,
        "samples": samples,
        "fill": (stored - samples) / (packs * spec["width"]),
        "max_samples_per_bin": meta["max_samples_per_bin"],
        "seconds": {"total": round(seconds, 3)},
    }


def _child(spec: dict[str, Any]) -> None:
    import logging

    logging.disable(logging.WARNING)
    result = _ours(spec) if spec["side"] == "ours" else _bridge(spec)
    print(json.dumps(result))


# ---------------------------------------------------------------------------------- the comparison
def compare(
    path: Path,
    fmt: str,
    *,
    width: int,
    tokenizer: str,
    workers: int,
    seed: int,
    workdir: Path,
    packers: tuple[str, ...] = ("ours",) + ALGORITHMS,
    timeout_s: float | None = None,
    cpus: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Bridge's two algorithms and ours (or those of ``packers``) on one file; rows and targets."""
    rows = {}
    for side in packers:
        cache = workdir / f"cache-{fmt}-{side}"
        spec = {
            "side": "ours" if side == "ours" else "bridge",
            "algorithm": side,
            "path": str(path),
            "format": fmt,
            "width": width,
            "tokenizer": tokenizer,
            "workers": workers,
            "seed": seed,
            "cache": str(cache),
            "out": str(workdir / f"out-{fmt}-{side}"),
        }
        cache.mkdir(parents=True, exist_ok=True)
        print(f"  {fmt}: {side} ...", flush=True)
        rows[side] = run_child(spec, timeout_s=timeout_s, cpus=cpus)
    for r in rows.values():
        if "error" not in r:
            r["runtime_tokens"] = round(r["fill"] * r["packs"] * width)
    bridge = [rows[a] for a in ALGORITHMS if a in rows and "error" not in rows[a]]
    # a Bridge side killed at the timeout: its wall time and peaks so far are lower bounds of its own
    bounded = bridge + [rows[a] for a in ALGORITHMS if a in rows and rows[a].get("timed_out")]
    ours = rows.get("ours", {"error": "not run"})
    targets = []
    if "error" not in ours:
        if bridge:
            targets.append(
                check(f"{fmt}: fill >= Bridge's best algorithm", ours["fill"], ">=", max(r["fill"] for r in bridge))
            )
        if bounded:
            note = " (Bridge killed at the timeout: its value a lower bound)" if len(bounded) > len(bridge) else ""
            targets += [
                check(
                    f"{fmt}: peak memory (tree PSS) <= 1/4 of Bridge's (MiB){note}",
                    ours["peak_pss_bytes"] / 2**20,
                    "<=",
                    min(r["peak_pss_bytes"] for r in bounded) / 4 / 2**20,
                ),
                check(
                    f"{fmt}: wall time <= Bridge's (s){note}", ours["wall_s"], "<=", min(r["wall_s"] for r in bounded)
                ),
            ]
    finished = [r["runtime_tokens"] for r in rows.values() if "error" not in r]
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "lines": sum(1 for _ in open(path, "rb")),
        "format": fmt,
        "same_tokens": len(set(finished)) == 1 if len(finished) > 1 else None,
        "rows": rows,
        "targets": targets,
    }


def format_table(result: dict[str, Any]) -> str:
    same = {
        True: "the same runtime tokens on every side",
        False: "runtime tokens DIFFER between sides",
        None: "one finished side",
    }[result["same_tokens"]]
    lines = [
        f"{result['format']}: {result['bytes'] / 2**20:.1f} MiB, {result['lines']} lines, {same}",
        f"  {'packer':<24} {'packs':>8} {'samples':>8} {'fill %':>8} "
        f"{'tree PSS MiB':>13} {'tree RSS MiB':>13} {'main HWM MiB':>13} {'wall s':>8}",
    ]
    for name, r in result["rows"].items():
        label = "energon-pack (best fit)" if name == "ours" else f"Bridge {name}"
        if r.get("timed_out"):
            lines.append(
                f"  {label:<24} {'-':>8} {'-':>8} {'-':>8} {r['peak_pss_bytes'] / 2**20:>12.1f}+ "
                f"{r['peak_rss_sum_bytes'] / 2**20:>12.1f}+ {r['main_vmhwm_bytes'] / 2**20:>12.1f}+ "
                f"{r['wall_s']:>7.1f}+  (killed: lower bounds)"
            )
            continue
        if "error" in r:
            lines.append(f"  {label:<24} error: {r['error']}")
            continue
        lines.append(
            f"  {label:<24} {r['packs']:>8} {r['samples']:>8} {r['fill'] * 100:>8.2f} "
            f"{r['peak_pss_bytes'] / 2**20:>13.1f} {r['peak_rss_sum_bytes'] / 2**20:>13.1f} "
            f"{r['main_vmhwm_bytes'] / 2**20:>13.1f} {r['wall_s']:>8.1f}"
        )
    return "\n".join(lines)


def main(
    out: str | Path = "bench_results/offline_pack.json",
    *,
    size_mb: float = 8,
    chat_size_mb: float = 4,
    width: int = 4096,
    tokenizer: str = "qwen2.5-vl",
    workers: int = 2,
    seed: int = 0,
    workdir: str | Path | None = None,
    packers: tuple[str, ...] = ("ours",) + ALGORITHMS,
    data: tuple[str | Path, str] | None = None,
    timeout_s: float | None = None,
    cpus: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Generate the files (a prompt/completion file of ``size_mb``, a chat file of ``chat_size_mb``;
    0 skips one), or take ``data`` = (your JSONL, its format), compare, print, write JSON."""
    from .sft_bench import write_unique_jsonl

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        results = []
        files = [(Path(data[0]), data[1])] if data else []
        for fmt, mb, write in (
            ()
            if data
            else (("prompt_completion", size_mb, write_unique_jsonl), ("chat", chat_size_mb, write_chat_jsonl))
        ):
            if mb <= 0:
                continue
            path = tmp / f"{fmt}.jsonl"
            write(path, int(mb * 2**20), seed)
            print(f"{fmt}: {path.stat().st_size / 2**20:.1f} MiB generated", flush=True)
            files.append((path, fmt))
        for path, fmt in files:
            results.append(
                compare(
                    path,
                    fmt,
                    width=width,
                    tokenizer=tokenizer,
                    workers=workers,
                    seed=seed,
                    workdir=tmp,
                    packers=packers,
                    timeout_s=timeout_s,
                    cpus=cpus,
                )
            )
            print(format_table(results[-1]), flush=True)
    report = {
        "width": width,
        "tokenizer": tokenizer,
        "workers": workers,
        "seed": seed,
        "cpus": len(cpus) if cpus else len(os.sched_getaffinity(0)),
        "pinned_cpus": list(cpus or ()),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "results": results,
        "targets": [t for r in results for t in r["targets"]],
    }
    for t in report["targets"]:
        print(format_target(t))
    print(write_report(out, report))
    return report


def _packers(value: str) -> tuple[str, ...]:
    names = tuple(x for x in value.split(",") if x)
    unknown = [x for x in names if x not in ("ours",) + ALGORITHMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown packer(s) {unknown}: use ours, {', '.join(ALGORITHMS)}")
    return names


def _cpu_list(value: str) -> tuple[int, ...]:
    cpus: list[int] = []
    try:
        for part in value.split(","):
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpus {value!r}: use core numbers like 0,1 or 4-7") from None
    unusable = sorted(set(cpus) - os.sched_getaffinity(0))
    if not cpus or unusable:
        raise argparse.ArgumentTypeError(
            f"--cpus {value!r}: cores {unusable} are not usable here (usable: {sorted(os.sched_getaffinity(0))})"
        )
    return tuple(cpus)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-mb", type=float, default=8, help="generated prompt/completion JSONL size (0: skip)")
    p.add_argument("--chat-size-mb", type=float, default=4, help="generated chat JSONL size (0: skip)")
    p.add_argument("--width", type=int, default=4096, help="packed_sequence_size")
    p.add_argument(
        "--tokenizer",
        default="qwen2.5-vl",
        help="the tokenizer both sides use (qwen2-vl | qwen2.5-vl | qwen3-vl, a tokenizer.json)",
    )
    p.add_argument("--workers", type=int, default=2, help="tokenizer processes on each side")
    p.add_argument("--seed", type=int, default=0, help="data and packing seed")
    p.add_argument(
        "--packers",
        type=_packers,
        default=("ours",) + ALGORITHMS,
        help="comma-separated: ours, first_fit_shuffle, first_fit_decreasing (e.g. ours alone on a file "
        "too large for Bridge's in-memory path)",
    )
    p.add_argument("--data", default=None, help="benchmark this JSONL instead of generated files (with --data-format)")
    p.add_argument(
        "--data-format", default="prompt_completion", choices=("prompt_completion", "chat"), help="the format of --data"
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="kill a side after this long; its wall time and peak memory become lower bounds",
    )
    p.add_argument(
        "--cpus",
        type=_cpu_list,
        default=None,
        help="pin every side to these cores (e.g. 0,1 or 4-7): 2-core numbers on a large host",
    )
    p.add_argument("--workdir", default=None, help="folder for the generated files (default: the system temp folder)")
    p.add_argument("--out", default="bench_results/offline_pack.json", help=OUT_HELP)
    p.add_argument(
        "--check", action="store_true", help="exit 1 when a target is missed (printed for information otherwise)"
    )


def run_cli(args: argparse.Namespace) -> int:
    report = main(
        args.out,
        size_mb=args.size_mb,
        chat_size_mb=args.chat_size_mb,
        width=args.width,
        tokenizer=args.tokenizer,
        workers=args.workers,
        seed=args.seed,
        workdir=args.workdir,
        packers=args.packers,
        data=(args.data, args.data_format) if args.data else None,
        timeout_s=args.timeout_s,
        cpus=args.cpus,
    )
    missed = [t for t in report["targets"] if not t["met"]]
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(json.loads(sys.argv[2]))
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        add_arguments(parser)
        sys.exit(run_cli(parser.parse_args()))
