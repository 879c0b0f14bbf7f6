"""What every sweep shares: its run folder, the loader over :mod:`harness.data`, stopping it, comparing batches."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch

SCALES = ("bounded", "full")


def stress_out_dir(out_dir, scale: str) -> Path:
    """Check ``scale``, create ``out_dir``, and silence the CPU-only pin_memory warning of the loaders."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    return out_dir


def batch_difference(a: dict, b: dict) -> str | None:
    """The first key where two batches differ (tensors bit for bit, dtype included), or None when
    they are the same; ``__restore_key__`` is not compared (it names the cut, not the content)."""
    if a.keys() != b.keys():
        return f"keys {sorted(set(a) ^ set(b))}"
    for k in a:
        if isinstance(a[k], torch.Tensor):
            if not (isinstance(b[k], torch.Tensor) and a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])):
                return k
        elif k != "__restore_key__" and a[k] != b[k]:
            return k
    return None


def close(loader) -> None:
    """Stop a loader's worker processes now (an abandoned infinite loader otherwise lingers for seconds)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def roundtrip(state):
    """``state`` through ``torch.save`` and ``torch.load``: a deep copy as a checkpoint file would give it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def make_loader(path, *, mode, workers, rank=0, world_size=1, finite, buffer=12, seq_length=512):
    """A savable loader over :mod:`harness.data` shards: ``finite`` reads one epoch (``get_val_dataset``),
    else a shuffled train stream; checkpoints after every sample."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset

    from .data import StressTaskEncoder

    te = StressTaskEncoder(seq_length=seq_length, packing_mode=mode)
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
    common = dict(batch_size=1, worker_config=wc, task_encoder=te, packing_buffer_size=buffer)
    if finite:
        ds = get_val_dataset(str(path), split_part="train", **common)
    else:
        ds = get_train_dataset(str(path), shuffle_buffer_size=8, max_samples_per_sequence=20, **common)
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)
