"""Blend weights that reach target token (or compute) shares per source, measured on a short stream.

An Energon Metadataset ``blend:`` weight is a probability per *sample drawn*, so a source of long samples
(videos, multi-image documents) takes a larger share of the packed tokens, and of the GPU time, than its weight
says. :func:`plan_blend_weights` reads the blend (:func:`read_blend`), streams the first ``samples`` samples of
each source through the encoder's pre-encode and packer only (no pixel decode; :mod:`.plan`), and measures per
sample drawn (skips included) its packed tokens and step cost. Source ``i`` then gets weight
``target_i / per_sample_i`` (normalised to sum 1), the weight whose expected share is the target.
:func:`check_blend_shares` streams the blend with those weights (header-only again) and reports the shares
reached; :func:`write_blend` writes the Metadataset with the new weights.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.packing import PackingStats, PackingStatsTracker

from .plan import planning_encoder
from .sources import SOURCE_SUBFLAVOR

#: what a share can be of: packed tokens, or the step cost the packer prices
SHARES_BY = ("tokens", "compute")


@dataclass(frozen=True)
class BlendSource:
    """One entry of a Metadataset ``blend:``: its name in the packing stats, its dataset path and its entry."""

    name: str
    path: Path
    entry: dict


def read_blend(metadataset: str | Path, split: str = "train") -> list[BlendSource]:
    """The sources of a Metadataset's flat ``blend:`` (or ``blend_epochized:``) in ``split``, named as the
    packing stats name them (the ``source`` subflavor, else the dataset folder's name)."""
    import yaml

    path = Path(metadataset)
    config = yaml.safe_load(path.read_text())
    part = (config or {}).get("splits", {}).get(split) or {}
    entries = part.get("blend", part.get("blend_epochized"))
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "path" in e for e in entries):
        raise ConfigError(
            "metadataset",
            f"{path} has no flat blend of dataset paths in splits.{split}",
            "give a MetadatasetV2 whose splits.train.blend lists entries with path: and weight: (nested blends "
            "are not planned)",
        )
    out = []
    for entry in entries:
        name = (entry.get("subflavors") or {}).get(SOURCE_SUBFLAVOR) or Path(str(entry["path"])).name
        out.append(BlendSource(str(name), (path.parent / str(entry["path"])).resolve(), dict(entry)))
    return out


@dataclass(frozen=True)
class BlendPlan:
    """Per source: ``measured`` (samples drawn, packed tokens and step cost per drawn sample) and ``weights``."""

    by: str
    targets: dict[str, float]
    measured: dict[str, dict[str, float]]
    weights: dict[str, float]


def parse_shares(text: str) -> dict[str, float]:
    """``"a=0.5,b=0.3,c=0.2"`` -> ``{"a": 0.5, ...}``, checked to be positive and to sum to 1."""
    shares = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            shares[name.strip()] = float(value) if sep else float("nan")
        except ValueError:
            shares[name.strip()] = float("nan")
    if not shares or not all(v > 0 for v in shares.values()) or abs(sum(shares.values()) - 1) > 1e-6:
        raise ConfigError(
            "target_shares",
            f"{text!r} is not a list of name=share with positive shares summing to 1",
            "write e.g. photos=0.5,videos=0.3,chat=0.2",
        )
    return shares


def _stream_stats(path: Any, task_encoder: Any, *, buffer: int, samples: int, seed: int, repeat: bool) -> PackingStats:
    """The packing stats of the header-only stream of ``path`` (in this process) after ``samples`` samples read."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    dataset = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0, seed_offset=seed),
        task_encoder=planning_encoder(task_encoder),
        packing_buffer_size=buffer,
        repeat=repeat,
    )
    tracker = PackingStatsTracker()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")  # torch's, on a machine without a GPU
        for batch in get_loader(dataset):
            tracker.update(batch["packing_stats"])
            total = tracker.total
            if total.samples + total.skipped >= samples:
                break
    return tracker.total


def _per_drawn(stats: PackingStats, name: str) -> dict[str, float]:
    counts = stats.sources.get(name)
    drawn = 0 if counts is None else counts["samples"] + sum(v for k, v in counts.items() if k.startswith("skip:"))
    if not drawn or not counts["samples"]:
        raise ConfigError(
            "target_shares",
            f"source {name!r} delivered no sample in the measured stream",
            "check that dataset (energon-pack bench --data on it), or leave it out of the targets",
        )
    return {
        "drawn": drawn,
        "tokens": counts["real_tokens"] / drawn,
        "compute": counts["step_cost"] / drawn,
    }


def plan_blend_weights(
    metadataset: str | Path,
    task_encoder: Any,
    targets: dict[str, float],
    *,
    by: str = "tokens",
    samples: int = 1000,
    packing_buffer_size: int = 64,
    seed: int = 0,
) -> BlendPlan:
    """The blend weights whose expected ``by`` share per source is ``targets`` (every source named once).

    Args:
        metadataset: the Metadataset YAML whose ``blend:`` lists the sources.
        task_encoder: the run's packing encoder (copied; pre-encode and packer only).
        targets: source name -> share, summing to 1 (:func:`parse_shares`).
        by: ``"tokens"`` (packed tokens) or ``"compute"`` (the step cost the packer prices; ``balance="compute"``
            or a ``cost_model``).
        samples: samples read per source for the measurement (the first ones of one pass).
        packing_buffer_size, seed: the loader's knobs for the measurement.
    """
    if by not in SHARES_BY:
        raise ConfigError("by", f"must be one of {SHARES_BY}, got {by!r}", "use tokens or compute")
    sources = read_blend(metadataset)
    names = [s.name for s in sources]
    if sorted(targets) != sorted(names):
        raise ConfigError(
            "target_shares",
            f"names {sorted(targets)} are not the blend's sources {sorted(names)}",
            f"give one share for each of {', '.join(names)}",
        )
    measured = {}
    for source in sources:
        stats = _stream_stats(
            source.path, task_encoder, buffer=packing_buffer_size, samples=samples, seed=seed, repeat=False
        )
        if source.name not in stats.sources and len(stats.sources) == 1:  # a subflavor name set in the blend only
            stats.sources = {source.name: next(iter(stats.sources.values()))}
        measured[source.name] = _per_drawn(stats, source.name)
    if by == "compute" and not all(m["compute"] > 0 for m in measured.values()):
        raise ConfigError(
            "by",
            "the encoder prices no step cost, so compute shares cannot be measured",
            "use balance='compute' or pass cost_model, or plan by tokens",
        )
    raw = {name: targets[name] / measured[name][by] for name in names}
    norm = sum(raw.values())
    return BlendPlan(by, dict(targets), measured, {name: raw[name] / norm for name in names})


def write_blend(metadataset: str | Path, weights: dict[str, float], out: str | Path) -> Path:
    """``metadataset`` with its ``blend:`` weights replaced by ``weights`` (by source name), written to ``out``;
    the dataset paths are rewritten relative to ``out``'s folder."""
    import os

    import yaml

    path, out = Path(metadataset), Path(out)
    config = yaml.safe_load(path.read_text())
    part = config["splits"]["train"]
    entries = []
    for source in read_blend(path):
        entry = {k: v for k, v in source.entry.items() if k not in ("weight", "repetitions")}
        entry["path"] = os.path.relpath(source.path, out.resolve().parent)
        entries.append({"weight": round(float(weights[source.name]), 6), **entry})
    part.pop("blend_epochized", None)
    part["blend"] = entries
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def check_blend_shares(
    metadataset: str | Path,
    task_encoder: Any,
    *,
    samples: int = 4000,
    packing_buffer_size: int = 64,
    seed: int = 0,
) -> PackingStats:
    """The packing stats (``per_source()`` shares) of ``samples`` samples of the blend as the loader draws them
    (repeating; pre-encode and packer only)."""
    return _stream_stats(metadataset, task_encoder, buffer=packing_buffer_size, samples=samples, seed=seed, repeat=True)
