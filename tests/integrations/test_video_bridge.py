"""Megatron-Bridge's own M-RoPE code on packs built from video file members (the Bridge encoder, our
``KEY.0.mp4`` layout, file sampling at 0.8 fps): Bridge's Qwen25VLModel recomputation and Qwen3-VL
get_rope_index give our positions on every real token (tests/integrations/test_integration_bridge.py's checks)."""

import json

import pytest
import webdataset as wds
from test_integration_bridge import (
    jpeg,
    load_bridge,
    needs_bridge,
    qwen3_positions_equal_bridge,
    qwen25_positions_equal_bridge,
    stream,
)

from _video_files import video_bytes
from energon_pack.energon import prepare_webdataset
from energon_pack.integrations import bridge as B
from energon_pack.video import FrameSampling


@pytest.fixture(scope="module")
def video_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("bridge_video_ds")
    scratch = tmp_path_factory.mktemp("bridge_video_src")
    with wds.ShardWriter(str(root / "v-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(5):
            conv = [
                {"role": "user", "content": "<image>\n<video>\nWhat happens?"},
                {"role": "assistant", "content": f"clip {i} " * (1 + i)},
            ]
            ext = ("mp4", "webm", "mkv")[i % 3]
            sink.write(
                {
                    "__key__": f"v{i}",
                    "json": json.dumps(conv).encode(),
                    "0.jpg": jpeg(40 + 8 * i, 40, i),
                    f"0.{ext}": video_bytes(25 + 9 * i, (12, 25, 30)[i % 3], 64, 48, scratch, ext=ext),
                }
            )
        sink.write(
            {
                "__key__": "t0",
                "json": json.dumps(
                    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]
                ).encode(),
            }
        )
    prepare_webdataset(root)
    return root


@needs_bridge
@pytest.mark.parametrize("preset", ["qwen2.5-vl", "qwen3-vl"])
def test_bridge_positions_on_video_file_packs(video_dataset, preset):
    load_bridge()  # visual_inputs is Bridge's own GenericVisualInputs
    te = B.BridgeQwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset=preset,
        seq_length=2048,
        cp=2,
        tp=2,
        sp=True,
        pad_to_max_length=True,
        bridge_position_ids="mrope",
        video_sampling=FrameSampling(fps=0.8),
    )
    batches = stream(video_dataset, te)
    assert sorted(k for b in batches for k in b["__keys__"]) == ["t0", "v0", "v1", "v2", "v3", "v4"]
    videos = [v for b in batches if (v := b["visual_inputs"]).video_grid_thw is not None]
    assert sum(int(v.video_grid_thw.shape[0]) for v in videos) == 5
    if preset == "qwen2.5-vl":
        assert qwen25_positions_equal_bridge(te, batches) >= 1
    else:
        qwen3_positions_equal_bridge(te, batches)
