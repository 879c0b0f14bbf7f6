"""Shared fixtures: demo WebDataset shards written by the tests themselves (seeded)."""

import pytest


@pytest.fixture(scope="session")
def demo_shards(tmp_path_factory):
    """600 demo ChatML samples in 6 prepared shards, incl. one broken sample of each kind."""
    from energon_pack.energon.demo_data import make_demo_shards

    return make_demo_shards(tmp_path_factory.mktemp("demo"), samples=600, per_shard=100, seed=1)
