"""Steps per epoch on the Energon roads: the packs each rank's loader delivers in one pass, from headers only.

:func:`plan_epoch` streams the real loader once per rank (same dataset or Metadataset, seed, workers, ranks,
buffer and encoder knobs, ``repeat=False``) with the encoder's pre-encode only: token counts come from image
headers and video probes as in training, the packer is the same, and the pixel decode and THD building of
``postencode_sample`` / ``batch`` are left out. The count of packs per rank is therefore the count the training
loader delivers on that finite dataset, with one exception stated in :class:`EpochPlan`: a pack whose every
member fails at pixel decode (an image whose header reads but whose body is broken) is planned but not
delivered, so the plan is then an upper bound.

The words are the GPT-SFT road's (:class:`~energon_pack.sft.sampler.TokenBudgetBatchSampler`): packs per
rank, and ``steps_per_epoch`` the steps every rank takes for one pass (the largest rank's packs; that sampler
pads the short ranks to it, here a short rank starts its next pass when the loader repeats).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any

from megatron.energon import stateless

from energon_pack.errors import ConfigError
from energon_pack.packing import PackingStats, PackingStatsTracker


@dataclass(frozen=True)
class EpochPlan:
    """One pass over a finite dataset, per rank.

    Attributes:
        packs_per_rank: packs (micro-batches of one THD row) each rank's loader delivers, rank order.
        packs_per_worker: packs per (rank, worker).
        stats: the packing stats of all ranks (samples, fill, skips by reason, per source).
    """

    packs_per_rank: list[int]
    packs_per_worker: dict[tuple[int, int], int]
    stats: PackingStats = field(repr=False)

    @property
    def steps_per_epoch(self) -> int:
        """Steps for every rank to finish its share of one pass (the largest rank's packs)."""
        return max(self.packs_per_rank, default=0)

    def max_steps(self, epochs: float = 1.0, accumulation: int = 1) -> int:
        """An LR schedule's ``max_steps`` for ``epochs`` passes with ``accumulation`` packs per optimizer step."""
        if accumulation < 1:
            raise ConfigError("accumulation", f"must be at least 1, got {accumulation}", "pass packs per step >= 1")
        return -(-int(round(self.steps_per_epoch * epochs)) // accumulation)

    def summary(self) -> dict[str, Any]:
        return {
            "packs_per_rank": list(self.packs_per_rank),
            "steps_per_epoch": self.steps_per_epoch,
            "packs": sum(self.packs_per_rank),
            "samples": self.stats.samples,
            "fill": round(self.stats.fill, 6),
            "skips": dict(sorted(self.stats.skips.items())),
        }


@stateless
def _unchanged(sample: Any) -> Any:
    return sample


@stateless
def _count_only(samples: list) -> dict:
    stats = [s.packing_stats for s in samples if getattr(s, "packing_stats", None) is not None]
    return {"packing_stats": stats[-1] if stats else None, "__key__": "", "__restore_key__": ()}


def planning_encoder(task_encoder: Any) -> Any:
    """A copy of ``task_encoder`` whose post-encode and batch only pass packs on (no pixels, no THD rows)."""
    if not hasattr(task_encoder, "packing"):
        raise ConfigError(
            "task_encoder",
            f"{type(task_encoder).__name__} is not one of energon_pack's packing encoders",
            "pass a QwenVLPackingTaskEncoder or TextPackingTaskEncoder built with the run's knobs",
        )
    planner = copy.copy(task_encoder)
    planner.postencode_sample = _unchanged
    planner.batch = _count_only
    return planner


def plan_epoch(
    path: Any,
    task_encoder: Any,
    *,
    packing_buffer_size: int,
    ranks: int = 1,
    workers: int = 0,
    seed: int = 0,
    shuffle_buffer_size: int | None = None,
    max_samples_per_sequence: int | None = None,
    split_part: str = "train",
) -> EpochPlan:
    """The packs each of ``ranks`` ranks delivers in one pass of ``path`` (a prepared dataset or a Metadataset).

    Args:
        path: what ``get_train_dataset`` is given in training.
        task_encoder: the training run's encoder (copied, never changed).
        packing_buffer_size: the run's ``packing_buffer_size`` K.
        ranks: data-parallel ranks (``WorkerConfig.world_size``).
        workers: loader workers per rank (``num_workers``).
        seed: ``WorkerConfig.seed_offset`` (the shuffle and blend seed).
        shuffle_buffer_size, max_samples_per_sequence, split_part: as given to ``get_train_dataset``.
    """
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    if not isinstance(ranks, int) or ranks < 1:
        raise ConfigError("ranks", f"must be a positive int, got {ranks!r}", "pass the data-parallel world size")
    planner = planning_encoder(task_encoder)
    per_rank, per_worker, total = [], {}, PackingStats()
    for rank in range(ranks):
        dataset = get_train_dataset(
            path,
            split_part=split_part,
            batch_size=1,
            shuffle_buffer_size=shuffle_buffer_size,
            max_samples_per_sequence=max_samples_per_sequence,
            worker_config=WorkerConfig(rank=rank, world_size=ranks, num_workers=workers, seed_offset=seed),
            task_encoder=planner,
            packing_buffer_size=packing_buffer_size,
            repeat=False,
        )
        tracker, packs = PackingStatsTracker(), 0
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pin_memory.*")  # torch's, on a machine without a GPU
            for batch in get_loader(dataset):
                packs += 1
                tracker.update(batch["packing_stats"])
        per_rank.append(packs)
        for (r, worker), stats in tracker.per_worker().items():
            per_worker[(r, worker)] = stats.packs
        total = total.merge(tracker.total)
    return EpochPlan(per_rank, per_worker, total)
