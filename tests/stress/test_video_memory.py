"""Memory tier for video files: 10-minute videos (18,000 frames each, ``KEY.0.mp4``) through the real
loader with 2 workers; the peak summed worker RSS must stay inside the documented bound
(:mod:`harness.video_memory`), which does not depend on a video's length."""

import json

import pytest

from harness.video_memory import run_video_memory


@pytest.mark.stress
def test_ten_minute_videos_stay_inside_the_memory_bound(tmp_path):
    report = run_video_memory(tmp_path, n_videos=4, seconds=600, workers=2)
    json.dumps(report)  # plain data for the report command
    adv = report["adversarial"]
    assert report["frames_in_file"] == 18000
    assert adv["samples"] == 8 and adv["skips"] == {} and adv["max_pack_pixel_mb"] > 0  # every video packed
    assert report["peak_worker_rss_mb"] > report["baseline"]["peak_worker_rss_mb"]
    assert report["within_bound"], (report["peak_worker_rss_mb"], report["bound_mb"], report["bound"])
