"""Bounded waits on object storage, against moto's S3 server behind a front that accepts a whole-shard
GET under ``stall/`` and never answers it, and drips the body of a shard or index under ``drip/`` (1 byte per 0.5 s,
tests/_s3_server.py): the read fails within the wait budget in one error naming the object and the knob, from the
main process and from loader workers, also where the user configured nothing (the default waits); the CLI says it in
one line."""

import os
import re
import subprocess
import sys
import time

import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from _cli_entry import energon_pack
from _s3_server import PROFILE_MULTIPART, PROFILE_STALL
from energon_pack.cli.wording import exit_status, one_line
from energon_pack.energon.demo_data import make_demo_shards
from energon_pack.errors import ConfigError
from energon_pack.object_waits import TIMEOUT_ENV, WAIT_BUDGET_ENV, ObjectStoreTimeout, configure_object_waits
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.storage import epath, read_range


@pytest.fixture(scope="module")
def stalled_demo(s3_store, demo_shards):
    """The demo dataset under ``stall/``, read through the stalling front: its ``msc://`` path."""
    s3_store.upload(demo_shards, "stall/demo")
    return s3_store.url("stall/demo", PROFILE_STALL)


@pytest.fixture(scope="module")
def dripping(s3_store, tmp_path_factory):
    """2 shards of 10 demo samples under ``drip/``: the bodies of their shards and indexes drip (the loader's own
    reads of ``.nv-meta`` and the shard check's 8-byte index tails do not): their ``msc://`` path and local folder."""
    shards = make_demo_shards(tmp_path_factory.mktemp("drip"), samples=20, per_shard=10, seed=1)
    s3_store.upload(shards, "drip/demo")
    return s3_store.url("drip/demo", PROFILE_STALL), shards


@pytest.fixture
def bounded():
    configure_object_waits(connect_timeout=1, read_timeout=1, wait_budget=4)
    yield
    configure_object_waits(wait_budget=None)


@pytest.fixture
def bounded_short():
    configure_object_waits(connect_timeout=1, read_timeout=1, wait_budget=2)
    yield
    configure_object_waits(wait_budget=None)


def _expected_start(error: ObjectStoreTimeout, budget: int) -> str:
    return (
        f"wait_budget: {error.url}: not delivered after {error.waited:.0f} s (attempt 1 of 3, {budget} s wait budget; "
        "last error: WaitBudgetTimeout). Fix: "
    )


@pytest.mark.parametrize("profile", [PROFILE_STALL, PROFILE_MULTIPART])
def test_dripping_shard_ends_at_the_budget(dripping, bounded_short, profile):
    """Each recv gets a byte well within the 1 s read timeout, so only the wall-clock budget ends the download: in the
    calling thread (a small shard, one GET) and in s3transfer's threads (MSC's multipart download, here above 1 KiB)."""
    url = dripping[0].replace(PROFILE_STALL, profile)
    began = time.monotonic()
    with pytest.raises(ObjectStoreTimeout) as caught, (epath(url) / "demo-000000.tar").open("rb") as f:
        f.read()
    elapsed, error = time.monotonic() - began, caught.value
    assert error.url == f"{url}/demo-000000.tar" and error.attempts == 1 and 2 <= error.waited < 30
    assert str(error).startswith(_expected_start(error, 2)) and elapsed < 30  # never: 174 KB at 2 bytes/s


def test_dripping_range_read_ends_at_the_budget(dripping, bounded_short):
    shard = str(epath(dripping[0]) / "demo-000000.tar")
    with pytest.raises(ObjectStoreTimeout) as caught:
        read_range(shard, 512, 4096)
    assert caught.value.url == shard and str(caught.value).startswith(_expected_start(caught.value, 2))


def _first_pack(path: str, workers: int) -> dict:
    encoder = QwenVLPackingTaskEncoder(
        tokenizer="demo", preset=get_preset("qwen2-vl", max_pixels=160 * 28 * 28), seq_length=2048
    )
    dataset = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=encoder,
        packing_buffer_size=8,
        repeat=False,
    )
    return next(iter(get_loader(dataset)))


@pytest.mark.parametrize("workers", [0, 2])
def test_dripping_index_fails_the_loader_in_one_error(dripping, bounded_short, workers):
    """A worker's first read, the shard's ``.tar.idx``, drips: the loader raises our error itself (not MSC's
    ``OSError: Failed to download file``, not torch's worker traceback), in one line naming the object and the knob."""
    began = time.monotonic()
    with pytest.raises(ObjectStoreTimeout) as caught:
        _first_pack(dripping[0], workers)
    error = caught.value
    assert error.url in {f"{dripping[0]}/demo-00000{i}.tar.idx" for i in (0, 1)}
    assert str(error).startswith(_expected_start(error, 2)) and "\n" not in str(error)
    assert time.monotonic() - began < 30


def test_stalled_object_fails_within_budget_naming_it(stalled_demo, demo_shards, bounded):
    shard = epath(stalled_demo) / "demo-000000.tar"
    assert shard.size() == os.path.getsize(demo_shards / "demo-000000.tar")  # the HEAD passes the front
    with pytest.raises(ObjectStoreTimeout) as caught, shard.open("rb") as f:  # MSC downloads a small shard whole
        f.read()
    error = caught.value  # itself, not MSC's OSError("Failed to download file ...") around it
    assert isinstance(error, ConfigError) and not isinstance(error, OSError)
    assert error.url == f"{stalled_demo}/demo-000000.tar"
    # botocore's 3 tries of 1 s each (and its backoff) take about 3-4 s: a second attempt would not fit the 4 s
    # budget, so none is started (no wall-clock bound is asserted here: the CLI test below runs under a timeout;
    # on a machine so loaded that the third try would start after 4 s, it is not sent: see the next test)
    assert error.attempts == 1 and error.waited >= 1
    assert str(error).startswith(f"wait_budget: {error.url}: not delivered after ")
    assert re.search(r"last error: (ReadTimeoutError|WaitBudgetTimeout)\)\. Fix: ", str(error)), str(error)
    assert one_line(caught.value) == str(error) and exit_status(caught.value) == 2


def test_stalled_object_sends_no_try_after_the_budget(stalled_demo, bounded_short):
    """botocore's second 1 s try ends after the 2 s budget: its third is not sent, so the wait ends near the budget
    (not after botocore's tries x read_timeout)."""
    with pytest.raises(ObjectStoreTimeout) as caught, (epath(stalled_demo) / "demo-000000.tar").open("rb") as f:
        f.read()
    error = caught.value
    assert error.attempts == 1 and 2 <= error.waited < 30 and "last error: WaitBudgetTimeout)" in str(error)


def test_answered_reads_pass_and_missing_stays_missing(stalled_demo, demo_shards, bounded):
    shard = epath(stalled_demo) / "demo-000000.tar"
    local = (demo_shards / "demo-000000.tar").read_bytes()
    assert read_range(str(shard), 512, 4096) == local[512 : 512 + 4096]  # a ranged GET is answered
    with pytest.raises(FileNotFoundError):
        (epath(stalled_demo) / "absent.bin").size()


def test_restored_waits_are_msc_own():
    import multistorageclient.providers.s3 as s3
    from multistorageclient.client.single import SingleStorageClient

    def bounded_read():  # our wrapper, or MSC's own retried read
        return SingleStorageClient.read.__code__.co_filename.endswith("object_waits.py")

    configure_object_waits(connect_timeout=2, read_timeout=3, wait_budget=5)
    assert (s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT) == (2, 3) and bounded_read()
    configure_object_waits(wait_budget=None)
    assert (s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT) == (60, 60) and not bounded_read()


@pytest.mark.parametrize(
    "knobs, named",
    [
        ({"wait_budget": 0}, "wait_budget"),
        ({"read_timeout": -1}, "read_timeout"),
        ({"connect_timeout": True}, "connect_timeout"),
        ({"wait_budget": "60"}, "wait_budget"),
    ],
)
def test_knobs_checked(knobs, named):
    with pytest.raises(ConfigError) as caught:
        configure_object_waits(**knobs)
    assert caught.value.knob == named


def test_bench_on_a_stalled_store_fails_in_one_line(stalled_demo, tmp_path):
    out = tmp_path / "bench_results"
    run = energon_pack(
        "bench",
        *("--data", stalled_demo, "--workers", "2", "--buffers", "4", "--packs", "4", "--modes", "carry"),
        *("--object-timeout", "1", "--object-wait-budget", "5", "--out-dir", str(out), "--no-plots"),
        timeout=240,
    )
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, run.stderr
    prefix = f"energon-pack bench: error: --object-wait-budget: {stalled_demo}/demo-00000"
    assert errors[0].startswith(prefix) and ".tar: not delivered after " in errors[0], errors[0]
    assert not out.exists()  # nothing written before the first result


class _Raises(torch.utils.data.IterableDataset):
    """A dataset whose worker fails the way MSC does: an OSError raised from one of our ConfigErrors."""

    def __iter__(self):
        try:
            raise ObjectStoreTimeout("msc://p/b/k.tar", 31.0, 1, 3, 60.0, TimeoutError("read timed out"))
        except ObjectStoreTimeout as exc:
            raise OSError("Failed to download file /b/k.tar") from exc


def test_worker_error_reported_as_ours_in_one_line():
    loader = torch.utils.data.DataLoader(_Raises(), num_workers=1)
    with pytest.raises(OSError) as caught:
        next(iter(loader))
    assert "DataLoader worker" in str(caught.value)  # torch's multi-line wrapper, our error inside it
    assert one_line(caught.value) == (
        "wait_budget: msc://p/b/k.tar: not delivered after 31 s (attempt 1 of 3, 60 s wait budget; last error: "
        "TimeoutError). Fix: check that the store answers (endpoint, network); a slow store needs a larger "
        "wait_budget (per-request timeouts: configure_object_waits' read_timeout, or connect_timeout / "
        "read_timeout in the MSC profile)"
    )
    assert exit_status(caught.value) == 2


#: README road 1 over a store that drips, configuring nothing: the default waits (from the environment) end it, with
#: 0 and 2 workers; then ``configure_object_waits(wait_budget=None)`` is respected by every later build
_README_ROAD = """
import sys
import multistorageclient.providers.s3 as s3
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from multistorageclient.client.single import SingleStorageClient
from energon_pack import ObjectStoreTimeout, QwenVLPackingTaskEncoder, configure_object_waits
from energon_pack.qwen_vl import get_preset
from energon_pack.storage import epath

def bounded():
    return SingleStorageClient.read.__code__.co_filename.endswith("object_waits.py")

print("before", bounded())
for workers in (0, 2):
    encoder = QwenVLPackingTaskEncoder(
        tokenizer="demo", preset=get_preset("qwen2-vl", max_pixels=160 * 28 * 28), seq_length=2048
    )
    print("timeouts", s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT, bounded())
    dataset = get_train_dataset(
        sys.argv[1], batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, packing_buffer_size=8,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), task_encoder=encoder,
    )
    try:
        next(iter(get_loader(dataset)))
    except ObjectStoreTimeout as exc:
        name, waited = exc.url.rsplit("/", 1)[-1], f"{exc.waited:.0f}"
        print(workers, name, exc.attempts, "\\n" in str(exc), waited, str(exc).split(" (")[0])
configure_object_waits(wait_budget=None)
QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2-vl", seq_length=2048)
epath(sys.argv[1])
print("after None", s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT, bounded())
"""


def test_default_waits_bound_a_loader_built_as_the_readme_shows(dripping):
    """No configure_object_waits call: building the encoder installs the waits ($ENERGON_PACK_OBJECT_TIMEOUT=1,
    $ENERGON_PACK_OBJECT_WAIT_BUDGET=2 for a short test), so a dripping index fails the loader in one error."""
    env = {**os.environ, TIMEOUT_ENV: "1", WAIT_BUDGET_ENV: "2", "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, "-c", _README_ROAD, dripping[0]], env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "before False" and lines[-1] == "after None 60 60 False", run.stdout
    assert lines[1] == lines[3] == "timeouts 1.0 1.0 True", run.stdout
    indexes = {f"demo-00000{i}.tar.idx" for i in (0, 1)}
    for line, workers in zip(lines[2:5:2], (0, 2), strict=True):
        n, name, attempts, multiline, waited, head = line.split(" ", 5)
        assert (n, name in indexes, attempts, multiline) == (str(workers), True, "1", "False"), line
        assert head == f"wait_budget: {dripping[0]}/{name}: not delivered after {waited} s" and 2 <= int(waited) < 30
    assert len(lines) == 6, run.stdout
