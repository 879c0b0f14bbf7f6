"""energon-pack convert with videos: LLaVA-Video / ShareGPT ``"video"`` records, OpenAI-style video
parts and Parquet bytes are copied byte for byte as ``KEY.N.mp4`` / ``.mkv`` members after a header
check; bad videos are counted skips with a reason; the loader then packs every written sample with
grids equal to the header plans. ``--layout bridge`` writes the sampled frames as frame lists."""

import io
import json

import pytest
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from test_convert import shard_members

from _video_files import video_bytes
from energon_pack.cli.convert import convert
from energon_pack.errors import ConfigError
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.qwen_vl.video import plan_video
from energon_pack.video import probe_video

PRESET = get_preset("qwen2.5-vl", video_min_pixels=4 * 28 * 28, video_max_pixels=8 * 28 * 28)


def test_llava_video_records_and_openai_parts_copied_byte_for_byte(tmp_path):
    clips = tmp_path / "clips"
    clips.mkdir()
    good = {
        name: video_bytes(n, fps, 64, 48, tmp_path, ext=ext)
        for name, n, fps, ext in [
            ("a.mp4", 30, 30, "mp4"),
            ("b.webm", 21, 12, "webm"),
            ("c.mkv", 50, 25, "mkv"),
            ("d.mov", 9, 4, "mov"),
        ]
    }
    for name, data in good.items():
        (clips / name).write_bytes(data)
    (clips / "garbage.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x01" * 500)  # an mp4 box, no stream
    (clips / "text.mp4").write_bytes(b"hello, not a video" * 10)
    (clips / "one.mp4").write_bytes(video_bytes(1, 10, 32, 32, tmp_path))
    (clips / "cut.mp4").write_bytes(good["a.mp4"][: len(good["a.mp4"]) // 2])
    records = [
        {
            "id": "0",
            "video": "clips/a.mp4",
            "conversations": [{"from": "human", "value": "<video>\nWhat moves?"}, {"from": "gpt", "value": "A bar."}],
        },
        {
            "id": "1",
            "video": "clips/b.webm",
            "conversations": [{"from": "human", "value": "Describe <video>"}, {"from": "gpt", "value": "Stripes."}],
        },
        {
            "id": "2",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "video", "video": "clips/c.mkv"}, {"type": "text", "text": "Count the bars."}],
                },
                {"role": "assistant", "content": "Three."},
            ],
        },
        {
            "id": "3",
            "video": "clips/d.mov",
            "conversations": [{"from": "human", "value": "<video> and?"}, {"from": "gpt", "value": "Ok."}],
        },
        {
            "id": "4",
            "video": "clips/garbage.mp4",
            "conversations": [{"from": "human", "value": "<video>"}, {"from": "gpt", "value": "?"}],
        },
        {
            "id": "5",
            "video": "clips/text.mp4",
            "conversations": [{"from": "human", "value": "<video>"}, {"from": "gpt", "value": "?"}],
        },
        {
            "id": "6",
            "video": "clips/one.mp4",
            "conversations": [{"from": "human", "value": "<video>"}, {"from": "gpt", "value": "?"}],
        },
        {
            "id": "7",
            "video": "clips/missing.mp4",
            "conversations": [{"from": "human", "value": "<video>"}, {"from": "gpt", "value": "?"}],
        },
        {
            "id": "8",
            "video": "clips/cut.mp4",
            "conversations": [{"from": "human", "value": "<video>"}, {"from": "gpt", "value": "?"}],
        },
        {
            "id": "9",
            "video": "clips/a.mp4",
            "conversations": [{"from": "human", "value": "<video> <video>"}, {"from": "gpt", "value": "?"}],
        },
    ]
    source = tmp_path / "llava_video.json"
    source.write_text(json.dumps(records))
    out = tmp_path / "out"
    summary = convert(source, out, progress=False, workers=1)
    assert summary.written == 4 and summary.videos == 4
    assert summary.skipped == {
        "corrupt_video": 2,
        "not_a_video": 1,
        "video_too_few_frames": 1,
        "missing_video": 1,
        "media_count_mismatch": 1,
    }
    members = shard_members(out)
    videos = {name: data for name, data in members.items() if name.endswith((".mp4", ".mkv"))}
    assert sorted(videos) == ["000000000.0.mp4", "000000001.0.mkv", "000000002.0.mkv", "000000003.0.mp4"]
    assert [videos[k] for k in sorted(videos)] == [good["a.mp4"], good["b.webm"], good["c.mkv"], good["d.mov"]]
    assert summary.video_bytes == sum(len(v) for v in good.values())
    doc = json.loads(members["000000002.json"])
    assert doc["messages"][0]["content"][0] == {"type": "video"}  # the source moved into the member
    assert "video" not in json.loads(members["000000000.json"])

    # the loader takes every written sample; grids are the header plans
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=1024)
    ds = get_train_dataset(
        str(out),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=4,
        repeat=False,
    )
    tracker, grids = PackingStatsTracker(), {}
    for b in get_loader(ds):
        tracker.update(b["packing_stats"])
        for key, grid in zip(b["__key__"].split(","), b["video_grid_thw"].tolist()):
            grids[key] = grid
    assert dict(tracker.total.skips) == {}
    want = {name.split(".")[0]: list(plan_video(probe_video(data), PRESET).grid_thw) for name, data in videos.items()}
    assert grids == want


def test_parquet_video_bytes(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    clip = video_bytes(24, 8, 40, 32, tmp_path)
    conv = json.dumps([{"from": "human", "value": "<video>\nWhat?"}, {"from": "gpt", "value": "Bars."}])
    table = pa.table(
        {
            "conversations": [conv, conv],
            "video": [{"bytes": clip, "path": "x.mp4"}, {"bytes": b"junk" * 50, "path": "y.mp4"}],
        }
    )
    pq.write_table(table, tmp_path / "set.parquet")
    summary = convert(tmp_path / "set.parquet", tmp_path / "out", progress=False, workers=1)
    assert (summary.written, summary.videos, summary.skipped) == (1, 1, {"corrupt_video": 1})
    assert shard_members(tmp_path / "out")["000000000.0.mp4"] == clip


@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_bridge_layout_writes_the_sampled_frames(tmp_path, preset):
    """``--layout bridge``: each video becomes the frame list qwen-vl-utils' default sampling takes, each
    frame at the size the preset's frame-list rule trains it at (JPEG, within a few levels of PIL's resize of
    the decoded frame), so the loader packs it with the grid of the full-size frames."""
    import pickle

    import numpy as np
    from PIL import Image

    from energon_pack.qwen_vl.vision import RESAMPLE, video_grid_thw
    from energon_pack.video import decode_frames

    clip = video_bytes(50, 10, 1280, 720, tmp_path)  # 5 s at 10 fps: 10 frames at 2 per second
    (tmp_path / "c.mp4").write_bytes(clip)
    rec = {
        "video": "c.mp4",
        "conversations": [{"from": "human", "value": "<video>\nWhat?"}, {"from": "gpt", "value": "Bars."}],
    }
    (tmp_path / "set.json").write_text(json.dumps([rec]))
    summary = convert(
        tmp_path / "set.json", tmp_path / "bridge", progress=False, workers=1, layout="bridge", preset=preset
    )
    assert (summary.written, summary.videos, summary.skipped) == (1, 1, {})
    members = shard_members(tmp_path / "bridge")
    (frames,) = pickle.loads(members["000000000.videos"])
    vision = get_preset(preset)
    plan = plan_video(probe_video(clip), vision)
    # Qwen2.5-VL: 768 merged patches per frame; Qwen3-VL: 768 for the whole clip (its budget covers all frames)
    size = {"qwen2.5-vl": (1008, 560), "qwen3-vl": (352, 192)}[preset]
    assert len(frames) == plan.num_frames == 10 and pickle.loads(members["000000000.jpgs"]) == []
    for jpeg, image in zip(frames, decode_frames(clip, plan.frame_indices)):
        stored = Image.open(io.BytesIO(jpeg))
        assert stored.size == size  # not the source's 1280x720
        resized = image.resize(size, resample=RESAMPLE[vision.resample])
        diff = np.abs(np.asarray(stored, np.int16) - np.asarray(resized, np.int16))
        assert diff.mean() < 2.0, diff.mean()
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=vision, seq_length=4096)
    ds = get_train_dataset(
        str(tmp_path / "bridge"),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=4,
        repeat=False,
    )
    (batch,) = list(get_loader(ds))
    assert batch["video_grid_thw"].tolist() == [list(video_grid_thw(10, 720, 1280, vision))]  # as full frames


def test_preset_only_with_the_bridge_layout(tmp_path):
    (tmp_path / "set.json").write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "x"}]}]))
    for layout, preset, problem in (("ours", "qwen3-vl", "only --layout bridge"), ("bridge", "qwen9", "unknown")):
        with pytest.raises(ConfigError, match=problem):
            convert(tmp_path / "set.json", tmp_path / "out", progress=False, workers=1, layout=layout, preset=preset)
    assert not (tmp_path / "out").exists()
