"""A worker that has not begun iterating must report the checkpoint it will start from.

Energon 7.4.1's ``SavableDatasetWrapper`` answers ``get_checkpoint`` from a placeholder
``(state=None, sample_index=-1)`` until its ``__iter__`` stores the first real checkpoint; the command
thread can serve a ``save_state_rank()`` in that window (a worker slow to start on a loaded machine),
and the placeholder yields ``offset=1``: the restored loader skipped that worker's first batch (the
intermittent 5 mismatches of the resume sweep, workers=2, rounds, train: every pack of worker 1
after cut 1). See :mod:`energon_pack.energon.compat` (installed when the loader's encoder is built).
"""

from __future__ import annotations

import io
import threading

import pytest
import torch
import torch.utils.data

from harness.data import random_records, write_shards
from harness.loaders import batch_difference, close, make_loader


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    records = random_records(240, seed=11, max_len=300, bad_every=23)
    return write_shards(
        tmp_path_factory.mktemp("race") / "d", [records[i : i + 40] for i in range(0, len(records), 40)]
    )


KW = dict(mode="rounds", workers=2, finite=False)


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_unstarted_fresh_worker_reports_a_fresh_start_without_offset(data):
    loader = make_loader(data, **KW)
    wrapper = loader.dataset  # the SavableDatasetWrapper, as forked into each worker
    wrapper._worker_id = 1  # what __iter__ sets before it starts the command thread
    checkpoint = wrapper.get_checkpoint([0, -1])  # worker 0 emitted one batch, worker 1 none
    assert checkpoint.state is None and checkpoint.offset == 0  # Energon: offset 1 (skips a batch)


def test_unstarted_restored_worker_reports_its_pending_restore(data):
    first = make_loader(data, **KW)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = _roundtrip(first.save_state_rank())
    close(first)
    restored = make_loader(data, **KW)
    restored.restore_state_rank(state)
    wrapper = restored.dataset
    for worker in (0, 1):
        wrapper._worker_id = worker
        checkpoint = wrapper.get_checkpoint(restored._worker_sample_counters)
        saved = state.worker_states[worker]
        assert checkpoint.state is saved.state or checkpoint.state == saved.state
        assert checkpoint.state is not None and checkpoint.offset == saved.offset


def test_save_served_before_a_worker_starts_restores_every_pack(data, monkeypatch):
    """End to end, the race forced without timing: worker 1's main thread waits right after starting
    its command thread until that thread has answered the save (Energon takes the lock only then)."""
    import megatron.energon.savable_loader as savable_loader

    ref = make_loader(data, **KW)
    rit = iter(ref)
    reference = [next(rit) for _ in range(11)]
    close(ref)

    served = threading.Event()  # set in worker 1's copy by its own command thread
    wrapper_cls = savable_loader.SavableDatasetWrapper
    guarded = wrapper_cls.get_checkpoint

    def get_checkpoint(self, last_sample_indexes):
        try:
            return guarded(self, last_sample_indexes)
        finally:
            served.set()

    class CommandFirst(threading.Thread):
        def start(self):
            super().start()
            info = torch.utils.data.get_worker_info()
            if self.name == "command_thread" and info is not None and info.id == 1:
                assert served.wait(120), "the save was never served"

    class Threading:
        Thread = CommandFirst

        def __getattr__(self, name):
            return getattr(threading, name)

    monkeypatch.setattr(wrapper_cls, "get_checkpoint", get_checkpoint)
    monkeypatch.setattr(savable_loader, "threading", Threading())

    first = make_loader(data, **KW)
    fit = iter(first)
    next(fit)  # batch 0, from worker 0; worker 1 waits in its start
    state = _roundtrip(first.save_state_rank())
    close(first)
    assert state.worker_states[1].offset == 0

    monkeypatch.setattr(savable_loader, "threading", threading)
    restored = make_loader(data, **KW)
    restored.restore_state_rank(state)
    it = iter(restored)
    got = [next(it) for _ in range(10)]
    close(restored)
    assert [i + 1 for i, (a, b) in enumerate(zip(got, reference[1:])) if batch_difference(a, b)] == []
