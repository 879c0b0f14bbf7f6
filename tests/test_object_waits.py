"""Bounded waits on object storage, against moto's S3 server behind a front that accepts a whole-shard
GET under ``stall/`` and never answers it (tests/_s3_server.py): the read fails within the wait budget
in one error naming the object and the knob; the CLI says it in one line, also from loader workers."""

import os

import pytest
import torch

from _cli_entry import energon_pack
from _s3_server import PROFILE_STALL
from energon_pack.cli.wording import exit_status, one_line
from energon_pack.errors import ConfigError
from energon_pack.object_waits import ObjectStoreTimeout, configure_object_waits
from energon_pack.storage import epath, read_range


@pytest.fixture(scope="module")
def stalled_demo(s3_store, demo_shards):
    """The demo dataset under ``stall/``, read through the stalling front: its ``msc://`` path."""
    s3_store.upload(demo_shards, "stall/demo")
    return s3_store.url("stall/demo", PROFILE_STALL)


@pytest.fixture
def bounded():
    configure_object_waits(connect_timeout=1, read_timeout=1, wait_budget=4)
    yield
    configure_object_waits(wait_budget=None)


def test_stalled_object_fails_within_budget_naming_it(stalled_demo, demo_shards, bounded):
    shard = epath(stalled_demo) / "demo-000000.tar"
    assert shard.size() == os.path.getsize(demo_shards / "demo-000000.tar")  # the HEAD passes the front
    with pytest.raises(ObjectStoreTimeout) as caught, shard.open("rb") as f:  # MSC downloads a small shard whole
        f.read()
    error = caught.value  # itself, not MSC's OSError("Failed to download file ...") around it
    assert isinstance(error, ConfigError) and not isinstance(error, OSError)
    assert error.url == f"{stalled_demo}/demo-000000.tar"
    # botocore's 3 tries of 1 s each (and its backoff) take about 3-4 s: a second attempt would not fit the 4 s
    # budget, so none is started (no wall-clock bound is asserted here: the CLI test below runs under a timeout)
    assert error.attempts == 1 and error.waited >= 1
    assert str(error).startswith(f"wait_budget: {error.url}: not delivered after ")
    assert "ReadTimeoutError" in str(error) and "Fix:" in str(error)
    assert one_line(caught.value) == str(error) and exit_status(caught.value) == 2


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
