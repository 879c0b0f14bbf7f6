"""Accepting a dataset that gained a shard since the checkpoint (issue 20): the old shards resume exactly
from a view, the added shards stream from their own view, nothing is repeated or lost; removed or
resized shards are refused. Real Energon loaders with worker processes."""

import shutil
import warnings

import pytest
from test_resume_fingerprint import SHARDS, keys, loader, state_after

from energon_pack.energon import restore_state_rank, split_changed_dataset
from energon_pack.energon.fingerprint import ResumeConfigError
from energon_pack.errors import ConfigError
from harness.data import random_records, valid_keys, write_shards

warnings.filterwarnings("ignore", message=".*pin_memory.*")
EXTRA = random_records(50, seed=9, max_len=300)


def tree(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """(original, grown): the grown copy is the original folder plus one shard, re-prepared in place."""
    original = write_shards(tmp_path_factory.mktemp("orig"), SHARDS)
    grown = tmp_path_factory.mktemp("grown") / "ds"
    shutil.copytree(original, grown)
    write_shards(grown, SHARDS + [EXTRA])  # rewrites the same four shards and adds part-00004.tar
    return original, grown


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_added_shard_is_accepted_through_views_with_nothing_repeated(datasets, tmp_path, mode, workers):
    original, grown = datasets
    full = keys(loader(original, mode=mode, workers=workers))
    state, seen = state_after(loader(original, mode=mode, workers=workers), 4)
    before = tree(grown)

    views = split_changed_dataset(grown, state, tmp_path / "views")
    assert views.resume_shards == ("part-00000.tar", "part-00001.tar", "part-00002.tar", "part-00003.tar")
    assert views.added_shards == ("part-00004.tar",)
    assert tree(grown) == before  # the dataset is only read

    resumed = loader(views.resume, mode=mode, workers=workers)
    restore_state_rank(resumed, state)
    rest = keys(resumed)
    assert seen + rest == full  # the old shards continue bit for bit
    new = keys(loader(views.added, mode=mode, workers=workers))
    grown_keys = valid_keys(SHARDS + [EXTRA])
    assert sorted(new) == grown_keys[len(valid_keys(SHARDS)) :]  # only the added shard's samples
    assert sorted(seen + rest + new) == grown_keys  # every sample exactly once


def test_train_stream_resumes_on_the_view_as_on_the_original(datasets, tmp_path):
    """An endless (train) stream: the view continues with the same packs the uninterrupted run gives."""
    original, grown = datasets
    uninterrupted = iter(loader(original, finite=False, workers=2))
    expected = [keys_ for keys_ in (next(uninterrupted)["__keys__"] for _ in range(12))]
    state, _ = state_after(loader(original, finite=False, workers=2), 5)
    views = split_changed_dataset(grown, state, tmp_path / "views")
    resumed = loader(views.resume, finite=False, workers=2)
    restore_state_rank(resumed, state)
    it = iter(resumed)
    assert [next(it)["__keys__"] for _ in range(7)] == expected[5:]


def test_plain_restore_names_the_way_to_accept_added_shards(datasets):
    original, grown = datasets
    state, _ = state_after(loader(original, workers=0), 3)
    with pytest.raises(
        ResumeConfigError,
        match=r"added part-00004\.tar \(50 samples\).*Fix: .*"
        r"energon_pack\.energon\.split_changed_dataset\(dataset, state, out\)",
    ):
        restore_state_rank(loader(grown, workers=0), state)


def test_removed_or_resized_shards_are_refused(datasets, tmp_path):
    original, grown = datasets
    state, _ = state_after(loader(grown, workers=0), 3)
    with pytest.raises(
        ResumeConfigError,
        match=r"removed part-00004\.tar \(50 samples\)\); only added shards can be "
        r"accepted",
    ) as err:
        split_changed_dataset(original, state, tmp_path / "a")
    assert err.value.knob == "dataset"
    resized = write_shards(tmp_path / "resized", SHARDS[:3] + [SHARDS[3][:30], EXTRA])
    with pytest.raises(ResumeConfigError, match=r"part-00003\.tar now has 30 samples, not 60"):
        split_changed_dataset(resized, state, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_nothing_added_or_a_non_empty_out_is_a_config_error(datasets, tmp_path):
    original, grown = datasets
    state, _ = state_after(loader(original, workers=0), 3)
    with pytest.raises(
        ConfigError,
        match=r"state: .* has exactly the shards the state was saved with.*Fix: restore "
        r"the state into a loader on the dataset itself",
    ):
        split_changed_dataset(original, state, tmp_path / "v")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match=r"out: .*full is not empty"):
        split_changed_dataset(grown, state, tmp_path / "full")
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep"
