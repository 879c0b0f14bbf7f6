"""Memory tier: 8000x8000 JPEGs and long videos (Bridge's pickled layout) through the real loader
with 2 workers; the peak summed worker RSS must stay inside the documented bound
(:mod:`harness.memory`). Bounded by default (4 images, 2 videos of 240 frames);
``ENERGON_PACK_STRESS=full`` streams 40 images and 20 videos of 600 frames."""

import json
import os

import pytest

from harness.memory import run_memory

FULL = os.environ.get("ENERGON_PACK_STRESS") == "full"
SIZE = dict(n_images=40, n_videos=20, frames=600) if FULL else dict(n_images=4, n_videos=2, frames=240)


@pytest.mark.stress
def test_huge_images_and_long_videos_stay_inside_the_memory_bound(tmp_path):
    report = run_memory(tmp_path, side=8000, workers=2, **SIZE)
    json.dumps(report)  # plain data for the report command
    adv = report["adversarial"]
    # every sample (huge image, long video, text) is packed once; nothing skipped or lost
    assert adv["samples"] == 2 * (SIZE["n_images"] + SIZE["n_videos"]) and adv["skips"] == {}
    assert report["baseline"]["samples"] == adv["samples"] and report["baseline"]["skips"] == {}
    assert adv["max_pack_pixel_mb"] > 0 and report["peak_worker_rss_mb"] > report["baseline"]["peak_worker_rss_mb"]
    assert report["within_bound"], (report["peak_worker_rss_mb"], report["bound_mb"], report["bound"])
