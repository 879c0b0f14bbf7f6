"""Training truth on video files: packs the Energon loader builds from ``KEY.0.mp4`` members (frames
decoded after selection, Qwen's file sampling) give, through tiny HF Qwen2-VL / Qwen2.5-VL / Qwen3-VL
models, the logits, loss and gradients of each sample run alone through HF's own path (HF computes
M-RoPE itself from ``video_grid_thw`` and ``second_per_grid_ts``). The comparison is
tests/integrations/test_integration_hf.py's, on these packs."""

import copy
import json

import pytest
import webdataset as wds
from test_integration_hf import test_packed_logits_loss_and_grads_equal_each_sample_alone as packed_equals_alone

from _hf_helpers import NO_IMPLICIT_PREPARE, PRESETS, small_preset, tiny_model
from _video_files import video_bytes
from energon_pack.energon import prepare_webdataset
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.video import FrameSampling

pytest.importorskip("transformers")
pytestmark = NO_IMPLICIT_PREPARE

#: 0.8 frames per second: 4 frames of a 30-frame 12 fps clip, 1.25 s per temporal step (a non-integer
#: Qwen2.5-VL time scale)
SAMPLING = FrameSampling(fps=0.8)


@pytest.fixture(scope="module")
def video_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_video_shards")
    scratch = tmp_path_factory.mktemp("hf_video_src")
    samples = [
        ("v0", "<video>\nwhat moves?", "a bar.", video_bytes(30, 12, 64, 48, scratch)),
        ("t1", "what is a pack?", "many samples in one row.", None),
        ("v2", "describe <video> please.", "stripes drift right.", video_bytes(45, 25, 40, 56, scratch, ext="webm")),
        ("v3", "<video>\nhow long?", "three seconds.", video_bytes(20, 5, 56, 40, scratch, ext="mkv")),
    ]
    with wds.ShardWriter(str(root / "hfv-%06d.tar"), maxcount=100, verbose=0) as sink:
        for key, question, answer, video in samples:
            fields = {
                "__key__": key,
                "json": json.dumps(
                    [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
                ).encode(),
            }
            if video is not None:
                fields["0." + ("webm" if key == "v2" else "mkv" if key == "v3" else "mp4")] = video
            sink.write(fields)
    prepare_webdataset(root)
    return root


@pytest.mark.parametrize("name", list(PRESETS))
def test_video_file_packs_equal_each_sample_alone_through_hf(video_shards, name):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    tok = load_demo_tokenizer()
    te = QwenVLPackingTaskEncoder(
        tokenizer="demo",
        preset=small_preset(name),
        seq_length=256,
        cp=2,
        pad_to_max_length=True,
        video_sampling=SAMPLING,
    )
    ds = get_train_dataset(
        str(video_shards),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    packs = list(get_loader(ds))
    assert sorted(k for b in packs for k in b["__keys__"]) == ["t1", "v0", "v2", "v3"]
    assert sum(int(b["video_grid_thw"].shape[0]) for b in packs if b.get("video_grid_thw") is not None) == 3
    assert max(b["num_segments"] for b in packs) >= 2  # videos share a pack
    ref = tiny_model(name, tok)
    packed = copy.deepcopy(ref)
    assert H.prepare_model(packed).config._attn_implementation == H.VARLEN_ATTENTION
    packed_equals_alone((name, tok, packs, te, ref, packed))
