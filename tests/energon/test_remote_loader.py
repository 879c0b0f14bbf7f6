"""Energon's loader on shards in object storage (moto's S3 server, ``msc://``): the same packs and
the same resume as the local copy, through worker processes.

Energon reads remote shards through MSC; what we check is that nothing of ours (the carry packer,
the rounds packer, the resume fingerprint, the shard check) tells the two copies apart.
"""

import pytest
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from test_resume_robust import roundtrip  # the state as a checkpoint file gives it back

from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import batch_difference, close

SMALL_PRESET = get_preset("qwen2-vl", max_pixels=160 * 28 * 28)


def loader(path, mode, workers):
    """A repeating savable loader of 2,048-token packs over ``path``, shuffled (shard slices of 10)."""
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=SMALL_PRESET, seq_length=2048, packing_mode=mode)
    ds = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=16,
        max_samples_per_sequence=10,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=24,
        repeat=True,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def assert_same(got, expected):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert batch_difference(a, b) is None, f"pack {i}: {batch_difference(a, b)}"


@pytest.mark.parametrize("mode", ["carry", "rounds"])
@pytest.mark.parametrize("workers", [0, 2])
def test_remote_packs_equal_local(demo_shards, remote_demo, mode, workers):
    local, remote = loader(str(demo_shards), mode, workers), loader(remote_demo, mode, workers)
    expected, got = take(local, 12), take(remote, 12)
    close(local), close(remote)
    keys = [k for b in got for k in b["__keys__"]]
    assert len(set(keys)) == len(keys) > 24  # many samples, images among them, came through S3
    assert any(b["pixel_values"].numel() for b in got)
    assert_same(got, expected)


@pytest.mark.parametrize("mode, workers", [("carry", 2), ("rounds", 0)])
def test_resume_across_copies(demo_shards, remote_demo, mode, workers):
    """A state saved on the local copy restores on the remote one and vice versa: the same next packs."""
    copies = {"local": str(demo_shards), "remote": remote_demo}
    reference = loader(copies["local"], mode, workers)
    it = iter(reference)
    stream = [next(it) for _ in range(5)]
    state = roundtrip(reference.save_state_rank())
    stream += [next(it) for _ in range(6)]
    close(reference)
    for saved_on, restored_on in (("local", "remote"), ("remote", "local")):
        if saved_on == "remote":
            source = loader(copies["remote"], mode, workers)
            it = iter(source)
            assert_same([next(it) for _ in range(5)], stream[:5])
            state = roundtrip(source.save_state_rank())
            close(source)
        restored = loader(copies[restored_on], mode, workers)
        restored.restore_state_rank(state)
        assert_same(take(restored, 6), stream[5:])
        close(restored)


def test_split_changed_dataset_refuses_object_storage(remote_demo, demo_shards, tmp_path):
    """Its views symlink shards: a remote dataset or output is a ConfigError before anything is written."""
    from energon_pack.energon import split_changed_dataset
    from energon_pack.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^path: {remote_demo} is in object storage"):
        split_changed_dataset(remote_demo, {}, tmp_path / "views")
    with pytest.raises(ConfigError, match=rf"^out: {remote_demo}/views is in object storage"):
        split_changed_dataset(demo_shards, {}, f"{remote_demo}/views")
    assert list(tmp_path.iterdir()) == []
