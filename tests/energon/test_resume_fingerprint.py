"""A loader state restored where it does not belong (issue 20, items 4-7 and 12): another rank, world size,
worker count or shard list, or a state edited after saving, is a ResumeConfigError naming the change,
on the real Energon loader with worker processes."""

import warnings

import pytest
from test_resume_robust import loader as robust_loader

from energon_pack.energon.checkpoint import restore_state_rank, walk_state
from energon_pack.energon.fingerprint import ResumeConfigError, state_checksum
from energon_pack.errors import ConfigError
from harness.data import StressTaskEncoder, random_records, valid_keys, write_shards

warnings.filterwarnings("ignore", message=".*pin_memory.*")
SHARDS = [random_records(240, seed=5, max_len=300)[i : i + 60] for i in range(0, 240, 60)]
EXTRA = random_records(60, seed=6, max_len=300)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("fp"), SHARDS)


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """The same four shards plus a fifth, re-prepared: what a user gets after adding a shard."""
    return write_shards(tmp_path_factory.mktemp("fp_grown"), SHARDS + [EXTRA])


class OtherEncoder(StressTaskEncoder):
    """Another task encoder with the same packing knobs (as another preset or data format would be)."""


def loader(path, *, workers=2, **kw):
    """test_resume_robust's loader (buffer 16, width 512), with worker processes by default."""
    return robust_loader(path, workers=workers, **kw)


def keys(batches):
    return [k for b in batches for k in b["__keys__"]]


def state_after(ld, n):
    it = iter(ld)
    seen = [next(it) for _ in range(n)]
    return ld.save_state_rank(), keys(seen)


def refused(ld, state, knob, message):
    """Ours refuses at once; Energon's own restore_state_rank at once (0 workers) or when the workers start."""
    with pytest.raises(ResumeConfigError, match=message) as err:
        restore_state_rank(ld, state)
    assert err.value.knob == knob
    with pytest.raises(ConfigError, match=message) as err:
        ld.restore_state_rank(state)
        next(iter(ld))
    assert err.value.knob == knob


# ---------------------------------------------------------------- 4. another rank of the same world size
@pytest.mark.parametrize("workers", [0, 2])
def test_rank0_state_restored_on_rank1_is_refused(shards, workers):
    state, _ = state_after(loader(shards, rank=0, world=2, workers=workers), 3)
    refused(
        loader(shards, rank=1, world=2, workers=workers),
        state,
        "rank",
        r"rank: the state was saved on rank 0 of 2 and is restored on rank 1 of 2.*Fix: restore each rank's "
        r"own state",
    )


# ---------------------------------------------------------------- 5. another world size
def test_two_rank_state_restored_into_one_rank_is_refused(shards):
    state, _ = state_after(loader(shards, rank=0, world=2), 3)
    refused(loader(shards, rank=0, world=1), state, "rank", r"saved on rank 0 of 2 and is restored on rank 0 of 1")


# ---------------------------------------------------------------- 6. a shard added and re-prepared
@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_state_restored_after_a_shard_was_added_is_refused(shards, grown, mode):
    state, _ = state_after(loader(shards, mode=mode), 4)
    refused(
        loader(grown, mode=mode),
        state,
        "dataset",
        r"dataset: the dataset's shards changed since the state was saved \(added part-00004\.tar \(60 samples\)\).*"
        r"Fix: start a new epoch/run without restoring",
    )


def test_state_restored_after_a_shard_was_removed_is_refused(shards, grown):
    state, _ = state_after(loader(grown, workers=0), 4)
    with pytest.raises(ResumeConfigError, match=r"\(removed part-00004\.tar \(60 samples\)\)"):
        loader(shards, workers=0).restore_state_rank(state)


# ---------------------------------------------------------------- 12. another encoder (preset, format)
def test_state_restored_with_another_task_encoder_is_refused(shards):
    state, _ = state_after(loader(shards), 3)
    refused(
        loader(shards, encoder=OtherEncoder),
        state,
        "encoder",
        r"encoder: the state was saved with task encoder StressTaskEncoder, this loader has OtherEncoder",
    )


# ---------------------------------------------------------------- 7. a state whose parts were edited
def _edit(state, field, change):
    """Apply ``change`` to every ``field`` inside a save_state_rank() state (in place); return how many."""
    hits = []

    def visit(node):
        if field in node:
            change(node)
            hits.append(node)
        return False

    walk_state(state, visit)
    return len(hits)


def _drop_bins(node):
    node["_packer_state"] = {**node["_packer_state"], "bins": []}


def _bump_counter(node):
    stats = node["_packer_state"]["stats"]
    node["_packer_state"] = {**node["_packer_state"], "stats": {**stats, "samples": stats["samples"] + 1}}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("edit", [_drop_bins, _bump_counter], ids=["open-bins-removed", "counter-edited"])
def test_state_with_edited_parts_is_refused_not_half_restored(shards, workers, edit):
    full = keys(loader(shards, workers=workers))
    assert sorted(full) == valid_keys(SHARDS)
    state, _ = state_after(loader(shards, workers=workers), 3)
    assert _edit(state, "_packer_state", edit) == max(workers, 1)
    refused(
        loader(shards, workers=workers),
        state,
        "checkpoint",
        r"checkpoint: the loader state's parts \(open bins, held sample keys, counters\) do not match the "
        r"checksum.*Fix: restore an unmodified checkpoint",
    )


def test_state_without_its_fingerprint_is_refused(shards):
    state, _ = state_after(loader(shards, workers=0), 3)
    assert _edit(state, "_resume", lambda node: node.update(_resume=None)) == 1
    with pytest.raises(ResumeConfigError, match=r"checkpoint: the loader state has no resume fingerprint"):
        loader(shards, workers=0).restore_state_rank(state)


# ---------------------------------------------------------------- 12. another worker count
@pytest.mark.parametrize("caller", ["ours", "energon"])
@pytest.mark.parametrize("saved,restored", [(2, 0), (0, 2), (2, 4)])
def test_another_worker_count_is_a_resume_config_error(shards, saved, restored, caller):
    """Through ours and through Energon's own method (guarded once our encoder is built)."""
    state, _ = state_after(loader(shards, workers=saved), 3)
    ld = loader(shards, workers=restored)
    with pytest.raises(
        ResumeConfigError,
        match=rf"num_workers: the state was saved by a loader with "
        rf"num_workers={saved}, this loader has num_workers={restored}.*Fix: restore with "
        rf"num_workers={saved}",
    ) as err:
        restore_state_rank(ld, state) if caller == "ours" else ld.restore_state_rank(state)
    assert err.value.knob == "num_workers"


# ---------------------------------------------------------------- the same loader still resumes exactly
@pytest.mark.parametrize("workers", [0, 2])
def test_unchanged_loader_resumes_exactly_through_our_restore(shards, workers):
    full = keys(loader(shards, workers=workers))
    state, seen = state_after(loader(shards, workers=workers), 5)
    restored = loader(shards, workers=workers)
    restore_state_rank(restored, state)
    assert seen + keys(restored) == full


def test_carry_state_with_bins_removed_is_refused_even_with_a_recomputed_checksum(shards):
    """The carry-over wrapper checks its own parts against each other too (held keys vs open bins)."""
    state, _ = state_after(loader(shards, workers=0, balance="tokens"), 3)  # the tokens packer's open bins

    def drop_and_reseal(node):
        _edit(node, "_packer_state", _drop_bins)
        node["_resume"] = {**node["_resume"], "checksum": state_checksum(node["datasets"])}

    assert _edit(state, "_resume", drop_and_reseal) == 1
    with pytest.raises(
        ResumeConfigError,
        match=r"checkpoint: the carry-over state holds \d+ sample keys for \d+ "
        r"slots, but its open bins and pending packs place 0 slots",
    ) as err:
        ld = loader(shards, workers=0, balance="tokens")
        ld.restore_state_rank(state)
        next(iter(ld))
    assert err.value.knob == "checkpoint"


def _strip_added_knobs(node):
    """A state as a release before the balance knob saved it: its fingerprint has no balance / cost_model."""
    for knob in ("balance", "cost_model"):
        node["_resume"]["fingerprint"]["packing"].pop(knob)


def test_a_state_saved_before_the_balance_knob_resumes_by_tokens_and_the_default_names_the_fix(shards):
    """Before ``balance`` existed every carry run packed by tokens: such a state resumes exactly under
    balance="tokens", and under the new default (compute) it is refused naming the knob and the fix."""
    first = loader(shards, workers=0, finite=False, balance="tokens")
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.save_state_rank()
    reference = keys(next(it) for _ in range(4))  # the uninterrupted run
    assert _edit(state, "_resume", _strip_added_knobs) == 1
    again = loader(shards, workers=0, finite=False, balance="tokens")
    again.restore_state_rank(state)
    resumed = iter(again)
    assert keys(next(resumed) for _ in range(4)) == reference
    refused(loader(shards, workers=0, finite=False), state, "balance", "saved with balance='tokens'")


def test_jsonl_state_restored_after_lines_were_appended_is_refused(tmp_path):
    """A prepared .jsonl has no shards: its sample count stands for them."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl

    path = tmp_path / "sft.jsonl"
    line = '{"prompt": "question %d", "completion": "answer %d"}\n'
    path.write_text("".join(line % (i, i) for i in range(40)))
    assert prepare_jsonl(path) == 40

    def jsonl_loader():
        ds = get_train_dataset(
            str(path),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
            packing_buffer_size=8,
            task_encoder=TextPackingTaskEncoder(tokenizer="demo", seq_length=256),
        )
        return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)

    state, _ = state_after(jsonl_loader(), 2)
    with path.open("a") as f:
        f.write("".join(line % (i, i) for i in range(40, 50)))
    assert prepare_jsonl(path) == 50
    refused(
        jsonl_loader(),
        state,
        "dataset",
        r"dataset: the dataset's shards changed since the state was saved "
        r"\(sft\.jsonl now has 50 samples, not 40\)",
    )


def test_blend_with_a_repeated_shard_name_still_says_what_changed():
    """Two blended datasets may both have a part-00000.tar: a changed count there is still named."""
    from energon_pack.energon.fingerprint import check_fingerprint

    saved = dict(
        rank=0, world_size=1, num_workers=2, encoder="E", shards=[["part-00000.tar", 5], ["part-00000.tar", 7]]
    )
    with pytest.raises(
        ResumeConfigError,
        match=r"shards changed since the state was saved \(2 shards then, 2 now, "
        r"same names\)",
    ):
        check_fingerprint(saved, {**saved, "shards": [["part-00000.tar", 7], ["part-00000.tar", 7]]})


def test_a_shard_rewritten_with_the_same_sample_count_is_refused(tmp_path):
    """Same names, same counts, other bytes (a re-export with edited samples): the file sizes differ.
    (Tar pads members to 512 bytes: an edit that keeps every member within its blocks is not seen.)"""
    from energon_pack.energon import split_changed_dataset

    path = write_shards(tmp_path / "ds", SHARDS)
    state, _ = state_after(loader(path, workers=0), 3)
    write_shards(path, SHARDS[:3] + [[{**r, "edited": "x" * 600} for r in SHARDS[3]]])
    with pytest.raises(
        ResumeConfigError,
        match=r"dataset: the dataset's shards were rewritten since the state was "
        r"saved \(part-00003\.tar now has \d+ bytes, not \d+; same sample counts\)",
    ):
        restore_state_rank(loader(path, workers=0), state)
    write_shards(path, SHARDS[:3] + [[{**r, "edited": "x" * 600} for r in SHARDS[3]], EXTRA])
    with pytest.raises(ResumeConfigError, match=r"part-00003\.tar was rewritten \(\d+ bytes, not \d+\)"):
        split_changed_dataset(path, state, tmp_path / "views")
