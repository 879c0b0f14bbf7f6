"""Measure packing through the real Energon savable loader: fill, throughput, latency, worker RSS.

One *cell* streams one full epoch (or ``packs`` packed batches of a repeating stream) for one
(packing mode, buffer size K) with W workers and records bin fill (real tokens / slots), samples per pack,
packs/s, source samples/s and real (non-pad) tokens/s, first-batch latency, peak RSS summed over all worker
processes, skips by reason, and per source of a Metadataset blend its tokens, shares and skips
(:func:`format_sources`). ``energon-pack demo`` runs two cells (carry vs rounds); ``energon-pack bench`` and
``examples/compare_buffer_sizes.py`` sweep K.

Side-by-side speed figures are only comparable when no mode pays what the run pays once (the
tokenizer's first use, numba's compile or cache load, imports, the page cache): :func:`warm_up`
streams a few untimed packs of every mode first, and :func:`interleaved` runs the modes in ABBA
order (the later runs in reverse order), so a drift during the run is shared alike.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from energon_pack.packing import PackingStats

warnings.filterwarnings("ignore", message=".*pin_memory.*")


class RssSampler:
    """Polls the RSS of this process's children (the loader workers) and keeps the peak sum."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak_workers = 0
        self.peak_self = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
            self.peak_workers = max(self.peak_workers, total)
            self.peak_self = max(self.peak_self, me.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class CellResult:
    mode: str
    buffer: int
    workers: int
    packs: int
    samples: int
    real_tokens: int
    slots: int
    fill: float
    samples_per_pack: float
    packs_per_s: float
    samples_per_s: float
    first_batch_s: float
    peak_worker_rss_mb: float
    skips: dict = field(default_factory=dict)
    real_tokens_per_s: float = float("nan")
    #: timed runs merged into this cell (:func:`merge_runs`: counts summed, rates and latency the median)
    runs: int = 1
    #: source samples in the dataset (one pass of the split), None when the dataset cannot tell
    dataset_samples: int | None = None
    #: per source of a blend: the packing stats' raw counters (``PackingStats.sources``), see :func:`cell_sources`
    sources: dict = field(default_factory=dict)

    @property
    def samples_read(self) -> int:
        """Source samples this cell took from the dataset: packed ones and skipped ones (the few left in
        the buffers when it stopped are not counted)."""
        return self.samples + sum(self.skips.values())


def _wait_for_workers_to_exit(timeout: float = 10.0) -> None:
    gc.collect()
    deadline = time.time() + timeout
    while psutil.Process().children(recursive=True) and time.time() < deadline:
        time.sleep(0.05)


def run_cell(
    path: str | Path,
    *,
    mode: str,
    buffer: int,
    workers: int = 2,
    packs: int | None = None,
    seq_length: int = 8192,
    preset: str = "qwen2.5-vl",
    seed: int = 0,
    progress: bool = False,
    tokenizer: Any = None,
) -> CellResult:
    """Measure one (mode, K) cell: a full epoch when ``packs`` is None, else ``packs`` packs.

    ``tokenizer``: a Hugging Face / ``tokenizers`` tokenizer or a name (``"demo"``, ``"qwen2.5-vl"``, ...);
    None uses the preset's real Qwen-VL tokenizer (built offline)."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    if packs is not None and packs < 1:
        from energon_pack.errors import ConfigError

        raise ConfigError(
            "packs", f"must be at least 1, got {packs}", "pass a positive pack count, or None for one full epoch"
        )
    _wait_for_workers_to_exit()
    encoder = QwenVLPackingTaskEncoder(
        tokenizer=tokenizer, preset=preset, seq_length=seq_length, packing_mode=mode, seed=seed
    )
    dataset = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers, seed_offset=seed),
        task_encoder=encoder,
        packing_buffer_size=buffer,
        repeat=packs is not None,
    )
    dataset_samples = _dataset_samples(dataset)
    samples = real = emitted = real_first = 0
    stats: dict[tuple, dict] = {}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=packs, desc=f"{mode} K={buffer}", leave=False)
    with RssSampler() as rss:
        start = time.perf_counter()
        loader = get_savable_loader(dataset)
        iterator = iter(loader)
        first = None
        after_first = start
        for batch in iterator:
            emitted += 1
            samples += batch["num_segments"]
            real += batch["real_tokens"]
            if first is None:
                first = time.perf_counter() - start
                after_first = time.perf_counter()
                real_first = real
            s = batch["packing_stats"]
            if s is not None:
                stats[(s["rank"], s["worker"])] = s
            if bar is not None:
                bar.update(1)
            if emitted == packs:
                break
        elapsed_after_first = time.perf_counter() - after_first
        _stop_workers(iterator, loader)
        del iterator, loader
    if bar is not None:
        bar.close()
    skips: dict[str, int] = {}
    for s in stats.values():
        for reason, count in s["skips"]:
            skips[reason] = skips.get(reason, 0) + count
    sources = _merged_sources(PackingStats.from_state_dict(s).sources for s in stats.values())
    rate_packs = emitted - 1  # packs after the first one, over the time after the first one
    per_s = (lambda n: n / elapsed_after_first) if elapsed_after_first > 0 and emitted > 1 else (lambda n: float("nan"))
    return CellResult(
        mode=mode,
        buffer=buffer,
        workers=workers,
        packs=emitted,
        samples=samples,
        real_tokens=real,
        slots=emitted * seq_length,
        fill=real / (emitted * seq_length),
        samples_per_pack=samples / emitted,
        packs_per_s=per_s(rate_packs),
        samples_per_s=per_s(samples * rate_packs / emitted),
        first_batch_s=first or 0.0,
        peak_worker_rss_mb=(rss.peak_workers if workers else rss.peak_self) / 2**20,
        skips=dict(sorted(skips.items())),
        real_tokens_per_s=per_s(real - real_first),
        dataset_samples=dataset_samples,
        sources=sources,
    )


def _merged_sources(parts: Any) -> dict[str, dict]:
    """Per-source counters of several workers or runs, summed (plain dicts, for the JSON)."""
    total: dict[str, Counter] = {}
    for part in parts:
        for name, counts in part.items():
            total.setdefault(name, Counter()).update(counts)
    return {name: dict(sorted(c.items())) for name, c in sorted(total.items())}


def cell_sources(slots: int, sources: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """A cell's per-source numbers from its ``slots`` and ``sources`` (a :class:`CellResult`'s or its JSON's):
    :meth:`PackingStats.per_source` (tokens, shares, fill contribution, skips)."""
    return PackingStats(slots=slots, sources={k: Counter(v) for k, v in sources.items()}).per_source()


def format_sources(per_source: dict[str, dict[str, Any]]) -> str:
    """One line per source of a blend: samples, real and supervised tokens, token and cost shares, fill, skips."""
    head = (
        f"{'source':<16}{'samples':>9}{'real tok':>11}{'superv tok':>11}{'tok share':>10}{'cost share':>11}"
        f"{'fill':>8}  skips"
    )
    lines = [head, "-" * len(head)]
    for name, v in per_source.items():
        cost = "-" if v["cost_share"] is None else f"{v['cost_share'] * 100:.1f}%"
        supervised = v["supervised_tokens"] or "-"  # an epoch plan (no post-encode) knows no supervised tokens
        lines.append(
            f"{name[:15]:<16}{v['samples']:>9}{v['real_tokens']:>11}{supervised:>11}{v['token_share'] * 100:>9.1f}%"
            f"{cost:>11}{v['fill_contribution'] * 100:>7.2f}%  "
            + (", ".join(f"{k}={n}" for k, n in v["skips"].items()) or "-")
        )
    return "\n".join(lines)


def _stop_workers(iterator: Any, loader: Any) -> None:
    """End the loader's epoch and stop its worker processes now: left to the garbage collector, torch's
    persistent workers of a loader dropped mid-epoch linger about 10 s, which every next cell waited for."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    workers = getattr(loader, "_iterator", None)  # torch's persistent _MultiProcessingDataLoaderIter
    if workers is not None and hasattr(workers, "_shutdown_workers"):
        workers._shutdown_workers()


def _dataset_samples(dataset: Any) -> int | None:
    try:
        return int(len(dataset))
    except (TypeError, ValueError, NotImplementedError):
        return None


#: the warm-up's packing_buffer_size at most: what it pays for does not depend on K
WARM_UP_BUFFER = 8


def warm_up(path: str | Path, *, modes: Sequence[str], buffer: int, packs: int = 1, **kw: Any) -> float:
    """Stream ``packs`` untimed packs of every mode in this process (no workers, K at most
    :data:`WARM_UP_BUFFER`) and return the seconds it took: it pays the one-time costs (numba's compile
    or cache load, imports, the tokenizer's first use, the first reads of the shards) that would
    otherwise slow whichever mode is measured first. The worker processes of later cells are forked
    from this one and inherit what it loaded."""
    start = time.perf_counter()
    for mode in modes:
        run_cell(path, mode=mode, buffer=min(buffer, WARM_UP_BUFFER), workers=0, packs=packs, **kw)
    return time.perf_counter() - start


def abba(modes: Sequence[str], runs: int) -> list[tuple[int, str]]:
    """(run index, mode) in ABBA order: ``modes`` in the even runs, reversed in the odd ones."""
    return [(r, m) for r in range(runs) for m in (modes if r % 2 == 0 else list(reversed(modes)))]


def split_packs(packs: int, runs: int) -> list[int]:
    """``packs`` over ``runs`` runs, the first ones taking the remainder (``split_packs(5, 2) == [3, 2]``);
    fewer runs when a run would get fewer than 2 packs (a rate needs two)."""
    runs = max(1, min(runs, packs // 2))
    return [packs // runs + (1 if r < packs % runs else 0) for r in range(runs)]


def interleaved(
    path: str | Path, *, modes: Sequence[str], packs: int, runs: int = 2, **kw: Any
) -> tuple[list[CellResult], list[tuple[int, CellResult]]]:
    """(one merged cell per mode in ``modes`` order, every timed run as (run index, cell) in the order
    they ran): ``runs`` timed runs per mode, ``packs`` packs in all per mode, in :func:`abba` order.
    Run ``r`` uses seed ``seed + r`` for every mode, so the modes see the same samples and the runs of
    one mode different orders of them."""
    seed = kw.pop("seed", 0)
    split = split_packs(packs, runs)
    timed = [(r, run_cell(path, mode=mode, packs=split[r], seed=seed + r, **kw)) for r, mode in abba(modes, len(split))]
    return [merge_runs([c for _, c in timed if c.mode == m]) for m in modes], timed


def paired_ratios(timed: Sequence[tuple[int, CellResult]], a: str, b: str, attr: str) -> list[float]:
    """``attr`` of mode ``a`` over mode ``b`` in each run of :func:`interleaved` (the two ran next to each
    other, so a load that comes and goes during the whole run cancels out of each ratio)."""
    by = {(r, c.mode): getattr(c, attr) for r, c in timed}
    runs = sorted({r for r, _ in timed})
    return [by[r, a] / by[r, b] for r in runs if by.get((r, a), 0) > 0 and by.get((r, b), 0) > 0]


def merge_runs(cells: Sequence[CellResult]) -> CellResult:
    """The runs of one (mode, K) as one cell: packs, samples, tokens, slots and skips summed (fill from
    the sums), the rates and the first-batch latency the median of the runs, the peak RSS the largest."""
    first = cells[0]
    skips: dict[str, int] = {}
    for c in cells:
        for reason, n in c.skips.items():
            skips[reason] = skips.get(reason, 0) + n
    packs = sum(c.packs for c in cells)
    samples = sum(c.samples for c in cells)
    real = sum(c.real_tokens for c in cells)
    slots = sum(c.slots for c in cells)
    return replace(
        first,
        packs=packs,
        samples=samples,
        real_tokens=real,
        slots=slots,
        fill=real / slots,
        samples_per_pack=samples / packs,
        packs_per_s=finite_median([c.packs_per_s for c in cells]),
        samples_per_s=finite_median([c.samples_per_s for c in cells]),
        real_tokens_per_s=finite_median([c.real_tokens_per_s for c in cells]),
        first_batch_s=finite_median([c.first_batch_s for c in cells]),
        peak_worker_rss_mb=max(c.peak_worker_rss_mb for c in cells),
        skips=dict(sorted(skips.items())),
        runs=sum(c.runs for c in cells),
        sources=_merged_sources(c.sources for c in cells),
    )


def finite_median(values: Sequence[float]) -> float:
    """The median of the finite values (NaN: a run of one pack has no rate); NaN when none is."""
    finite = sorted(v for v in values if v == v)
    if not finite:
        return float("nan")
    mid = len(finite) // 2
    return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2


def _times(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def repeat_note(dataset_samples: int | None, reads: int, who: str) -> str | None:
    """One line when ``who`` (e.g. "each cell") reads more samples than the dataset holds (it then
    repeats the dataset), naming both numbers; None otherwise."""
    if not dataset_samples or reads <= dataset_samples:
        return None
    return (
        f"dataset holds {dataset_samples:,} samples; {who} reads {reads:,} "
        f"(it repeats the dataset {_times(reads / dataset_samples)} times)"
    )


def format_cells(cells: list[CellResult]) -> str:
    head = (
        f"{'mode':<7}{'K':>5}{'packs':>7}{'samples':>9}{'smp/pack':>9}{'fill':>8}{'real tok':>10}{'pad tok':>9}"
        f"{'packs/s':>9}{'smp/s':>8}{'real tok/s':>11}{'1st batch':>10}{'worker RSS':>11}  skips"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        lines.append(
            f"{c.mode:<7}{c.buffer:>5}{c.packs:>7}{c.samples:>9}{c.samples_per_pack:>9.1f}{c.fill * 100:>7.2f}%"
            f"{c.real_tokens:>10}{c.slots - c.real_tokens:>9}{c.packs_per_s:>9.2f}{c.samples_per_s:>8.1f}"
            f"{c.real_tokens_per_s:>11.0f}"
            f"{c.first_batch_s:>9.2f}s{c.peak_worker_rss_mb:>9.0f}MB  "
            + (", ".join(f"{k}={v}" for k, v in c.skips.items()) or "-")
        )
    return "\n".join(lines)


def cells_to_json(cells: list[CellResult]) -> list[dict]:
    return [{**asdict(c), "samples_read": c.samples_read} for c in cells]
