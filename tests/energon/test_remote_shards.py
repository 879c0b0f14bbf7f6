"""The truncated-shard check on object storage: a shard cut short (an interrupted upload or sync) or
missing is named when the loader is built, from one HEAD per shard and the last 8 bytes of its
``.tar.idx`` (one ranged read), on parallel threads; no shard is read."""

import threading
from types import SimpleNamespace

import pytest
from megatron.energon import WorkerConfig, get_train_dataset

from _cli_entry import one_error_line
from energon_pack.cli import main
from energon_pack.energon import shards as shard_check
from energon_pack.errors import ConfigError
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

BUCKET = "energon-pack-test"


def build(path):
    te = QwenVLPackingTaskEncoder(
        tokenizer="demo", preset=get_preset("qwen2-vl", max_pixels=160 * 28 * 28), seq_length=2048
    )
    return get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
    )


@pytest.fixture
def damaged(s3_store, demo_shards, request):
    """A fresh upload of the demo dataset under its own prefix, for a test to damage."""
    prefix = f"damaged-{request.node.name}".replace("[", "-").replace("]", "")
    return s3_store.upload(demo_shards, prefix), prefix


def test_truncated_remote_shard_is_named(damaged, demo_shards, s3_store):
    url, prefix = damaged
    whole = (demo_shards / "demo-000003.tar").read_bytes()
    s3_store.client.put_object(Bucket=BUCKET, Key=f"{prefix}/demo-000003.tar", Body=whole[:-20000])
    end = int.from_bytes((demo_shards / "demo-000003.tar.idx").read_bytes()[-8:], "little")
    with pytest.raises(ConfigError) as err:
        build(url)
    assert err.value.problem == (
        f"shard {url}/demo-000003.tar is truncated: {len(whole) - 20000} bytes in object "
        f"storage, its index (demo-000003.tar.idx, 100 samples) ends at byte {end}"
    )


def test_missing_remote_shard_is_named(damaged, s3_store):
    url, prefix = damaged
    s3_store.client.delete_object(Bucket=BUCKET, Key=f"{prefix}/demo-000001.tar")
    with pytest.raises(ConfigError, match=rf"shard {url}/demo-000001\.tar is listed in the prepared index but missing"):
        build(url)


def test_cli_names_the_truncated_shard_in_one_line(damaged, demo_shards, s3_store, tmp_path, monkeypatch, capsys):
    url, prefix = damaged
    whole = (demo_shards / "demo-000005.tar").read_bytes()
    s3_store.client.put_object(Bucket=BUCKET, Key=f"{prefix}/demo-000005.tar", Body=whole[:1024])
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "bench",
                "--data",
                url,
                "--tokenizer",
                "demo",
                "--buffers",
                "4",
                "--packs",
                "1",
                "--workers",
                "0",
                "--no-plots",
                "--out-dir",
                "res",
            ]
        )
        == 2
    )
    line = one_error_line(capsys.readouterr().err, "bench")
    assert f"shard {url}/demo-000005.tar is truncated: 1024 bytes in object storage" in line


def test_one_head_and_one_ranged_read_per_shard_on_threads(remote_demo, demo_shards, monkeypatch):
    """Six shards: six size requests and six index reads, none on the calling thread; the sizes
    returned (for the resume fingerprint) are the files' sizes."""
    calls = {"size": [], "tail": []}

    def recorded(kind, function):
        def call(path, *args):
            calls[kind].append((path.rsplit("/", 1)[1], threading.get_ident()))
            return function(path, *args)

        return call

    monkeypatch.setattr(shard_check, "file_size", recorded("size", shard_check.file_size))
    monkeypatch.setattr(shard_check, "read_range", recorded("tail", shard_check.read_range))
    names = [f"demo-{i:06d}.tar" for i in range(6)]
    factory = SimpleNamespace(shards=[SimpleNamespace(path=f"{remote_demo}/{n}", count=100) for n in names])
    sizes = shard_check.check_shards(factory)
    assert sizes == {f"{remote_demo}/{n}": (demo_shards / n).stat().st_size for n in names}
    assert sorted(n for n, _ in calls["size"]) == names
    assert sorted(n for n, _ in calls["tail"]) == [n + ".idx" for n in names]
    assert threading.get_ident() not in {t for _, t in calls["size"] + calls["tail"]}
