"""Python's garbage collector run between training steps, never inside one (Megatron-LM's ``--manual-gc``).

A generation-2 collection walks every tracked object: with a model, an optimizer and a loader in one process
it takes tens of milliseconds, and Python starts one whenever its allocation counters say so, which is in the
middle of some step. That step then lasts longer than its pack costs, and with data parallelism every rank
waits for it: the spikes no packing can balance. Collecting at a fixed step interval, between steps, puts that
time where it is the same for every rank (and, with ``interval`` equal on all ranks, at the same steps).

Use :class:`ManualGC` in a hand-written loop, or :func:`manual_gc_callback` with ``transformers.Trainer``.
"""

from __future__ import annotations

import gc
from typing import Any

#: steps between two full collections: the garbage of a step is mostly freed by reference counting; what a
#: cycle holds (autograd graphs kept by exceptions, closures) waits at most this many steps
DEFAULT_INTERVAL = 1


class ManualGC:
    """Disable automatic collection and collect every ``interval`` steps, between steps.

    Args:
        interval: steps between two collections (a count >= 1). Default 1: every step boundary; a large heap
            (many Python objects) may prefer more, as the collection then costs its time less often.
        generation: the generation collected (2: everything; 0 or 1: only the young objects, cheaper, for a
            heap that grows by cycles only slowly). Default 2.

    ``with ManualGC() as collector: for batch in loader: step(batch); collector.step()``. Leaving the block
    (or :meth:`stop`) turns automatic collection back on as it was.
    """

    def __init__(self, interval: int = DEFAULT_INTERVAL, generation: int = 2) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be a whole number of steps >= 1, got {interval!r}")
        if generation not in (0, 1, 2):
            raise ValueError(f"generation must be 0, 1 or 2, got {generation!r}")
        self.interval, self.generation = interval, generation
        self.steps = 0
        self.collections = 0
        self._was_enabled: bool | None = None

    def start(self) -> ManualGC:
        """Collect once now and turn automatic collection off."""
        if self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.collect()
            gc.disable()
        return self

    def step(self) -> None:
        """Call once after each training step: collects when ``interval`` steps have passed since the last."""
        self.steps += 1
        if self.steps % self.interval == 0:
            gc.collect(self.generation)
            self.collections += 1

    def stop(self) -> None:
        """Turn automatic collection back on if it was on before :meth:`start`."""
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None

    def __enter__(self) -> ManualGC:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def manual_gc_callback(interval: int = DEFAULT_INTERVAL, generation: int = 2) -> Any:
    """A ``transformers.TrainerCallback`` that runs :class:`ManualGC` over ``Trainer.train()``: collection off at
    the start of training, a collection every ``interval`` optimizer steps (after the step), back on at the end."""
    from transformers import TrainerCallback

    class ManualGCCallback(TrainerCallback):
        def __init__(self) -> None:
            self.collector = ManualGC(interval, generation)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.collector.start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.collector.step()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.collector.stop()

    return ManualGCCallback()
