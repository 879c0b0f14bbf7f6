"""Sweep the packing buffer size K for both packing modes on an Energon dataset.

Shared by ``energon-pack bench`` and ``examples/compare_buffer_sizes.py``: a JSON result, a
markdown table, and (with matplotlib) PNG plots of fill, worker RSS, first-batch latency and
throughput against K, with the recommended K marked. Also evaluates the project's own benchmark
targets that compare cells side by side (information; ``energon-pack bench --check`` turns a
miss into exit 1), on the project's demo data only.

On a user's dataset the cells are replayed (:func:`replay_sweep`): each sample is pre-encoded once and its
costs go through every (mode, K)'s packer, then one loader cell times the recommended K; a sweep of a loader
run per cell re-read and decoded the data 16 times (10 minutes on a 3,946-record public mix, 28 s replayed).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .loader_bench import (
    CellResult,
    _wait_for_workers_to_exit,
    cells_to_json,
    format_cells,
    repeat_note,
    run_cell,
    warm_up,
)
from .outputs import RunFiles
from .targets import check, format_target

DEFAULT_BUFFERS = (1, 4, 8, 16, 32, 64, 128, 256)
MODES = ("carry", "rounds")
#: the plots of :func:`figures`, written as ``buffer_{name}.png``
PLOTS = ("fill", "rss", "latency", "throughput")
#: every file a sweep writes into its folder (an earlier sweep's set is kept aside, :class:`RunFiles`)
FILES = ("buffer_sizes.json", "buffer_sizes.md", *(f"buffer_{name}.png" for name in PLOTS))


#: the fill reference line in the plots: the project's benchmark goal (>= 99% at K=64)
FILL_TARGET = 0.99
#: recommended K: the smallest measured K whose carry fill is within this of the best carry fill
RECOMMEND_WITHIN = 0.005
#: no recommendation when more than this share of the samples read was skipped (oversize or otherwise)
MAX_SKIPPED_SHARE = 0.5


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def plan_cells(modes: Sequence[str], buffers: Sequence[int]) -> list[tuple[str, int]]:
    """Every (mode, K) in the order a sweep runs them: the modes next to each other at each K, their
    order reversed from one K to the next (ABBA), so neither mode is always measured first."""
    return [(m, k) for i, k in enumerate(buffers) for m in (modes if i % 2 == 0 else list(reversed(modes)))]


def estimate_left(done: Sequence[tuple[int, float]], rest: Sequence[int]) -> float:
    """Seconds for cells that will read ``rest`` source samples each, at the per-sample rate of the cells
    ``done`` ((samples read, seconds) each): their seconds over their samples, start-up included. A cell's
    time follows the samples it reads and decodes, not K itself, so the estimate neither extrapolates a
    slope over K nor jumps when the packs grow fuller."""
    read = sum(n for n, _ in done)
    took = sum(t for _, t in done)
    return took / max(read, 1) * sum(rest)


def expected_reads(cell: CellResult, buffer: int, packs: int | None, workers: int) -> int:
    """Source samples a cell at K=``buffer`` reads, from a cell done: ``packs`` full packs of samples as long
    as ``cell``'s on average (later K fill their packs, the first small K do not), plus the ``buffer``
    samples each worker holds; a whole pass of the dataset when ``packs`` is None."""
    if packs is None:
        return cell.dataset_samples or cell.samples_read
    mean_tokens = cell.real_tokens / max(cell.samples, 1)
    per_pack = max(cell.samples_per_pack, cell.slots / max(cell.packs, 1) / max(mean_tokens, 1))
    return round(packs * per_pack) + buffer * max(workers, 1)


def sweep(
    path: str | Path,
    *,
    buffers: Sequence[int] = DEFAULT_BUFFERS,
    modes: Sequence[str] = MODES,
    workers: int = 2,
    packs: int | None = 200,
    seq_length: int = 8192,
    preset: str = "qwen2.5-vl",
    progress: bool = True,
    tokenizer: Any = None,
    on_cell: Callable[[list[CellResult]], None] | None = None,
) -> list[CellResult]:
    """Every (mode, K) cell after an untimed :func:`~.loader_bench.warm_up`, in :func:`plan_cells`
    order; returned (and passed to ``on_cell`` after each cell) sorted by mode, then K. After each cell
    it prints the time it took and the time left (:func:`estimate_left`); after the first, a line when
    a cell reads more samples than the dataset holds (:func:`~.loader_bench.repeat_note`)."""
    plan = plan_cells(modes, buffers)
    print(
        f"sweep: {len(plan)} cells ({len(modes)} modes x {len(buffers)} K) x "
        + (f"{packs} packs" if packs is not None else "one full epoch each")
        + ", after an untimed warm-up"
        + ("; at each K the modes run next to each other, their order alternating" if len(modes) > 1 else ""),
        flush=True,
    )
    took = warm_up(path, modes=modes, buffer=min(buffers), seq_length=seq_length, preset=preset, tokenizer=tokenizer)
    print(f"warm-up (untimed): {_minutes(took)}", flush=True)
    order = {m: i for i, m in enumerate(modes)}
    cells: list[CellResult] = []
    done: list[tuple[int, float]] = []
    last = time.perf_counter()
    for i, (mode, k) in enumerate(plan):
        cell = run_cell(
            path,
            mode=mode,
            buffer=k,
            workers=workers,
            packs=packs,
            seq_length=seq_length,
            preset=preset,
            progress=progress,
            tokenizer=tokenizer,
        )
        cells.append(cell)
        cells.sort(key=lambda c: (order[c.mode], c.buffer))
        if on_cell is not None:
            on_cell(list(cells))
        if i == 0:
            note = repeat_note(cell.dataset_samples, cell.samples_read, f"cell 1 ({mode} K={k})")
            if note:
                print(note, flush=True)
        if i + 1 < len(plan):
            _wait_for_workers_to_exit()  # part of every cell's cost
            now = time.perf_counter()
            done.append((cell.samples_read + k * max(workers, 1), now - last))
            last = now
            left = estimate_left(done, [expected_reads(cell, k2, packs, workers) for _, k2 in plan[i + 1 :]])
            rate = sum(n for n, _ in done) / max(sum(t for _, t in done), 1e-9)
            print(
                f"cell {i + 1}/{len(plan)} ({mode} K={k}) took {_minutes(done[-1][1])}: about {_minutes(left)} "
                f"left ({rate:.0f} samples/s so far, full packs ahead)",
                flush=True,
            )
    return cells


# ------------------------------------------------------------------------------------------ replay (user data)
class _CostRecorder:
    """The pre-encode pass's ``batch``: one sample's packing cost, step cost (None when the encoder packs by
    tokens) or skip reason, and the loader worker that read it (each worker packs its own stream)."""

    __stateless__ = True

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder

    def __call__(self, samples: list) -> dict:
        from megatron.energon import WorkerConfig

        from energon_pack.energon.samples import SkippedSample

        sample = samples[0]
        active = WorkerConfig.active_worker_config
        worker = active.rank_worker_id() if active is not None else 0
        if isinstance(sample, SkippedSample):
            return {"worker": worker, "skip": sample.reason, "cost": None, "step": None}
        step = self.encoder.packing_step_cost(sample) if self.encoder.packing.balance == "compute" else None
        return {"worker": worker, "skip": None, "cost": tuple(int(c) for c in sample.cost), "step": step}


def preencode_costs(
    path: str | Path,
    *,
    workers: int = 2,
    seed: int = 0,
    packs: int | None = None,
    max_buffer: int = 0,
    **encoder_kw: Any,
) -> tuple[dict[int, list[tuple]], float, bool]:
    """({worker: [(cost, step cost, skip reason), ...] in the order that worker reads them}, seconds, whether
    the whole dataset was read): the
    dataset through the carry encoder's pre-encode only (token counts, image headers, video probes; no pixels),
    with the same workers and seed as a sweep cell, so each worker's stream is the one it packs.

    One pass when ``packs`` is None; else it stops once every worker has read what its share of ``packs`` packs
    can hold at most (``seq_length`` tokens each: a fill of 100%) plus ``max_buffer`` samples more (what a
    packer of the largest K holds), so a large dataset is not read whole for a 200-pack sweep."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack.energon.plan import planning_encoder
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    from .loader_bench import _stop_workers

    encoder = QwenVLPackingTaskEncoder(packing_mode="carry", seed=seed, **encoder_kw)
    recorder = planning_encoder(encoder)
    recorder.batch = _CostRecorder(encoder)
    dataset = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers, seed_offset=seed),
        task_encoder=recorder,
        repeat=False,
    )
    share = None if packs is None else -(-packs // max(workers, 1)) * encoder.packing.seq_length
    streams: dict[int, list[tuple]] = {}
    tokens: dict[int, int] = {}
    enough_at: dict[int, int] = {}  # per worker: the samples read when its tokens first covered its share
    start = time.perf_counter()
    loader = get_loader(dataset)
    iterator = iter(loader)
    whole = True
    for row in iterator:
        w = row["worker"]
        streams.setdefault(w, []).append((row["cost"], row["step"], row["skip"]))
        if share is None:
            continue
        tokens[w] = tokens.get(w, 0) + (row["cost"][0] if row["cost"] else 0)
        if tokens[w] >= share and w not in enough_at:
            enough_at[w] = len(streams[w])
        done = [len(streams[v]) >= n + max_buffer for v, n in enough_at.items()]
        if len(done) == max(workers, 1) and all(done):
            whole = False
            break
    _stop_workers(iterator, loader)
    return dict(sorted(streams.items())), time.perf_counter() - start, whole


def _worker_packs(stream: list[tuple], mode: str, buffer: int, encoder: Any, repeat: bool) -> Any:
    """(samples, tokens, skips) of each pack one worker emits from its pre-encoded ``stream`` (cycled when
    ``repeat``): carry through the encoder's own packer, rounds first-fit-decreasing over each buffer of ``buffer``
    samples (Energon's rounds); ``tokens`` its members' aligned tokens, ``skips`` the skip reasons met since the
    previous pack."""
    from energon_pack.packing import first_fit_decreasing

    capacity = encoder.packing_capacity()
    packer = encoder.make_packer(buffer) if mode == "carry" else None
    compute = mode == "carry" and encoder.packing.balance == "compute"
    skips: list[str] = []
    held: list[int] = []
    # a stream with no sample that fits a pack is read once, never cycled (it would emit nothing forever)
    repeat = repeat and any(r is None and all(c <= b for c, b in zip(cost, capacity)) for cost, _, r in stream)
    order = itertools.cycle(range(len(stream))) if repeat and stream else iter(range(len(stream)))
    for i in order:
        cost, step, reason = stream[i]
        if reason is not None:
            skips.append(reason)
            continue
        if packer is not None:
            groups = packer.push(i, cost, step) if compute else packer.push(i, cost)
            skips += [r for _, r in packer.pop_skipped()]
        else:
            held.append(i)
            groups = []
            if len(held) == buffer:
                groups, held = _rounds(held, stream, capacity, skips, first_fit_decreasing), []
        for group in groups:
            yield len(group), sum(stream[j][0][0] for j in group), skips
            skips = []
    last = packer.flush() if packer is not None else _rounds(held, stream, capacity, skips, first_fit_decreasing)
    for group in last:
        yield len(group), sum(stream[j][0][0] for j in group), skips
        skips = []


def _rounds(held: list[int], stream: list[tuple], capacity: tuple, skips: list[str], ffd: Any) -> list[list[int]]:
    if not held:
        return []
    result = ffd([stream[i][0] for i in held], capacity, on_oversize="skip")
    skips += ["oversize"] * len(result.skipped)
    return [[held[j] for j in group] for group in result.groups]


def replay_cell(
    streams: dict[int, list[tuple]], *, mode: str, buffer: int, packs: int | None, encoder: Any, workers: int
) -> CellResult:
    """One (mode, K) cell from the pre-encoded ``streams``: each worker's packer fed its own stream, the packs
    taken from the workers in turn (as the loader delivers them) until ``packs`` (None: one pass). Counts,
    fill and skips only: no pixels are decoded, so the speed, latency and memory columns are NaN."""
    seq_length = encoder.packing.seq_length
    gens = [_worker_packs(s, mode, buffer, encoder, packs is not None) for s in streams.values()]
    emitted = samples = real = 0
    skips: dict[str, int] = {}
    while gens and (packs is None or emitted < packs):
        for gen in list(gens):
            item = next(gen, None)
            if item is None:
                gens.remove(gen)
                continue
            members, tokens, met = item
            emitted += 1
            samples += members
            real += tokens
            for reason in met:
                skips[reason] = skips.get(reason, 0) + 1
            if packs is not None and emitted >= packs:
                break
    nan = float("nan")
    total = sum(len(s) for s in streams.values())
    return CellResult(
        mode=mode,
        buffer=buffer,
        workers=workers,
        packs=emitted,
        samples=samples,
        real_tokens=real,
        slots=emitted * seq_length,
        fill=real / max(emitted * seq_length, 1),
        samples_per_pack=samples / max(emitted, 1),
        packs_per_s=nan,
        samples_per_s=nan,
        first_batch_s=nan,
        peak_worker_rss_mb=nan,
        skips=dict(sorted(skips.items())),
        dataset_samples=total,
    )


def replay_sweep(
    path: str | Path,
    *,
    buffers: Sequence[int] = DEFAULT_BUFFERS,
    modes: Sequence[str] = MODES,
    workers: int = 2,
    packs: int | None = 200,
    seq_length: int = 8192,
    preset: str = "qwen2.5-vl",
    tokenizer: Any = None,
    progress: bool = False,
    on_cell: Callable[[list[CellResult]], None] | None = None,
) -> tuple[list[CellResult], CellResult]:
    """(the cells sorted by mode then K, one loader cell): the sweep of a user's dataset in one pre-encode pass
    (:func:`preencode_costs`) whose costs are replayed through each (mode, K)'s packer (:func:`replay_cell`:
    fill, samples per pack, skips), then one cell through the real loader (:func:`~.loader_bench.run_cell`,
    carry at the recommended K) for speed, first-batch latency and worker memory. Each sample is read once
    for the sweep instead of once per cell."""
    plan = plan_cells(modes, buffers)
    each = f"{packs} packs" if packs is not None else "one full epoch"
    print(
        f"sweep: {len(plan)} cells ({len(modes)} modes x {len(buffers)} K) x {each}, packed from costs pre-encoded "
        "once (token counts and media headers, no pixels); then one loader cell for speed, latency and memory",
        flush=True,
    )
    kw = dict(seq_length=seq_length, preset=preset, tokenizer=tokenizer)
    streams, took, whole = preencode_costs(path, workers=workers, packs=packs, max_buffer=max(buffers), **kw)
    read = sum(len(s) for s in streams.values())
    cap = "" if whole else f" (of more: what {packs} full packs and the largest K's buffer need at most)"
    print(f"pre-encode: {read:,} samples{cap} in {_minutes(took)} ({read / max(took, 1e-9):.0f} samples/s)", flush=True)
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    encoder = QwenVLPackingTaskEncoder(packing_mode="carry", **kw)
    order = {m: i for i, m in enumerate(modes)}
    cells: list[CellResult] = []
    for mode, k in plan:
        cell = replay_cell(streams, mode=mode, buffer=k, packs=packs, encoder=encoder, workers=workers)
        cells.append(cell if whole else replace(cell, dataset_samples=None))  # the dataset's size is unknown
        cells.sort(key=lambda c: (order[c.mode], c.buffer))
        if on_cell is not None:
            on_cell(list(cells))
    k = recommended_k(cells) or max(buffers)
    loader_packs = packs if packs is not None else None
    print(f"loader cell: carry K={k} ({each}), pixels decoded as in training", flush=True)
    _wait_for_workers_to_exit()
    measured = run_cell(path, mode="carry", buffer=k, workers=workers, packs=loader_packs, progress=progress, **kw)
    return cells, measured


def recommendation(
    cells: list[CellResult], mode: str = "carry", within: float = RECOMMEND_WITHIN
) -> tuple[int | None, str]:
    """(K, why): :func:`recommended_k`, or None and the reason the measurement cannot support one."""
    rows = [c for c in cells if c.mode == mode] or [c for c in cells if c.mode == cells[0].mode]
    if not rows:
        return None, "no cell finished"
    ks = sorted({c.buffer for c in rows})
    if len(ks) < 2:
        return None, (
            f"only K={ks[0]} was measured ({rows[0].mode}): a recommendation compares several K (e.g. --buffers 1,8,64)"
        )
    skipped = sum(sum(c.skips.values()) for c in rows)
    read = skipped + sum(c.samples for c in rows)
    if read and skipped > MAX_SKIPPED_SHARE * read:
        reasons: dict[str, int] = {}
        for c in rows:
            for reason, n in c.skips.items():
                reasons[reason] = reasons.get(reason, 0) + n
        top = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items(), key=lambda x: -x[1])[:3])
        fix = "; a larger --seq-length fits the oversize ones" if max(reasons, key=reasons.get) == "oversize" else ""
        return None, f"{skipped} of {read} samples read were skipped ({top}): too few were packed to choose K from{fix}"
    best = max(c.fill for c in rows)
    k = min(c.buffer for c in rows if c.fill >= best - within)
    return k, f"the smallest measured K whose {rows[0].mode} fill is within {within * 100:g} points of the best"


def recommended_k(cells: list[CellResult], mode: str = "carry", within: float = RECOMMEND_WITHIN) -> int | None:
    """The smallest measured K whose ``mode`` fill is within ``within`` (0.005 = 0.5 points) of that
    mode's best fill (the first mode measured when ``mode`` was not); None when the measurement
    cannot support one (:func:`recommendation` says why)."""
    return recommendation(cells, mode, within)[0]


def targets(cells: list[CellResult]) -> list[dict[str, Any]]:
    """Issue targets measured side by side: carry >= rounds at every K, RSS and latency ratios."""
    by = {(c.mode, c.buffer): c for c in cells}
    checks = []
    for k in sorted({c.buffer for c in cells}):
        if ("carry", k) in by and ("rounds", k) in by:
            checks.append(
                check(f"carry fill >= rounds fill at K={k}", by["carry", k].fill - by["rounds", k].fill, ">=", 0.0)
            )
    small, large = ("carry", 8), ("carry", 256)
    if small in by and large in by:
        checks.append(
            check(
                "carry worker RSS K=256 / K=8 <= 1.15",
                by[large].peak_worker_rss_mb / by[small].peak_worker_rss_mb,
                "<=",
                1.15,
            )
        )
        checks.append(
            check(
                "carry first-batch latency K=256 / K=8 <= 3",
                by[large].first_batch_s / by[small].first_batch_s,
                "<=",
                3.0,
            )
        )
    return checks


def markdown_table(cells: list[CellResult]) -> str:
    lines = [
        "| mode | K | packs | samples/pack | fill | packs/s | samples/s | real tokens/s | first batch (s) | "
        "peak worker RSS (MB) | skipped |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        lines.append(
            f"| {c.mode} | {c.buffer} | {c.packs} | {c.samples_per_pack:.1f} | {c.fill * 100:.2f}% | "
            f"{c.packs_per_s:.2f} | {c.samples_per_s:.1f} | {c.real_tokens_per_s:.0f} | {c.first_batch_s:.2f} | "
            f"{c.peak_worker_rss_mb:.0f} | "
            f"{sum(c.skips.values())} |"
        )
    return "\n".join(lines)


def figures(cells: list[CellResult], context: dict[str, Any] | None = None) -> dict[str, Any]:
    """Matplotlib figures ``fill``, ``rss``, ``latency`` and ``throughput`` against K.

    Each has a title with the run context (data path, width, workers, packs per cell), x ticks at
    the measured K, y from 0; the fill plot marks the fill target and the recommended K
    (:func:`recommended_k`: the smallest K within 0.5 fill points of the best carry fill)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    context = context or {}
    ks = sorted({c.buffer for c in cells})
    packs = context.get("packs")
    title = (
        f"{context.get('dataset', '?')}\nwidth {context.get('seq_length', '?')}, "
        f"{context.get('workers', '?')} workers, "
        f"{'one epoch' if packs is None else f'{packs} packs'} per cell"
        + (f", {context['preset']}" if context.get("preset") else "")
    )
    rec = recommended_k(cells)
    modes = [m for m in MODES if any(c.mode == m for c in cells)]

    def base(ylabel: str) -> tuple[Any, Any]:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("packing_buffer_size K (samples per worker)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.set_title(title, fontsize=8)
        return fig, ax

    def ticks(ax: Any) -> None:
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if len(ks) > 1:
            ax.set_xlim(ks[0] / 1.3, ks[-1] * 1.3)

    out = {}
    for attr, label, name in (
        ("fill", "bin fill: real tokens / slots (%)", "fill"),
        ("peak_worker_rss_mb", "peak RSS of all workers (MB)", "rss"),
        ("first_batch_s", "first-batch latency (s)", "latency"),
    ):
        fig, ax = base(label)
        top = 0.0
        for mode in modes:
            rows = sorted((c for c in cells if c.mode == mode), key=lambda c: c.buffer)
            ys = [getattr(c, attr) * (100 if attr == "fill" else 1) for c in rows]
            ax.plot([c.buffer for c in rows], ys, marker="o", label=mode)
            top = max([top, *[y for y in ys if y == y]])
        if attr == "fill":
            ax.axhline(
                FILL_TARGET * 100, color="green", linestyle="--", linewidth=1, label=f"fill target {FILL_TARGET:.0%}"
            )
            ax.set_ylim(0, 101)
        else:
            ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        if rec is not None:
            ax.axvline(
                rec,
                color="gray",
                linestyle=":",
                linewidth=1.5,
                label=f"recommended K={rec} (smallest K within 0.5 fill points of the best carry fill)"
                if attr == "fill"
                else f"recommended K={rec}",
            )
        ticks(ax)
        ax.legend(fontsize=7, loc="lower right" if attr == "fill" else "best")
        fig.tight_layout()
        out[name] = fig

    fig, ax = base("real (non-pad) tokens/s (solid)")
    ax2 = ax.twinx()
    ax2.set_ylabel("source samples/s (dashed)")
    top1 = top2 = 0.0
    for i, mode in enumerate(modes):
        rows = sorted((c for c in cells if c.mode == mode), key=lambda c: c.buffer)
        xs = [c.buffer for c in rows]
        color = f"C{i}"
        p = [c.real_tokens_per_s for c in rows]
        sm = [c.samples_per_s for c in rows]
        ax.plot(xs, p, marker="o", color=color, label=f"{mode} real tokens/s")
        ax2.plot(xs, sm, marker="s", linestyle="--", color=color, label=f"{mode} samples/s")
        top1 = max([top1, *[v for v in p if v == v]])
        top2 = max([top2, *[v for v in sm if v == v]])
    ax.set_ylim(0, top1 * 1.15 if top1 > 0 else 1)
    ax2.set_ylim(0, top2 * 1.15 if top2 > 0 else 1)
    ticks(ax)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="lower left")
    fig.tight_layout()
    out["throughput"] = fig
    return out


def plot(
    cells: list[CellResult],
    out: str | Path | RunFiles,
    context: dict[str, Any] | None = None,
    names: Sequence[str] = PLOTS,
) -> list[Path]:
    """PNG plots ``buffer_{name}.png`` of :func:`figures` (``names``: all of :data:`PLOTS` by default; replayed
    cells measure fill only) into ``out`` (a folder, or the run's :class:`RunFiles`)."""
    import matplotlib.pyplot as plt

    files = out if isinstance(out, RunFiles) else RunFiles(out, FILES)
    written = []
    for name, fig in figures(cells, context).items():
        if name not in names:
            plt.close(fig)
            continue
        path = files.path(f"buffer_{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(
    path: str | Path,
    out_dir: str | Path,
    *,
    plots: bool = True,
    tokenizer_name: str | None = None,
    replay: bool = False,
    project_targets: bool = True,
    **kw: Any,
) -> dict[str, Any]:
    """The sweep, its report and files (:data:`FILES` in ``out_dir``, created at the first write);
    ``buffer_sizes.json`` is rewritten after every cell (``"complete": false`` until the sweep ends), so
    an interrupted sweep keeps its finished cells. ``replay``: :func:`replay_sweep` (a user's dataset: one
    pre-encode pass, one loader cell) instead of a loader cell per (mode, K). ``project_targets``: judge the
    project's own benchmark targets (they are about its demo data: off for a user's dataset)."""
    files = RunFiles(out_dir, FILES)
    context = {
        "dataset": str(path),
        "seq_length": kw.get("seq_length", 8192),
        "workers": kw.get("workers", 2),
        "packs": kw.get("packs", 200),
        "preset": kw.get("preset", "qwen2.5-vl"),
        "tokenizer": tokenizer_name,
    }
    partial = {"dataset": str(path), "context": context, "complete": False}

    def save(done: list[CellResult]) -> None:
        files.write_json("buffer_sizes.json", {**partial, "cells": cells_to_json(done)})

    measured = None
    if replay:
        cells, measured = replay_sweep(path, on_cell=save, **kw)
    else:
        cells = sweep(path, on_cell=save, **kw)
    rec, why = recommendation(cells)
    result = {
        "dataset": str(path),
        "context": context,
        "complete": True,
        "replayed": replay,  # cells packed from one pre-encode pass (no speed columns), else a loader run each
        "cells": cells_to_json(cells),
        "recommended_k": rec,
        "recommendation": why,
        "targets": targets(cells) if project_targets else [],
    }
    if measured is not None:
        result["loader_cell"] = cells_to_json([measured])[0]
    if replay:
        print(format_replayed(cells))
        print(f"\nthrough the loader (carry K={measured.buffer}, pixels decoded):")
        print(format_cells([measured]))
    else:
        print(format_cells(cells))
    print(f"\nrecommended K = {rec}: {why}" if rec is not None else f"\nno recommended K: {why}")
    if result["targets"]:
        print("\nproject benchmark targets (for information):")
    for t in result["targets"]:
        print(format_target(t))
    if plots:
        try:
            result["plots"] = [str(p) for p in plot(cells, files, context, ("fill",) if replay else PLOTS)]
        except ImportError:
            print("matplotlib is not installed: no plots (pip install 'energon-pack[examples]')")
    files.write_json("buffer_sizes.json", result)
    table = markdown_table(cells) + "\n"
    if measured is not None:
        table = (
            "Cells replayed from one pre-encode pass (no speed columns); through the loader:\n\n"
            + table.replace("| nan ", "| - ")
            + "\n"
            + markdown_table([measured])
            + "\n"
        )
    files.write_text("buffer_sizes.md", table)
    print("\n" + files.announce())
    return result


def format_replayed(cells: list[CellResult]) -> str:
    """The replayed cells' table: counts, fill and skips (their speed columns were not measured)."""
    head = (
        f"{'mode':<7}{'K':>5}{'packs':>7}{'samples':>9}{'smp/pack':>9}{'fill':>8}{'real tok':>10}{'pad tok':>9}  skips"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        lines.append(
            f"{c.mode:<7}{c.buffer:>5}{c.packs:>7}{c.samples:>9}{c.samples_per_pack:>9.1f}{c.fill * 100:>7.2f}%"
            f"{c.real_tokens:>10}{c.slots - c.real_tokens:>9}  "
            + (", ".join(f"{k}={v}" for k, v in c.skips.items()) or "-")
        )
    return "\n".join(lines)
