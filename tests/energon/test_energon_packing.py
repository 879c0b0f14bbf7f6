"""The Qwen-VL packing task encoder on the real megatron-energon loader, real shards, worker processes."""

import io
import warnings

import pytest
import torch
from megatron.energon import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)

from energon_pack.energon.chatml import CHATML_COOKERS
from energon_pack.energon.demo_data import expected_skips
from energon_pack.errors import ConfigError
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import batch_difference

warnings.filterwarnings("ignore", message=".*pin_memory.*")
SAMPLES = 600
SKIP_REASON = {
    "garbage_image": "corrupt_image",
    "truncated_image": "corrupt_image",
    "bad_json": "invalid_json",
    "no_assistant": "no_assistant_turn",
    "placeholder_mismatch": "media_count_mismatch",
    "overlong": "oversize",
}
SMALL_PRESET = get_preset("qwen2-vl", max_pixels=160 * 28 * 28)  # keeps pixel work small in tests


def encoder(**kw):
    kw.setdefault("seq_length", 4096)
    return QwenVLPackingTaskEncoder(tokenizer="demo", preset=SMALL_PRESET, **kw)


def train_ds(path, te, *, workers=0, rank=0, world_size=1, buffer=32, repeat=False, shuffle=None, seq=None):
    return get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=shuffle,
        max_samples_per_sequence=seq,
        worker_config=WorkerConfig(rank=rank, world_size=world_size, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=buffer,
        repeat=repeat,
    )


class KeysOnly(DefaultTaskEncoder):
    """Reads the raw stream (no packing) to learn the order in which one worker sees samples."""

    cookers = CHATML_COOKERS
    decoder = None

    @stateless
    def batch(self, samples):
        return [s.__key__ for s in samples]


def source_order(path):
    ds = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=KeysOnly(),
        repeat=False,
    )
    return [k for batch in get_loader(ds) for k in batch]


def keys_of(batches):
    return [k for b in batches for k in b["__keys__"]]


def tracked(batches):
    tracker = PackingStatsTracker()
    for b in batches:
        tracker.update(b["packing_stats"])
    return tracker


def expected_valid_keys():
    broken = {f"{i:07d}" for i in range(SAMPLES) if i % 97 == 96}
    return sorted({f"{i:07d}" for i in range(SAMPLES)} - broken)


@pytest.mark.parametrize("workers", [0, 2])
def test_finite_epoch_covers_every_valid_sample_once_and_counts_skips(demo_shards, workers):
    te = encoder()
    batches = list(get_loader(train_ds(demo_shards, te, workers=workers, buffer=32)))
    keys = keys_of(batches)
    assert sorted(keys) == expected_valid_keys()  # nothing lost, nothing duplicated
    tracker = tracked(batches)
    assert len(tracker.per_worker()) == max(workers, 1)
    total = tracker.total
    skips = dict(total.skips)
    want = {}
    for kind, count in expected_skips(SAMPLES).items():
        if count:
            want[SKIP_REASON[kind]] = want.get(SKIP_REASON[kind], 0) + count
    assert skips == want and sum(want.values()) == SAMPLES - len(expected_valid_keys())
    assert total.samples == len(keys) and total.packs == len(batches)
    assert total.real_tokens == sum(b["real_tokens"] for b in batches)
    for b in batches:
        assert b["input_ids"].shape[1] <= 4096 and b["total_tokens"] == b["input_ids"].shape[1]
        assert b["real_tokens"] == int(b["cu_seqlens_q"][-1])
        assert b["mrope_position_ids"].shape == (3, 1, b["input_ids"].shape[1])
        n_images = int(b["image_grid_thw"].shape[0]) if b["image_grid_thw"] is not None else 0
        if n_images:
            assert b["pixel_values"].shape[0] == int(b["image_grid_thw"].prod(dim=1).sum())


def test_fixed_width_alignment_and_static_cu_seqlens(demo_shards):
    te = encoder(seq_length=2048, cp=2, tp=2, sp=True, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=64)
    m = te.layout.pad_multiple
    assert m == 4
    batches = list(get_loader(train_ds(demo_shards, te, buffer=16)))
    assert len(keys_of(batches)) > 0
    for b in batches:
        assert b["input_ids"].shape == (1, 2048)
        assert b["cu_seqlens_q"].shape == (65,) and b["cu_seqlens_q_padded"].shape == (65,)
        n = b["num_segments"]
        padded = b["cu_seqlens_q_padded"][: n + 1]
        spans = padded[1:] - padded[:-1]
        assert all(int(s) % m == 0 for s in spans[:-1])
        assert int(padded[-1]) == 2048 and int(b["max_seqlen_q"]) == 2048
        assert float(b["loss_mask"][b["padding_mask"]].sum()) == 0.0
        assert torch.all(b["labels"][b["padding_mask"]] == -100)


def test_carry_fills_better_than_rounds_on_the_same_data(demo_shards):
    fills = {}
    for mode in ("carry", "rounds"):
        batches = list(get_loader(train_ds(demo_shards, encoder(packing_mode=mode), buffer=16)))
        assert sorted(keys_of(batches)) == expected_valid_keys()
        fills[mode] = sum(b["real_tokens"] for b in batches) / (4096 * len(batches))
    assert fills["carry"] > fills["rounds"]
    assert fills["carry"] > 0.95


def test_rounds_mode_partitions_each_buffer_like_energon(demo_shards):
    buffer = 8
    batches = list(get_loader(train_ds(demo_shards, encoder(packing_mode="rounds"), buffer=buffer)))
    order = source_order(demo_shards)
    assert sorted(order) == [f"{i:07d}" for i in range(SAMPLES)]
    valid = set(expected_valid_keys())
    rounds = [[k for k in order[i : i + buffer] if k in valid] for i in range(0, SAMPLES, buffer)]
    emitted = iter(batches)
    for chunk in rounds:
        if not chunk:
            continue
        seen = []
        while len(seen) < len(chunk):
            seen += next(emitted)["__keys__"]
        assert sorted(seen) == sorted(chunk)  # the packs of one round partition its buffer exactly
    assert next(emitted, None) is None


def test_two_ranks_are_disjoint_and_complete(demo_shards):
    per_rank = []
    for rank in range(2):
        batches = list(get_loader(train_ds(demo_shards, encoder(), rank=rank, world_size=2, workers=2, buffer=16)))
        per_rank.append(set(keys_of(batches)))
        assert len(keys_of(batches)) == len(per_rank[-1])
    assert not per_rank[0] & per_rank[1]
    assert sorted(per_rank[0] | per_rank[1]) == expected_valid_keys()


def _same(a, b):
    assert batch_difference(a, b) is None, batch_difference(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_save_restore_gives_identical_next_packs(demo_shards, workers):
    def make():
        ds = train_ds(
            demo_shards, encoder(seq_length=2048), workers=workers, buffer=24, repeat=True, shuffle=16, seq=10
        )
        return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)

    loader = make()
    it = iter(loader)
    states, refs = [], []
    for cut in (1, 5, 13):  # several points; open bins are carried at every one of them
        while len(refs) < cut:
            refs.append(next(it))
        states.append((cut, loader.save_state_rank()))
    tail = [next(it) for _ in range(8)]
    stream = refs + tail
    for cut, state in states:
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        restored = make()
        restored.restore_state_rank(torch.load(buf, weights_only=False))
        rit = iter(restored)
        for expected in stream[cut : cut + 6]:
            _same(next(rit), expected)


@pytest.mark.parametrize("balance", ["tokens", None], ids=["tokens", "default-compute"])
def test_restore_mid_buffer_holds_the_packers_samples(demo_shards, balance):
    """With one worker the wrapper is visible: save while samples sit in the packer (the tokens-only packer's
    open bins; the compute-balanced packer's held buffer, the default) and resume exactly."""
    from energon_pack.energon.carry_over import CarryOverPackingDataset
    from energon_pack.packing import ComputeBalancedPacker

    kw = {} if balance is None else {"balance": balance}
    ds = train_ds(demo_shards, encoder(seq_length=2048, **kw), buffer=40, repeat=True)
    loader = get_savable_loader(ds)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    wrapper = ds
    while not isinstance(wrapper, CarryOverPackingDataset):
        wrapper = wrapper.dataset
    packer = wrapper._packer
    assert packer.held > 0 and (isinstance(packer, ComputeBalancedPacker) if balance is None else packer.open_bins > 0)
    state = loader.save_state_rank()
    ref = [next(it) for _ in range(5)]
    restored = get_savable_loader(train_ds(demo_shards, encoder(seq_length=2048, **kw), buffer=40, repeat=True))
    restored.restore_state_rank(state)
    rit = iter(restored)
    for expected in ref:
        _same(next(rit), expected)
    assert all(int(b["real_tokens"]) > 0 for b in first)


def test_the_default_balances_compute_in_carry_mode_and_tokens_in_rounds():
    assert encoder(packing_mode="rounds").packing.balance == "tokens"
    assert encoder().packing.balance == "compute" and encoder().resume_knobs()["balance"] == "compute"


@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_single_pack_can_be_restored_from_its_restore_key(demo_shards, mode):
    # rounds: upstream PackingDataset.restore_sample strips the postencode prefix twice; ours does not
    ds = train_ds(demo_shards, encoder(seq_length=2048, packing_mode=mode), buffer=16)
    loader = get_savable_loader(ds)
    batch = next(iter(loader))
    assert loader.can_restore_sample()
    again = loader.restore_sample(batch["__restore_key__"])
    for k in ("input_ids", "labels", "loss_mask", "cu_seqlens_q", "cu_seqlens_q_padded", "pixel_values"):
        assert torch.equal(batch[k], again[k]), k


def test_val_dataset_flushes_partial_bins(demo_shards):
    te = encoder(seq_length=4096)
    ds = get_val_dataset(
        demo_shards,
        split_part="train",
        batch_size=1,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=16,
    )
    batches = list(get_loader(ds))
    assert sorted(keys_of(batches)) == expected_valid_keys()


def test_configuration_mistakes_name_the_knob(demo_shards):
    with pytest.raises(ConfigError, match="batch_size"):
        get_train_dataset(
            demo_shards,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            task_encoder=encoder(),
            packing_buffer_size=8,
        )
    with pytest.raises(ConfigError, match="packing_mode"):
        encoder(packing_mode="greedy")
    with pytest.raises(ConfigError, match="overlength"):
        encoder(overlength="truncate")
    with pytest.raises(ConfigError, match="pad_cu_seqlens"):
        encoder(pad_cu_seqlens=True)
    with pytest.raises(ConfigError, match="seq_lenght"):
        encoder(seq_lenght=10)
    with pytest.raises(ConfigError, match="packing_buffer_size"):
        train_ds(demo_shards, encoder(), buffer=0)


class ImageCounts(KeysOnly):
    @stateless
    def batch(self, samples):
        return [(s.__key__, sum(k.endswith(".jpg") for k in s.fields)) for s in samples]


def test_image_limits_are_counted_skips_through_the_loader(demo_shards):
    from energon_pack.qwen_vl import ChatConfig

    ds = get_train_dataset(
        demo_shards,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=ImageCounts(),
        repeat=False,
    )
    images = dict(pair for batch in get_loader(ds) for pair in batch)
    te = encoder(chat=ChatConfig(max_num_images=1))
    batches = list(get_loader(train_ds(demo_shards, te, workers=2, buffer=16)))
    keys = set(keys_of(batches))
    many = {k for k, n in images.items() if n > 1}
    assert many and not keys & many
    assert keys == set(expected_valid_keys()) - many
    assert dict(tracked(batches).total.skips)["too_many_images"] == len(many)


class FailingFinalPacker(QwenVLPackingTaskEncoder):
    """A final packer that fails on packs holding sample 0000005: those samples must be counted."""

    @stateless
    def pack_selected_samples(self, samples):
        if any(s.__key__ == "0000005" for s in samples):
            raise ValueError("boom")
        return super().pack_selected_samples(samples)


def test_final_packer_failures_are_counted_not_lost(demo_shards):
    te = FailingFinalPacker(tokenizer="demo", preset=SMALL_PRESET, seq_length=4096)
    batches = list(get_loader(train_ds(demo_shards, te, buffer=16)))
    keys = set(keys_of(batches))
    lost = set(expected_valid_keys()) - keys
    assert "0000005" in lost and len(keys) == len(keys_of(batches))
    assert dict(tracked(batches).total.skips)["final_pack_error"] == len(lost)
