"""Record a run's step times with the cost terms of what each step trained: the input of ``energon-pack calibrate``.

One JSON line per optimizer step (:class:`~energon_pack.packing.calibrate.StepTimeRecord`): its seconds and the
summed :func:`~energon_pack.packing.calibrate.pack_cost_terms` of its micro-batches. Three ways in:

* ``transformers.Trainer``: ``callbacks=[StepTimeCallback("steps.jsonl")]``. It times each optimizer step (from
  ``on_step_begin`` to ``on_step_end``: the forward, backward and optimizer step of its micro-batches; the batches
  are fetched before) and reads each micro-batch's terms from the forward kwargs the collator made
  (``PackedCollator``: ``cu_seq_lens_q``, ``image_grid_thw``, ``video_grid_thw``) through a forward pre-hook on the
  model, so it needs nothing from the collator and sees exactly what trained (evaluation forwards are left out).
* Your own loop: ``timer = StepTimer("steps.jsonl")``; ``with timer.step(batch): train_step(batch)`` per step (a
  list of micro-batches for gradient accumulation), or ``timer.record(batch, seconds)`` with a time you measured.
* Megatron-Bridge: ``finetune(cfg, timer.wrap_forward_step(vlm_step.forward_step, micro_batches=N))`` with ``N``
  the micro-batches of one iteration (global batch / (micro batch x data parallel)). The wrapper notes the batch
  each call draws from ``data_iterator`` and closes a step when the next iteration's first micro-batch starts: a
  step's time runs from one iteration's first forward to the next one's (forward, backward, optimizer; the last
  iteration is not recorded). Bridge's own timers (``timers("forward-backward")``, logged with
  ``logger.timing_log_level >= 1``) time the same span without the optimizer: to use them instead, note the
  batches with the wrapper built with ``micro_batches=0`` and call ``timer.end_step(seconds)`` with their value.

Time on the GPU with ``torch.cuda.Event`` pairs (read back lazily, a step later: no sync is added to a step) or,
on the CPU, ``time.perf_counter``. Record on one GPU, after the model and loader are as in training (same
compile mode, same width): with data parallelism a rank's step waits for the slowest rank, so its time is not
its own pack's. Nothing here prints: lines go to the file, warnings to ``logging``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.packing.calibrate import StepTimeRecord, pack_cost_terms, sum_terms

logger = logging.getLogger(__name__)

#: the keys of a batch (ours, HF forward kwargs, Bridge's) that :func:`pack_cost_terms` reads; only these are held
TERM_KEYS = (
    "input_ids",
    "attention_mask",
    "cu_seqlens_q",
    "cu_seq_lens_q",
    "cu_seqlens",
    "image_grid_thw",
    "video_grid_thw",
    "visual_inputs",
)


def _held(batch: Any) -> Any:
    """What a pending step keeps of a batch: the keys its terms need (a mapping of terms as it is)."""
    if isinstance(batch, Mapping) and "slots" not in batch:
        return {k: batch[k] for k in TERM_KEYS if batch.get(k) is not None}
    return batch


def _terms(batch: Any) -> dict[str, float]:
    """The terms of a noted batch: a terms mapping (has ``slots``) as it is, else :func:`pack_cost_terms`."""
    if isinstance(batch, Mapping) and "slots" in batch:
        return {k: float(v) for k, v in batch.items()}
    if not isinstance(batch, Mapping):
        raise ConfigError(
            "batch",
            f"is a {type(batch).__name__}, not a packed batch",
            "pass the batch dict (or the model's forward kwargs) of the step",
        )
    return pack_cost_terms(batch)


class _Clock:
    """CUDA events on ``device`` when it is a CUDA device, else ``time.perf_counter``."""

    def __init__(self, device: Any = None) -> None:
        self.cuda = False
        try:
            import torch

            if device is None:
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.cuda = torch.device(device).type == "cuda"
        except ImportError:
            pass
        if self.cuda:
            import torch

            self._event = functools.partial(torch.cuda.Event, enable_timing=True)

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = self._event()
        event.record()
        return event

    def done(self, mark: Any) -> bool:
        return not self.cuda or mark.query()

    def seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3


class StepTimer:
    """Writes one :class:`StepTimeRecord` line per step to ``path`` (see the module doc for the three ways in).

    Args:
        path: the JSONL file (truncated when the first line is written, unless ``append``).
        device: where the steps run; None: CUDA when available, else the CPU clock.
        append: add to an existing file instead of starting it again.
    """

    def __init__(self, path: str | os.PathLike, *, device: Any = None, append: bool = False) -> None:
        self.path = os.fspath(path)
        self.append = append
        self.clock = _Clock(device)
        self.steps = 0
        self._file: Any = None
        self._open: tuple[int, Any] | None = None  # (step, start mark) of the step being timed
        self._batches: list[Any] = []
        self._pending: deque[tuple[int, Any, Any, list[Any]]] = deque()
        self._calls = 0

    # ------------------------------------------------------------------ timing
    @property
    def timing(self) -> bool:
        """Whether a step is being timed (between :meth:`start_step` and :meth:`end_step`)."""
        return self._open is not None

    def start_step(self, step: int | None = None) -> None:
        """Start timing a step (numbered ``step``, else the next number); a step still open is ended first."""
        if self._open is not None:
            self.end_step()
        self._open = (self.steps if step is None else int(step), self.clock.mark())
        self._batches = []

    def note(self, batch: Any) -> None:
        """Add a micro-batch (a batch dict, forward kwargs, or a terms mapping) to the step being timed."""
        self._batches.append(_held(batch))

    def end_step(self, seconds: float | None = None) -> None:
        """End the step being timed: its record is written once its end is reached on the device (``seconds``:
        a time measured elsewhere, e.g. Bridge's timers, instead of this timer's own)."""
        if self._open is None:
            if seconds is None:
                return
            self._open = (self.steps, None)
        step, start = self._open
        if seconds is None:
            end = self.clock.mark()
        else:
            start, end = None, float(seconds)
        self._open = None
        self._pending.append((step, start, end, self._batches))
        self._batches = []
        self.steps = step + 1
        self._resolve(wait=False)

    def cancel_step(self) -> None:
        """Forget the step being timed (a failed step is no step time)."""
        self._open = None
        self._batches = []

    def step(self, batch: Any = None, *, step: int | None = None) -> _StepScope:
        """``with timer.step(batch): train_step(batch)``: the block timed as one step of ``batch`` (a batch, forward
        kwargs, terms, or a list of micro-batches)."""
        return _StepScope(self, batch, step)

    def record(self, batch: Any, seconds: float, *, step: int | None = None) -> None:
        """Write a step of ``batch`` (as in :meth:`step`) that took ``seconds`` (timed by you)."""
        self.start_step(step)
        for b in batch if isinstance(batch, (list, tuple)) else [batch]:
            self.note(b)
        self.end_step(seconds)

    # ------------------------------------------------------------------ Megatron-Bridge
    def wrap_forward_step(self, forward_step: Callable, *, micro_batches: int = 1) -> Callable:
        """``forward_step`` (Bridge's ``(state, data_iterator, model, ...)``) noting the batch each call draws from
        ``data_iterator``; every ``micro_batches`` calls a new step starts (the previous one ends there).
        ``micro_batches=0``: note only, you call :meth:`end_step` with Bridge's timer. ``functools.wraps`` keeps
        its name, so ``check_bridge_config(forward_step_func=...)`` still knows it."""
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 0:
            raise ConfigError(
                "micro_batches",
                f"is {micro_batches!r}",
                "pass the micro-batches of one iteration (global batch / (micro batch x data parallel)), or 0",
            )

        @functools.wraps(forward_step)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if micro_batches and self._calls % micro_batches == 0:
                self.start_step()
            elif not micro_batches and not self.timing:
                self._open = (self.steps, None)  # noted until end_step(seconds)
            self._calls += 1
            if "data_iterator" in kwargs:
                kwargs["data_iterator"] = _NotingIterator.around(kwargs["data_iterator"], self.note)
            elif len(args) > 1:
                args = (args[0], _NotingIterator.around(args[1], self.note), *args[2:])
            return forward_step(*args, **kwargs)

        return timed

    # ------------------------------------------------------------------ output
    def _resolve(self, wait: bool) -> None:
        """Write the pending steps whose end the device has reached (all of them with ``wait``)."""
        while self._pending:
            step, start, end, batches = self._pending[0]
            timed_here = start is not None
            if timed_here and not wait and not self.clock.done(end):
                break
            self._pending.popleft()
            seconds = self.clock.seconds(start, end) if timed_here else end
            record = StepTimeRecord(step, seconds, sum_terms(_terms(b) for b in batches))
            if self._file is None:
                self._file = open(self.path, "a" if self.append else "w", encoding="utf-8")  # noqa: SIM115
            self._file.write(record.as_json() + "\n")
            self._file.flush()

    def flush(self) -> None:
        """Write every ended step (waits for the device)."""
        self._resolve(wait=True)

    def close(self) -> None:
        """Write every ended step and close the file; a step still open (never ended) is not recorded."""
        self._open = None
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _StepScope:
    def __init__(self, timer: StepTimer, batch: Any, step: int | None) -> None:
        self.timer, self.batch, self.number = timer, batch, step

    def __enter__(self) -> StepTimer:
        self.timer.start_step(self.number)
        if self.batch is not None:
            for b in self.batch if isinstance(self.batch, (list, tuple)) else [self.batch]:
                self.timer.note(b)
        return self.timer

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            self.timer.end_step()
        else:
            self.timer.cancel_step()


class _NotingIterator:
    """An iterator passing each item through after ``note(item)``; other attributes are the wrapped one's."""

    def __init__(self, inner: Iterator, note: Callable[[Any], None]) -> None:
        self._inner, self._note = inner, note

    @classmethod
    def around(cls, inner: Any, note: Callable[[Any], None]) -> Any:
        if inner is None or isinstance(inner, (list, tuple)):  # a later pipeline stage, or virtual stages
            return inner
        return cls(inner, note)

    def __iter__(self) -> _NotingIterator:
        return self

    def __next__(self) -> Any:
        item = next(self._inner)
        self._note(item)
        return item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _callback_class() -> type:
    """:class:`StepTimeCallback`, built on first use (transformers imported then, not with this module)."""
    from transformers import TrainerCallback

    class StepTimeCallback(TrainerCallback):
        """A ``transformers.TrainerCallback`` writing one step-time line per optimizer step to ``path`` (the module
        doc says what is timed and where the terms come from); ``device`` and ``append`` as :class:`StepTimer`
        (the device defaults to the Trainer's)."""

        def __init__(self, path: str | os.PathLike, *, device: Any = None, append: bool = False) -> None:
            self.path, self.device, self.append = path, device, append
            self.timer: StepTimer | None = None
            self._hook: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if model is None or not hasattr(model, "register_forward_pre_hook"):
                raise ConfigError(
                    "model", "the Trainer passed no torch model to the callbacks", "train a torch.nn.Module"
                )
            if getattr(args, "world_size", 1) > 1:
                logger.warning(
                    "StepTimeCallback on %d processes: each rank's step waits for the slowest, so the times do not "
                    "follow this rank's packs; record the calibration run on one GPU",
                    args.world_size,
                )
            self.timer = StepTimer(self.path, device=self.device or args.device, append=self.append)
            self._hook = model.register_forward_pre_hook(self._forward, with_kwargs=True)

        def _forward(self, module: Any, args: tuple, kwargs: dict) -> None:
            if self.timer is not None and self.timer.timing:  # not an evaluation forward between steps
                self.timer.note(kwargs if kwargs else {"input_ids": args[0]})

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.timer is not None:
                self.timer.start_step(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.timer is not None:
                self.timer.end_step()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            if self.timer is not None:
                self.timer.close()

    return StepTimeCallback


def __getattr__(name: str) -> Any:
    if name == "StepTimeCallback":
        cls = globals()["StepTimeCallback"] = _callback_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
