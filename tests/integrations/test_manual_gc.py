"""ManualGC: Python's collector off during training, a collection between steps every ``interval`` steps."""

from __future__ import annotations

import gc
import weakref

import pytest

from energon_pack.integrations.manual_gc import ManualGC, manual_gc_callback


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def _cycle() -> weakref.ref:
    return weakref.ref(_Node())


def test_collects_between_steps_at_the_interval_and_restores_the_collector() -> None:
    assert gc.isenabled()
    with ManualGC(interval=2) as collector:
        assert not gc.isenabled()
        ref = _cycle()
        for _ in range(50_000):  # enough allocations to trigger an automatic collection were it on
            _Node()
        assert ref() is not None  # nothing collected inside the "step"
        collector.step()
        assert ref() is not None and collector.collections == 0  # step 1 of 2: no collection yet
        collector.step()
        assert ref() is None and collector.collections == 1  # freed at the step boundary
    assert gc.isenabled()


def test_an_already_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with ManualGC():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize(("interval", "generation"), [(0, 2), (True, 2), (1.5, 2), (1, 3)])
def test_bad_knobs_are_refused(interval, generation) -> None:
    with pytest.raises(ValueError, match="interval|generation"):
        ManualGC(interval, generation)


def test_trainer_callback_runs_it_over_train() -> None:
    pytest.importorskip("transformers")
    callback = manual_gc_callback(interval=1)
    callback.on_train_begin(None, None, None)
    try:
        assert not gc.isenabled()
        ref = _cycle()
        callback.on_step_end(None, None, None)
        assert ref() is None and callback.collector.collections == 1
    finally:
        callback.on_train_end(None, None, None)
    assert gc.isenabled()
