"""Fuzz tier: broken samples of every kind mixed with good ones through the real loader
(carry mode, 2 workers; WebDataset shards and a JSONL file). Bounded by default (600 broken
samples, a few seconds); ``ENERGON_PACK_STRESS=full`` runs the full 10,000."""

import json
import os

import pytest

from harness.fuzz import JSONL_CASES, WDS_CASES, run_fuzz

FULL = os.environ.get("ENERGON_PACK_STRESS") == "full"
N = 10_000 if FULL else 600


@pytest.mark.stress
def test_fuzz_every_broken_sample_counted_every_good_sample_intact(tmp_path):
    report = run_fuzz(tmp_path, n_samples=N, seed=0, workers=2)
    json.dumps(report)  # plain data for the report command
    assert report["crashes"] == 0, (report["webdataset"]["crash"], report["jsonl"]["crash"])
    # exact: every broken sample is counted under the reason it was built for, none slips through
    assert report["bad_counted_by_reason"] == report["bad_expected_by_reason"]
    assert report["bad_uncounted"] == report["bad_overcounted"] == report["bad_emitted"] == 0
    assert report["bad_counted"] == report["bad_samples"] == sum(report["bad_expected_by_reason"].values())
    # every kept sample appears exactly once, token for token (and pixel for pixel) as encoded alone
    assert report["good_intact"] == report["good_samples"] > 0
    assert report["good_missing"] == report["good_mismatched"] == report["duplicates"] == 0
    # every kind was exercised, and the sizes add up to what was asked
    expected = report["bad_expected_by_reason"]
    assert set(expected) >= {want for _, want, _ in WDS_CASES + JSONL_CASES if want != "kept"}
    n_jsonl_bad = round(N * 0.2)
    kept_hostile = sum(WDS_CASES[i % len(WDS_CASES)][1] == "kept" for i in range(N - n_jsonl_bad)) + sum(
        JSONL_CASES[i % len(JSONL_CASES)][1] == "kept" for i in range(n_jsonl_bad)
    )
    assert kept_hostile > 0 and report["bad_samples"] == N - kept_hostile
    assert report["good_samples"] == N // 2 + kept_hostile
    assert report["webdataset"]["samples"] + report["jsonl"]["samples"] == N + N // 2
