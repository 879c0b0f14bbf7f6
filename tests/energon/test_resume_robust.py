"""Loader/resume robustness on the real Energon loader (issue 10): finite-stream resume, truncated
shards, copy-on-restore, the save-before-first-next hang, visible skips, rounds stats, config changes."""

import copy
import io
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset

from energon_pack.energon import AllSkippedError
from energon_pack.errors import ConfigError
from energon_pack.packing import PackingStatsTracker
from harness.data import StressTaskEncoder, random_records, valid_keys, write_shards
from harness.loaders import batch_difference

warnings.filterwarnings("ignore", message=".*pin_memory.*")
N = 240
SHARDS = [random_records(N, seed=3, max_len=300, bad_every=17)[i : i + 60] for i in range(0, N, 60)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("robust"), SHARDS)


def loader(
    path,
    *,
    mode="carry",
    workers=0,
    buffer=16,
    finite=True,
    packing=True,
    rank=0,
    world=1,
    encoder=StressTaskEncoder,
    **kw,
):
    kw.setdefault("seq_length", 512)
    te = encoder(packing_mode=mode, **kw)
    wc = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    common = dict(batch_size=1, worker_config=wc, task_encoder=te, packing_buffer_size=buffer if packing else None)
    if finite:
        ds = get_val_dataset(path, split_part="train", **common)
    else:
        ds = get_train_dataset(path, shuffle_buffer_size=None, max_samples_per_sequence=None, **common)
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def keys(batch):
    return list(batch["__keys__"]) if "__keys__" in batch else [batch["__key__"]]


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def same(a, b):
    assert batch_difference(a, b) is None, batch_difference(a, b)


# ---------------------------------------------------------------- 1. finite streams resume once
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_finite_stream_restored_near_its_end_yields_only_the_rest(shards, mode, workers):
    full = list(loader(shards, mode=mode, workers=workers))
    assert sorted(k for b in full for k in keys(b)) == valid_keys(SHARDS)
    for before_end in (2, 1):
        first = loader(shards, mode=mode, workers=workers)
        it = iter(first)
        for _ in range(len(full) - before_end):
            next(it)
        restored = loader(shards, mode=mode, workers=workers)
        restored.restore_state_rank(roundtrip(first.save_state_rank()))
        rest = list(restored)
        assert len(rest) == before_end
        for got, want in zip(rest, full[-before_end:]):
            same(got, want)
        # the pass is over: the next iteration of the restored loader is a whole new epoch
        again = sorted(k for b in restored for k in keys(b))
        assert again == valid_keys(SHARDS)


def test_finite_stream_without_packing_resumes_too(shards):
    full = [keys(b) for b in loader(shards, packing=False)]
    first = loader(shards, packing=False)
    it = iter(first)
    for _ in range(len(full) - 2):
        next(it)
    restored = loader(shards, packing=False)
    restored.restore_state_rank(first.save_state_rank())
    assert [keys(b) for b in restored] == full[-2:]


# ---------------------------------------------------------------- 2. truncated shard
def test_truncated_shard_names_the_file_and_the_fix(shards, tmp_path):
    copy_dir = tmp_path / "copy"
    shutil.copytree(shards, copy_dir)
    shard = copy_dir / "part-00002.tar"
    os.truncate(shard, os.path.getsize(shard) // 2)
    with pytest.raises(ConfigError, match=r"part-00002\.tar is truncated.*re-copy part-00002\.tar") as err:
        loader(copy_dir)
    assert err.value.knob == "dataset"
    os.remove(copy_dir / "part-00003.tar")
    with pytest.raises(ConfigError, match=r"part-0000[23]\.tar"):
        loader(copy_dir)


# ---------------------------------------------------------------- 3. restoring never mutates the state
@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_restoring_the_same_state_object_twice_gives_identical_packs(shards, mode):
    first = loader(shards, mode=mode, finite=False)
    it = iter(first)
    for _ in range(7):
        next(it)
    state = first.save_state_rank()
    snapshot = copy.deepcopy(state)
    runs = []
    for _ in range(2):
        restored = loader(shards, mode=mode, finite=False)
        restored.restore_state_rank(state)
        rit = iter(restored)
        runs.append([next(rit) for _ in range(6)])
    for a, b in zip(*runs):
        same(a, b)
    assert repr(state) == repr(snapshot)  # the caller's object is untouched


# ---------------------------------------------------------------- 4. save before the first next()
HANG = textwrap.dedent("""
    import sys, warnings
    warnings.filterwarnings("ignore")
    sys.path.insert(0, sys.argv[3])  # tests/stress: the harness
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
    from harness.data import StressTaskEncoder
    from energon_pack.energon import save_state_rank
    def make():
        ds = get_train_dataset(sys.argv[1], batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None,
                               worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
                               task_encoder=StressTaskEncoder(seq_length=512), packing_buffer_size=16)
        return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)
    loader = make()
    it = iter(loader)
    state = save_state_rank(loader) if sys.argv[2] == "ours" else loader.save_state_rank()
    first = [next(it)["__keys__"] for _ in range(3)]
    restored = make()
    restored.restore_state_rank(state)
    again = [b["__keys__"] for b, _ in zip(restored, range(3))]
    assert again == first, (again, first)
    print("OK", state is None)
""")


@pytest.mark.parametrize("caller", ["ours", "energon"])
def test_save_state_after_iter_before_next_does_not_hang(shards, tmp_path, caller):
    """Ours, and Energon's own method once our encoder is built (it installs the guard)."""
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    stress_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stress")
    out = subprocess.run(
        [sys.executable, str(script), str(shards), caller, stress_dir], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK True" in out.stdout  # nothing read yet: the initial state, which restores to the same stream


# ---------------------------------------------------------------- 5. hidden skips
@pytest.fixture(scope="module")
def all_bad(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("allbad"), [[{"bad": "missing_field"}] * 50] * 2)


@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_train_stream_of_only_bad_samples_raises_naming_the_reasons(all_bad, mode):
    with pytest.raises(AllSkippedError, match=r"skipped the first \d+ samples.*missing_field: \d+.*field names"):
        next(iter(loader(all_bad, mode=mode, finite=False, skip_guard=300)))


def test_skip_guard_fires_in_a_worker_process_too(all_bad):
    with pytest.raises(Exception, match=r"AllSkippedError.*missing_field"):
        next(iter(loader(all_bad, workers=2, finite=False, skip_guard=200)))


@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_finite_stream_of_only_bad_samples_warns_with_counts(all_bad, mode):
    with pytest.warns(RuntimeWarning, match=r"skipped its whole share.*missing_field: 100"):
        assert list(loader(all_bad, mode=mode)) == []


@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_skips_after_the_last_pack_reach_the_last_pack(tmp_path, mode):
    """Valid samples, then a tail of bad ones and of ones failing post-encode: all counted on the last pack."""
    records = [{"n": 200}] * 10 + [{"bad": "invalid_record"}] * 7 + [{"n": 30, "post_bad": "corrupt_image"}] * 3
    path = write_shards(tmp_path / "tail", [records])
    batches = list(loader(path, mode=mode, buffer=4))
    assert sorted(k for b in batches for k in keys(b)) == [f"{i:07d}" for i in range(10)]
    last = batches[-1]["packing_stats"]
    assert dict(last["skips"]) == {"invalid_record": 7, "corrupt_image": 3}


# ---------------------------------------------------------------- 6. rounds-mode stats survive restore
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_stats_survive_save_restore_exactly(shards, mode, workers):
    full = list(loader(shards, mode=mode, workers=workers))
    assert all(b["packing_stats"] is not None for b in full)
    first = loader(shards, mode=mode, workers=workers)
    it = iter(first)
    cut = len(full) // 2
    for _ in range(cut):
        next(it)
    restored = loader(shards, mode=mode, workers=workers)
    restored.restore_state_rank(roundtrip(first.save_state_rank()))
    rest = list(restored)
    assert [b["packing_stats"] for b in rest] == [b["packing_stats"] for b in full[cut:]]
    tracker = PackingStatsTracker()
    for b in full[:cut] + rest:
        tracker.update(b["packing_stats"])
    total = tracker.total
    assert total.samples == len(valid_keys(SHARDS)) and dict(total.skips) == {"invalid_record": N // 17}


# ---------------------------------------------------------------- 7. a changed configuration is refused
CHANGES = [
    ("packing_buffer_size", dict(buffer=8)),
    ("seq_length", dict(seq_length=1024)),
    ("cp", dict(cp=2)),
    ("pad_multiple", dict(tp=2, sp=True)),
    ("max_patches_per_pack", dict(max_patches_per_pack=4)),
    ("packing_mode", "other-mode"),
    ("seed", dict(seed=1)),
    ("lookahead_packs", dict(lookahead_packs=2.0)),
    ("min_fill", dict(min_fill=0.9)),
    ("max_age", dict(max_age=50)),
]


CASES = [(mode, 0, knob, change) for mode in ("carry", "rounds") for knob, change in CHANGES] + [
    (mode, 2, knob, change) for mode in ("carry", "rounds") for knob, change in CHANGES[:2]
]  # worker processes


@pytest.mark.parametrize("mode,workers,knob,change", CASES, ids=[f"{c[0]}-w{c[1]}-{c[2]}" for c in CASES])
def test_restore_with_a_changed_knob_is_a_config_error_naming_it(shards, mode, workers, knob, change):
    first = loader(shards, mode=mode, workers=workers, finite=False)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.save_state_rank()
    if change == "other-mode":
        kw = {"mode": "rounds" if mode == "carry" else "carry"}
    else:
        kw = {"mode": mode, **change}
    restored = loader(shards, workers=workers, finite=False, **kw)
    with pytest.raises(ConfigError, match=rf"{knob}: the checkpoint was saved with {knob}=") as err:
        restored.restore_state_rank(state)  # 0 workers: refused here; with workers: when they start
        next(iter(restored))
    assert err.value.knob == knob


def test_skip_guard_may_change_on_restore(shards):
    first = loader(shards, finite=False)
    it = iter(first)
    ref = [next(it) for _ in range(4)]
    state = first.save_state_rank()
    ref = [next(it) for _ in range(4)]
    restored = loader(shards, finite=False, skip_guard=5000)
    restored.restore_state_rank(state)
    for got, want in zip(restored, ref):
        same(got, want)
