"""Shared fixtures: demo WebDataset shards written by the tests themselves (seeded)."""

import atexit
import os
import sys
import tempfile
from pathlib import Path

import pytest

# The stress harness (tests/stress/harness/, never installed) is imported as ``harness``; loader workers
# started by spawn inherit this sys.path, a subprocess needs it on PYTHONPATH.
STRESS_DIR = str(Path(__file__).resolve().parent / "stress")
if STRESS_DIR not in sys.path:
    sys.path.insert(0, STRESS_DIR)


def _session_cache_dir() -> str:
    """Caches (JSONL index and lengths, the built Qwen tokenizer) go to one folder per test session,
    never into the user's cache (subprocess CLI tests inherit it); an already built Qwen tokenizer
    is copied in, so the session does not rebuild it."""
    import shutil

    from energon_pack.env import cache_dir

    folder = tempfile.mkdtemp(prefix="energon_pack_test_cache_")
    for built in cache_dir().glob("qwen-bpe-*.json"):
        shutil.copy2(built, folder)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the session's process removes what it made
    return folder


if "ENERGON_PACK_CACHE_DIR" not in os.environ:
    os.environ["ENERGON_PACK_CACHE_DIR"] = _session_cache_dir()


@pytest.fixture(scope="session")
def demo_shards(tmp_path_factory):
    """600 demo ChatML samples in 6 prepared shards, incl. one broken sample of each kind."""
    from energon_pack.energon.demo_data import make_demo_shards

    return make_demo_shards(tmp_path_factory.mktemp("demo"), samples=600, per_shard=100, seed=1)


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 for the session, with MSC_CONFIG and credentials set (tests/_s3_server.py)."""
    from _s3_server import s3_server

    with s3_server(tmp_path_factory.mktemp("s3")) as store:
        yield store


@pytest.fixture(scope="session")
def remote_demo(s3_store, demo_shards):
    """The ``demo_shards`` dataset uploaded as is, under its own folder name (the name per-source packing stats
    give it): its ``msc://`` path."""
    return s3_store.upload(demo_shards, demo_shards.name)


#: the test files that run longest (tens of seconds to minutes each), started first: with the README's
#: ``-n 2 --dist loadfile`` both processes then finish together instead of one waiting on a late long file
SLOW_FIRST = ("tests/stress/", "tests/project/test_compat_matrix.py", "tests/examples/")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(SLOW_FIRST))  # stable: files keep their order
