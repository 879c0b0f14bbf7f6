"""Measure packing through the real Energon savable loader: fill, throughput, latency, worker RSS.

One *cell* streams one full epoch (or ``packs`` packed batches of a repeating stream) for one
(packing mode, buffer size K) with W workers and records bin fill (real tokens / slots), samples per pack,
packs/s, source
samples/s and real (non-pad) tokens/s, first-batch latency, peak RSS summed over all worker processes, and skips by
reason. ``energon-pack demo`` runs two cells (carry vs rounds); ``energon-pack bench`` and
``examples/compare_buffer_sizes.py`` sweep K.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

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
        del iterator, loader
    if bar is not None:
        bar.close()
    skips: dict[str, int] = {}
    for s in stats.values():
        for reason, count in s["skips"]:
            skips[reason] = skips.get(reason, 0) + count
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
    return [asdict(c) for c in cells]
