"""``transformers.Trainer`` / ``trl.SFTTrainer`` on our packs: a dataset, a collator and checkpoint callbacks.

::

    loader = get_savable_loader(get_train_dataset(..., task_encoder=encoder, packing_buffer_size=K))
    dataset = PackedIterableDataset(loader)
    trainer = Trainer(
        model=prepare_model(model),
        args=TrainingArguments(output_dir, max_steps=N, **TRAINER_SETTINGS),
        train_dataset=dataset,
        data_collator=PackedCollator(model),
        compute_loss_func=packed_trainer_loss,
        callbacks=[EnergonStateCallback(dataset)],
    )

    # TRL: SFTTrainer(model=for_sft_trainer(prepare_model(model)), args=SFTConfig(..., **SFT_SETTINGS),
    #      train_dataset=trl_dataset(loader), data_collator=PackedCollator(model, supervised_logits=False), ...)

* :data:`TRAINER_SETTINGS` / :data:`SFT_SETTINGS`: what the Trainer's arguments (TRL's ``SFTConfig``) must say
  for packs: one pack per micro-batch, every key kept, no DataLoader workers (Energon has its own), no Accelerate
  dispatch (it would slice every tensor of a pack to its first row); for TRL also no preparing, packing or
  padding-free collating of its own. :func:`check_trainer_args` refuses other values by name.
* :class:`PackedIterableDataset`: a torch ``IterableDataset`` over the Energon loader (one pack per item), which
  the Trainer's DataLoader neither re-batches nor shuffles. It keeps the loader's state after each of its last
  packs, since the Trainer (through Accelerate) reads a pack ahead of the one it trains on. Over the GPT-SFT
  road's DataLoader it has the packing plan's length (:func:`steps_per_epoch`). :func:`trl_dataset`: the same,
  also a ``datasets.IterableDataset``, which TRL requires.
* :class:`PackedCollator`: a pack -> the model's forward kwargs (:func:`~.batch.hf_forward_kwargs`: positions,
  cu_seqlens for the varlen attention, no mask) plus ``labels`` in HF's unshifted form (:func:`trainer_labels`),
  from which the Trainer counts ``num_items_in_batch``: the supervised tokens of the whole accumulated step; and
  ``logits_to_keep`` (:func:`supervised_positions`), so no ``T x vocab`` logits are built.
* :func:`packed_trainer_loss`: the Trainer's ``compute_loss_func``: our loss summed over the supervised tokens and
  divided by ``num_items_in_batch`` (HF's Qwen-VL models keep that count from their own loss).
  :func:`for_sft_trainer`: the same count for TRL's fused LM head.
* :class:`PackedDataCallback`: the checks at construction and, with several ranks, Accelerate's
  ``IterableDatasetShard`` made a pass-through (each rank reads its own Energon shard).
  :class:`EnergonStateCallback` (one too): writes the loader state of the last trained pack into each checkpoint
  folder and restores it on ``resume_from_checkpoint``, so a resumed run trains the same packs as an
  uninterrupted one.

This module imports transformers at the top: the package loads it on first use of one of its names only.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info
from transformers import TrainerCallback

from energon_pack.errors import ConfigError
from energon_pack.integrations.hf.batch import hf_forward_kwargs
from energon_pack.integrations.hf.loss import packed_loss
from energon_pack.thd import IGNORE_INDEX

__all__ = [
    "SFT_SETTINGS",
    "TRAINER_SETTINGS",
    "EnergonStateCallback",
    "PackedCollator",
    "PackedDataCallback",
    "PackedIterableDataset",
    "check_trainer_args",
    "for_sft_trainer",
    "packed_trainer_loss",
    "steps_per_epoch",
    "supervised_positions",
    "trainer_labels",
    "trl_dataset",
]

logger = logging.getLogger(__name__)

#: The TrainingArguments settings our packs need: ``TrainingArguments(..., **TRAINER_SETTINGS)``.
TRAINER_SETTINGS: dict[str, Any] = {
    "per_device_train_batch_size": 1,
    "remove_unused_columns": False,
    "dataloader_num_workers": 0,
    "accelerator_config": {"dispatch_batches": False},
}

#: TRL's ``SFTConfig(..., **SFT_SETTINGS)``: :data:`TRAINER_SETTINGS` plus what keeps TRL from preparing, packing or
#: re-collating rows that are already packs.
SFT_SETTINGS: dict[str, Any] = {
    **TRAINER_SETTINGS,
    "dataset_kwargs": {"skip_prepare_dataset": True},
    "packing": False,
    "padding_free": False,
}

#: The file in each Trainer checkpoint folder that holds one rank's Energon loader state.
STATE_FILE = "energon_loader_state_rank{rank}.pt"


_SETTING_WHY = {
    "per_device_train_batch_size": "each pack is one THD row, already as full as the width",
    "remove_unused_columns": "the Trainer would drop the pack's keys its model's forward does not name",
    "dataloader_num_workers": "each DataLoader worker would replay the whole Energon stream",
    "accelerator_config": "Accelerate's dispatch slices every tensor of a pack to its first row",
    "dataset_kwargs": "TRL would tokenize the packs again as raw text",
    "packing": "TRL would pack the packs again, without their images",
    "padding_free": "TRL's own padding-free collator would replace PackedCollator",
}


def _is_sft_config(args: Any) -> bool:
    return hasattr(args, "packing") and hasattr(args, "dataset_kwargs")


def check_trainer_args(args: Any, dataset: Any = None) -> None:
    """Refuse ``TrainingArguments`` (or TRL's ``SFTConfig``) that break packs, naming the setting and
    :data:`TRAINER_SETTINGS` (:data:`SFT_SETTINGS` for an ``SFTConfig``), and a run over ``dataset`` without
    ``max_steps`` where ``dataset`` has no length (an Energon stream). :class:`PackedDataCallback` calls it."""
    sft = _is_sft_config(args)
    settings = SFT_SETTINGS if sft else TRAINER_SETTINGS
    recipe = "SFTConfig(..., **SFT_SETTINGS)" if sft else "TrainingArguments(..., **TRAINER_SETTINGS)"
    for knob, want in settings.items():
        got = getattr(args, knob, want)
        if knob == "accelerator_config":
            got = {"dispatch_batches": getattr(got, "dispatch_batches", None)}
        elif knob == "dataset_kwargs":
            got = {"skip_prepare_dataset": bool((got or {}).get("skip_prepare_dataset", False))}
        if got != want:
            raise ConfigError(
                knob,
                f"is {got!r}: {_SETTING_WHY[knob]}",
                f"set {knob}={want!r} ({recipe}, from energon_pack.integrations.hf)",
            )
    if dataset is not None and not _has_length(dataset) and (getattr(args, "max_steps", None) or 0) <= 0:
        raise ConfigError(
            "max_steps",
            f"is {getattr(args, 'max_steps', None)!r}: the packs come as a stream whose length the Trainer cannot "
            "read, so num_train_epochs cannot say when to stop",
            "set max_steps=energon_pack.energon.plan.plan_epoch(path, encoder, packing_buffer_size=K, ranks=R, "
            "workers=W).max_steps(epochs=E, accumulation=gradient_accumulation_steps) (the packs each rank delivers "
            "per pass, from headers only)",
        )


def _has_length(dataset: Any) -> bool:
    try:
        len(dataset)
    except TypeError:
        return False
    return True


def steps_per_epoch(sampler: Any, gradient_accumulation_steps: int = 1) -> int:
    """Optimizer steps per epoch of a GPT-SFT packing plan (a :class:`~energon_pack.sft.TokenBudgetBatchSampler`, the
    packs of this rank): the Trainer's ``max_steps`` for one epoch, which it cannot read from a stream of packs."""
    if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
        raise ConfigError(
            "gradient_accumulation_steps",
            f"must be an int >= 1, got {gradient_accumulation_steps!r}",
            "pass TrainingArguments.gradient_accumulation_steps",
        )
    return -(-len(sampler) // gradient_accumulation_steps)


class PackedIterableDataset(IterableDataset):
    """Our packs from ``loader`` (an Energon savable loader, or any iterable of packed batches) for a Trainer.

    With a savable loader (``save_state_rank``), the loader's state after each of the last ``keep`` packs is kept
    (:meth:`state_after`), for :class:`EnergonStateCallback`. Iterating it inside a DataLoader worker is refused:
    each worker would replay the whole stream. One stream runs through every iteration; a first iteration closed
    after one pack (TRL's ``SFTTrainer`` peeks at a sample when it is built) hands that pack to the next one.
    """

    def __init__(self, loader: Iterable[Mapping[str, Any]], *, keep: int = 16) -> None:
        if keep < 2:
            raise ConfigError("keep", f"must be at least 2, got {keep}", "leave keep=16")
        self.loader = loader
        self.savable = callable(getattr(loader, "save_state_rank", None))
        self._states: deque[tuple[int, Any]] = deque([(0, None)], maxlen=keep)
        self._yielded = 0
        self._pending: Any = None
        self._stream: Iterator[Mapping[str, Any]] | None = None
        self._peeked: tuple[Mapping[str, Any], Any] | None = None

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        if get_worker_info() is not None:
            raise ConfigError(
                "dataloader_num_workers",
                "the Trainer's DataLoader runs workers over the packs: each would replay the whole Energon stream",
                "leave dataloader_num_workers=0 (Energon runs its own workers: WorkerConfig(num_workers=...))",
            )
        if self._pending is not None:
            self.loader.restore_state_rank(self._pending)
            self._pending = None
            self._stream = None
        if self._stream is None:
            self._stream = iter(self.loader)
        first, here = self._yielded == 0, 0
        while True:
            if self._peeked is not None:
                pack, state = self._peeked
                self._peeked = None
            else:
                pack = next(self._stream, None)
                if pack is None:
                    self._stream = None  # the epoch ended: the next iteration starts the loader's next one
                    return
                state = self.loader.save_state_rank() if self.savable else None
            self._yielded += 1
            here += 1
            if self.savable:
                self._states.append((self._yielded, state))
            try:
                yield pack
            except GeneratorExit:
                if first and here == 1:  # a look at the first pack (TRL's SFTTrainer peeks at init): keep it
                    self._peeked = (pack, state)
                    self._yielded = 0
                    self._states.pop()
                raise

    def __len__(self) -> int:
        """Packs per epoch where the loader has a length and no Energon state (the GPT-SFT road: this rank's steps of
        the packing plan), so the Trainer derives ``max_steps`` from ``num_train_epochs`` and ends each epoch's
        last accumulated step where the plan ends; times the data-parallel world size, which Accelerate's
        ``IterableDatasetShard`` divides it by. A stream (Energon) has none: ``TypeError``, so the Trainer wants
        ``max_steps``."""
        if self.savable or not callable(getattr(self.loader, "__len__", None)):
            raise TypeError(f"a stream of packs from {type(self.loader).__name__} has no length: set max_steps")
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        return len(self.loader) * world

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the loader's batch sampler (a :class:`~energon_pack.sft.TokenBudgetBatchSampler`: its seeded
        order per epoch), which the Trainer cannot see through this dataset."""
        sampler = getattr(self.loader, "batch_sampler", None)
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)

    def state_after(self, packs: int) -> Any:
        """The loader's state after the first ``packs`` packs of this stream (since it was built or restored)."""
        for count, state in self._states:
            if count == packs:
                return state
        raise ConfigError(
            "keep",
            f"the loader state after pack {packs} is not kept (kept: {[c for c, _ in self._states]})",
            "save checkpoints from a Trainer over this dataset (it reads at most a pack ahead), or raise keep=",
        )

    def restore(self, state: Any) -> None:
        """Continue from ``state`` (a :meth:`state_after` result) at the next iteration."""
        if not self.savable:
            raise ConfigError(
                "loader",
                f"{type(self.loader).__name__} has no restore_state_rank",
                "build the dataset over megatron.energon.get_savable_loader(...)",
            )
        if self._stream is not None:
            raise ConfigError(
                "resume_from",
                f"the {type(self.loader).__name__} has already been read (TRL's SFTTrainer reads a pack when it is "
                "built), and a started Energon loader cannot be restored",
                "name the checkpoint before the trainer is built: EnergonStateCallback(dataset, "
                "resume_from=<checkpoint folder>) restores the loader at once",
            )
        self._pending = state
        self._peeked = None
        self._yielded = 0
        self._states.clear()
        self._states.append((0, state))


def trainer_labels(batch: Mapping[str, Any]) -> torch.Tensor:
    """HF's unshifted ``labels`` for a pack: HF's causal-LM loss predicts ``labels[i + 1]`` at position ``i``.

    Our ``labels`` are pre-shifted (the target at position ``i``) and supervised where ``loss_mask`` is 1; the
    result holds each supervised target one position later and ``-100`` elsewhere, so HF's shift gives back our
    targets and the Trainer's count of ``labels[..., 1:] != -100`` is the pack's supervised tokens.
    """
    labels, loss_mask = batch["labels"], batch["loss_mask"]
    keep = (loss_mask != 0) & (labels != IGNORE_INDEX)
    if bool(((loss_mask != 0) & (loss_mask != 1)).any()):
        raise ConfigError(
            "loss_mask",
            "holds weights other than 0 and 1, which HF's loss (one label per token) cannot carry",
            "train weighted packs with packed_loss / packed_loss_from_hidden in your own step",
        )
    if bool(keep[..., -1].any()):
        raise ConfigError(
            "labels",
            "the pack's last position is supervised: HF's shifted loss has no position before it to hold it",
            "pass the packs as the task encoder builds them (a segment's last label is always -100)",
        )
    out = torch.full_like(labels, IGNORE_INDEX)
    out[..., 1:] = labels[..., :-1].masked_fill(~keep[..., :-1], IGNORE_INDEX)
    return out


def for_sft_trainer(model: Any) -> Any:
    """``model`` (prepared with :func:`~energon_pack.integrations.hf.prepare_model`) made ready for TRL's
    ``SFTTrainer``: it says it accepts loss kwargs, so the Trainer counts ``num_items_in_batch`` and hands it to TRL's
    fused LM head, which divides by it. HF's Qwen-VL models say they do not (their own loss ignores it); the Trainer
    would then average per-pack means over gradient accumulation and ranks instead of weighting every supervised
    token the same. Returns ``model``."""
    model.accepts_loss_kwargs = True
    return model


@functools.cache
def _trl_dataset_class() -> type:
    import datasets

    class TRLPackedDataset(PackedIterableDataset, datasets.IterableDataset):
        """:class:`PackedIterableDataset` that is also a ``datasets.IterableDataset`` (of one shard)."""

        n_shards = 1  # Accelerate then leaves the ranks to PackedDataCallback instead of calling shard()

        def __repr__(self) -> str:
            return f"TRLPackedDataset({type(self.loader).__name__})"

    return TRLPackedDataset


def trl_dataset(loader: Iterable[Mapping[str, Any]], *, keep: int = 16) -> PackedIterableDataset:
    """A :class:`PackedIterableDataset` that TRL's ``SFTTrainer`` takes: TRL admits Hugging Face ``datasets``
    objects only, so this one is also a ``datasets.IterableDataset``; everything else is the same."""
    return _trl_dataset_class()(loader, keep=keep)


def supervised_positions(labels: torch.Tensor) -> torch.Tensor:
    """The positions of a one-row pack whose next token is supervised, from HF's unshifted ``labels``
    (:func:`trainer_labels`): the model's ``logits_to_keep``, and the rows :func:`packed_trainer_loss` expects."""
    return (labels[0, 1:] != IGNORE_INDEX).nonzero().flatten()


def packed_trainer_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """The Trainer's ``compute_loss_func`` for packs: cross entropy of the model's logits on the collator's labels,
    summed over the supervised tokens and divided by ``num_items_in_batch`` (the supervised tokens of the whole
    accumulated step, of every rank with ``average_tokens_across_devices``); by the pack's own count where the
    Trainer gives none. The logits are those of every position or those of :func:`supervised_positions` only.

    Needed because HF's Qwen-VL models declare ``accepts_loss_kwargs = False``: their own loss never sees
    ``num_items_in_batch``, and the Trainer would average per-pack means over gradient accumulation instead.
    """
    logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0]
    targets = labels[..., 1:]  # back to our pre-shifted form: the target at each position but the last
    if logits.shape[:-1] == labels.shape:
        logits = logits[..., :-1, :]
    else:
        targets = targets[targets != IGNORE_INDEX][None]
        if logits.reshape(-1, logits.shape[-1]).shape[0] != targets.numel():
            raise ConfigError(
                "logits_to_keep",
                f"the model returned logits of shape {tuple(logits.shape)} for {targets.numel()} supervised tokens",
                "pass logits_to_keep=supervised_positions(labels) (PackedCollator does) or no logits_to_keep",
            )
        logits = logits.reshape(1, -1, logits.shape[-1])
    loss, count = packed_loss(logits, {"labels": targets, "loss_mask": (targets != IGNORE_INDEX).to(torch.float32)})
    return loss / torch.as_tensor(count if num_items_in_batch is None else num_items_in_batch).to(loss).clamp(min=1)


class PackedCollator:
    """A Trainer's ``data_collator``: one pack -> ``model``'s forward kwargs and :func:`trainer_labels`.

    ``model`` is the model being trained (HF Qwen-VL or a text-only LLM; prepared with
    :func:`~energon_pack.integrations.hf.prepare_model`); ``preset`` normalises uint8 pixels, ``one_vision_call``
    as in :func:`~.batch.hf_forward_kwargs`. The kwargs stay on the CPU: the Trainer moves them.

    ``supervised_logits`` (default): ``logits_to_keep`` names the positions that predict a supervised token
    (:func:`supervised_positions`), so the model's LM head projects those rows only, never the ``T x vocab`` logits
    of the whole pack; :func:`packed_trainer_loss` reads either form. ``False`` for TRL's ``SFTTrainer``: its
    fused LM head (used without ``compute_loss_func``) already skips the unsupervised rows and never builds logits.
    """

    def __init__(
        self, model: Any, *, preset: Any = None, one_vision_call: bool = True, supervised_logits: bool = True
    ) -> None:
        self.model = model
        self.preset = preset
        self.one_vision_call = one_vision_call
        self.supervised_logits = supervised_logits

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if len(features) != 1:
            raise ConfigError(
                "per_device_train_batch_size",
                f"the collator got {len(features)} packs; each pack is one THD row, already as full as the width",
                "set per_device_train_batch_size=1",
            )
        batch = features[0]
        if not isinstance(batch, Mapping) or "cu_seqlens_q" not in batch or "loss_mask" not in batch:
            got = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ConfigError(
                "remove_unused_columns",
                f"the collator got {got}, not a packed batch (the Trainer dropped the keys its model does not take)",
                "set remove_unused_columns=False in TrainingArguments / SFTConfig",
            )
        kwargs = hf_forward_kwargs(
            batch,
            model=getattr(self.model, "module", self.model),
            preset=self.preset,
            one_vision_call=self.one_vision_call,
        )
        # None is every forward's default; TRL reads an attention_mask key as a tensor (its token count)
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        kwargs["labels"] = trainer_labels(batch)
        if self.supervised_logits:
            kwargs["logits_to_keep"] = supervised_positions(kwargs["labels"])
        return kwargs


class PackedDataCallback(TrainerCallback):
    """Keeps a Trainer's data path what packs need: :func:`check_trainer_args` when the Trainer is built, and, with
    several processes, Accelerate's ``IterableDatasetShard`` turned into a pass-through.

    Accelerate wraps an iterable dataset in that shard, which hands each rank every ``world_size``-th item of the
    stream it reads: with our packs each rank already reads its own Energon shard (``WorkerConfig`` rank and world
    size from ``torch.distributed``; GPT-SFT: ``TokenBudgetBatchSampler(num_replicas=, rank=)``), so the shard would
    drop all other packs. Any Trainer over a :class:`PackedIterableDataset` should carry this callback (or
    :class:`EnergonStateCallback`, which is one); with ``dataset`` it also checks that a stream has ``max_steps``.
    """

    def __init__(self, dataset: PackedIterableDataset | None = None) -> None:
        self.dataset = dataset

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        check_trainer_args(args, self.dataset)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        check_trainer_args(args, self.dataset)
        model = kwargs.get("model")
        base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        if _is_sft_config(args) and getattr(base, "accepts_loss_kwargs", True) is False:
            raise ConfigError(
                "model",
                f"{type(base).__name__} says it takes no num_items_in_batch: TRL's SFTTrainer would average per-pack "
                "means over gradient accumulation and ranks, not weigh every supervised token the same",
                "build SFTTrainer(model=for_sft_trainer(prepare_model(model)), ...)",
            )
        dataset = getattr(kwargs.get("train_dataloader"), "dataset", None)
        if type(dataset).__name__ == "IterableDatasetShard" and isinstance(dataset.dataset, PackedIterableDataset):
            if dataset.num_processes != 1:
                logger.info(
                    "rank %d reads its own packs: Accelerate's IterableDatasetShard (every %d-th pack) is a "
                    "pass-through",
                    dataset.process_index,
                    dataset.num_processes,
                )
            dataset.num_processes, dataset.process_index = 1, 0


class EnergonStateCallback(PackedDataCallback):
    """Saves the Energon loader state of ``dataset`` (a :class:`PackedIterableDataset`) in each checkpoint folder and
    restores it when the Trainer resumes from one; does what :class:`PackedDataCallback` does.

    The state saved at step ``s`` is the loader's after the packs the first ``s`` steps trained on (``s x
    gradient_accumulation_steps``), not after the pack read ahead. On resume (``trainer.train(
    resume_from_checkpoint=...)``) it is read from ``<output_dir>/checkpoint-<step>`` or ``resume_from``, and the
    Trainer's own skipping of the first batches is turned off (``ignore_data_skip``): the restored loader
    already starts at the next pack. With ``resume_from`` the loader is restored at once, before the trainer is
    built: needed for TRL's ``SFTTrainer``, which reads a pack when built (a started Energon loader cannot be
    restored).
    """

    def __init__(self, dataset: PackedIterableDataset, *, resume_from: str | os.PathLike[str] | None = None) -> None:
        if not isinstance(dataset, PackedIterableDataset) or not dataset.savable:
            raise ConfigError(
                "dataset",
                f"{type(dataset).__name__} keeps no loader state",
                "pass PackedIterableDataset(get_savable_loader(...))",
            )
        super().__init__(dataset)
        self.resume_from = resume_from
        self._first_step = 0
        self._restored = False
        if resume_from is not None:  # now, before a trainer (TRL's peeks at a pack when built) starts the loader
            rank = (
                torch.distributed.get_rank() if torch.distributed.is_initialized() else int(os.environ.get("RANK", 0))
            )
            self._restore(os.path.join(resume_from, STATE_FILE.format(rank=rank)), "resume_from")
            self._restored = True

    def _restore(self, path: str, knob: str, step: int | None = None) -> None:
        if not os.path.isfile(path):
            at = f"the run resumes at step {step} but " if step is not None else ""
            raise ConfigError(
                knob,
                f"{at}{path} holds no Energon loader state",
                "resume from a checkpoint written with EnergonStateCallback, or pass "
                "EnergonStateCallback(dataset, resume_from=<that checkpoint folder>)",
            )
        self.dataset.restore(torch.load(path, weights_only=False))

    @staticmethod
    def _path(folder: str | os.PathLike[str], args: Any) -> str:
        return os.path.join(folder, STATE_FILE.format(rank=args.process_index))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        self._first_step = state.global_step
        if state.global_step == 0:
            return
        if not self._restored:
            folder = self.resume_from or os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            self._restore(self._path(folder, args), "resume_from_checkpoint", state.global_step)
        if not args.ignore_data_skip:
            logger.info(
                "the Energon loader resumes at step %d: the Trainer's skip of batches is off", state.global_step
            )
            args.ignore_data_skip = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        packs = (state.global_step - self._first_step) * args.gradient_accumulation_steps
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        torch.save(self.dataset.state_after(packs), self._path(folder, args))
