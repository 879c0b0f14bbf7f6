"""Megatron-Bridge's ChatML shard layout (pickled ``jpgs`` and ``videos``) through the packing loader."""

import io
import json
import pickle

import numpy as np
import torch
import webdataset as wds
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from PIL import Image

from energon_pack.energon import prepare_webdataset
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder


def jpeg(w, h, seed):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def test_bridge_layout_with_images_and_videos(tmp_path):
    with wds.ShardWriter(str(tmp_path / "bridge-%06d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(6):
            conv = [
                {"from": "human", "value": "<image>\n<video>\nWhat happens?"},
                {"from": "gpt", "value": f"clip {i}"},
            ]
            frames = [jpeg(64, 48, 100 * i + f) for f in range(3)]
            sink.write(
                {
                    "__key__": f"b{i}",
                    "conversation.json": json.dumps(conv).encode(),
                    "jpgs": pickle.dumps([jpeg(56 + 8 * i, 40, i)]),
                    "videos": pickle.dumps([frames]),
                }
            )
    prepare_webdataset(tmp_path)
    preset = get_preset("qwen2.5-vl")
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=2048)
    ds = get_train_dataset(
        str(tmp_path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    batches = list(get_loader(ds))
    assert sorted(k for b in batches for k in b["__keys__"]) == [f"b{i}" for i in range(6)]
    for b in batches:
        n = b["num_segments"]
        assert b["image_grid_thw"].shape == (n, 3) and b["video_grid_thw"].shape == (n, 3)
        # 3 frames -> padded to 4 -> grid_t 2; the patch rows match the grids exactly
        assert torch.all(b["video_grid_thw"][:, 0] == 2)
        assert b["pixel_values_videos"].shape == (int(b["video_grid_thw"].prod(1).sum()), 3 * 2 * 14 * 14)
        assert b["pixel_values"].shape[0] == int(b["image_grid_thw"].prod(1).sum())
        assert b["second_per_grid_ts"].tolist() == [1.0] * n  # temporal_patch_size / fps = 2 / 2
        ids = b["input_ids"][0]
        video_pad = te.tokenizer.special.video_pad
        assert int((ids == video_pad).sum()) == int(b["video_grid_thw"].prod(1).sum()) // 4
        assert b["mrope_position_ids"].shape == (3, 1, ids.numel())
