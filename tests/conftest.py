"""Shared fixtures: demo WebDataset shards written by the tests themselves (seeded)."""

import os
import tempfile

import pytest


def _session_cache_dir() -> str:
    """Caches (JSONL index and lengths, the built Qwen tokenizer) go to one folder per test session,
    never into the user's cache (subprocess CLI tests inherit it); an already built Qwen tokenizer
    is copied in, so the session does not rebuild it."""
    import shutil

    from energon_pack.env import cache_dir

    folder = tempfile.mkdtemp(prefix="energon_pack_test_cache_")
    for built in cache_dir().glob("qwen-bpe-*.json"):
        shutil.copy2(built, folder)
    return folder


if "ENERGON_PACK_CACHE_DIR" not in os.environ:
    os.environ["ENERGON_PACK_CACHE_DIR"] = _session_cache_dir()


@pytest.fixture(scope="session")
def demo_shards(tmp_path_factory):
    """600 demo ChatML samples in 6 prepared shards, incl. one broken sample of each kind."""
    from energon_pack.energon.demo_data import make_demo_shards

    return make_demo_shards(tmp_path_factory.mktemp("demo"), samples=600, per_shard=100, seed=1)
