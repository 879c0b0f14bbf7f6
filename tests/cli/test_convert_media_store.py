"""``convert --media-store dedup`` (the default): each distinct image / video stored once, by the SHA-256 of its
bytes (two paths to one file, one file under two names), later records referencing it; the real Energon loader
(2 workers) reads the references back through its primary FileStore, giving the packs of ``--media-store inline``
bit for bit, and a restored loader the same next packs."""

import json
import shutil

import pytest
import torch
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from test_convert import assert_streams_exactly_once, image, shard_members

from _video_files import video_bytes
from energon_pack.cli.convert import convert, main
from energon_pack.energon.media_store import resolve_media_refs, sha256_hex
from energon_pack.energon.prepare import DATASET_YAML
from energon_pack.errors import ConfigError
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

IMAGES = ["imgs/a.jpg", "imgs/./a.jpg", "imgs/a_copy.jpg", "imgs/b.png"]  # 2 distinct files under 3 names


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """14 LLaVA records: 10 with one or two images (4 names, 2 distinct files), 2 with one reused clip, 2 text."""
    root = tmp_path_factory.mktemp("dedup")
    (root / "imgs").mkdir()
    (root / "clips").mkdir()
    a = image("JPEG", 40, 28, 1)
    (root / "imgs/a.jpg").write_bytes(a)
    (root / "imgs/a_copy.jpg").write_bytes(a)
    (root / "imgs/b.png").write_bytes(image("PNG", 36, 30, 2))
    (root / "clips/v.mp4").write_bytes(video_bytes(8, 4, 32, 32, root))
    records = []
    for i in range(14):
        rec = {"id": f"r{i}"}
        if i < 10:
            rec["images"] = [IMAGES[i % 4]] + ([IMAGES[(i + 1) % 4]] if i % 3 == 0 else [])
            q = "<image>\n" * len(rec["images"]) + f"Q{i}?"
        elif i < 12:
            rec["video"], q = "clips/v.mp4", f"<video>\nQ{i}?"
        else:
            q = f"Q{i}?"
        rec["conversations"] = [{"from": "human", "value": q}, {"from": "gpt", "value": f"Answer {i}."}]
        records.append(rec)
    (root / "data.json").write_text(json.dumps(records))
    return root / "data.json"


@pytest.fixture(scope="module")
def outputs(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("outs")
    kw = dict(workers=2, samples_per_shard=4, progress=False)
    return (
        convert(source, out / "dedup", **kw),
        convert(source, out / "inline", media_store="inline", **kw),
        out,
    )


def test_each_distinct_file_stored_once(outputs, source):
    dedup, inline, out = outputs
    assert (dedup.media_store, inline.media_store) == ("dedup", "inline")
    assert (dedup.images, dedup.videos, dedup.written) == (inline.images, inline.videos, inline.written) == (14, 2, 14)
    members = shard_members(out / "dedup", resolve=False)
    media = sorted(n for n in members if not n.endswith(".json"))
    assert media == ["000000000.0.jpg", "000000003.0.png", "000000010.0.mp4"]
    # record 0 uses a.jpg under two paths: its second image is a reference to its first; the clip's second record too
    a, b, clip = (members[n] for n in media)
    assert json.loads(members["000000000.media_refs.json"]) == {
        "1.jpg": {"member": "000000000.0.jpg", "sha256": sha256_hex(a)}
    }
    assert json.loads(members["000000011.media_refs.json"]) == {
        "0.mp4": {"member": "000000010.0.mp4", "sha256": sha256_hex(clip)}
    }
    assert json.loads(members["000000003.media_refs.json"]) == {
        "1.jpg": {"member": "000000000.0.jpg", "sha256": sha256_hex(a)}
    }
    assert json.loads(members["000000007.media_refs.json"]) == {
        "0.png": {"member": "000000003.0.png", "sha256": sha256_hex(b)}
    }
    referencing = sorted(n.split(".")[0] for n in members if n.endswith(".media_refs.json"))
    assert referencing == [f"{i:09d}" for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11)]
    assert (dedup.media_stored, dedup.media_stored_bytes) == (3, len(a) + len(b) + len(clip))
    assert dedup.image_bytes + dedup.video_bytes == inline.image_bytes + inline.video_bytes
    assert shard_members(out / "dedup") == shard_members(out / "inline")  # references resolved: the inline records
    assert "stored_once" in (out / "dedup" / ".nv-meta" / "dataset.yaml").read_text()
    assert (out / "inline" / ".nv-meta" / "dataset.yaml").read_text() == DATASET_YAML


def loader(path, workers=2):
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=512)
    ds = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=4,
        repeat=False,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def signature(batch):
    """A pack as comparable values: its keys, its tensors' dtypes, shapes and bytes, its skips."""
    tensors = {k: (v.dtype, tuple(v.shape), v.numpy().tobytes()) for k, v in batch.items() if torch.is_tensor(v)}
    return list(batch["__keys__"]), tensors, dict(batch["packing_stats"].get("skips", {}))


def test_same_packs_as_inline_and_exact_resume(outputs):
    _, _, out = outputs
    inline = [signature(b) for b in loader(out / "inline")]
    first = loader(out / "dedup")
    it = iter(first)
    head = [signature(next(it)) for _ in range(2)]
    state = first.save_state_rank()
    tail = [signature(b) for b in it]
    assert head + tail == inline  # same keys, token ids, grids and pixel values, pack for pack
    assert sorted(k for keys, _, _ in inline for k in keys) == [f"{i:09d}" for i in range(14)]
    assert any("pixel_values_videos" in t for _, t, _ in inline) and any("pixel_values" in t for _, t, _ in inline)
    restored = loader(out / "dedup")
    restored.restore_state_rank(state)
    assert [signature(b) for b in restored] == tail


def test_read_without_the_subflavor_through_the_samples_own_dataset(outputs, tmp_path):
    """``energon prepare`` rewrites dataset.yaml without the subflavor (and Megatron-Bridge's encoder cooks our layout
    with a cooker Energon gives no primary store): the plain cooker reads the shared media through the store of the
    sample's own dataset, the same packs as inline."""
    _, _, out = outputs
    shutil.copytree(out / "dedup", tmp_path / "plain")
    (tmp_path / "plain" / ".nv-meta" / "dataset.yaml").write_text(DATASET_YAML)
    plain = [signature(b) for b in loader(tmp_path / "plain", workers=0)]
    assert plain == [signature(b) for b in loader(out / "inline", workers=0)]
    assert sorted(k for keys, _, _ in plain for k in keys) == [f"{i:09d}" for i in range(14)]


def test_bridge_encoder_reads_the_shared_media(outputs):
    """Megatron-Bridge's encoder cooks our layout with its own cooker (no primary store): every record once, every
    image in a pack, no skip."""
    from energon_pack.integrations.bridge import BridgeQwenVLPackingTaskEncoder

    dedup, _, out = outputs
    te = BridgeQwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=2048)
    assert_streams_exactly_once(out / "dedup", dedup, te)


def test_a_broken_reference_is_named():
    member, data = "000000001.0.jpg", b"\xff\xd8 bytes"
    ref = json.dumps({"0.jpg": {"member": member, "sha256": sha256_hex(data)}}).encode()
    fields = {"json": b"{}", "media_refs.json": ref}
    assert resolve_media_refs(fields, {member: (data, None)}) == {"json": b"{}", "0.jpg": data}
    bad = resolve_media_refs(fields, {member: (b"other bytes", None)})
    assert bad["__media_refs_error__"] == (
        f"media_refs.json: ValueError: 0.jpg: {member} does not hold the bytes of SHA-256 {sha256_hex(data)[:12]}..."
    )
    assert resolve_media_refs(fields, {})["__media_refs_error__"] == f"media_refs.json: KeyError: '{member}'"
    assert resolve_media_refs(fields, None)["__media_refs_error__"].endswith(
        "no readable index to read them from: prepare it (energon-pack prepare DIR) or convert again with "
        "--media-store inline"
    )


def test_cli_summary_line_and_bridge_stays_inline(source, tmp_path, capsys):
    assert main([str(source), str(tmp_path / "o"), "--workers", "0", "--no-progress"]) == 0
    s = json.loads((tmp_path / "o" / "convert_summary.json").read_text())
    stored, inline = s["media_stored_bytes"] / 1e3, (s["image_bytes"] + s["video_bytes"]) / 1e3
    assert (
        f"  dedup    3 media file(s) stored once for 16 reference(s) ({stored:.1f} kB instead of {inline:.1f} kB)"
        in capsys.readouterr().out.splitlines()
    )
    bridge = convert(source, tmp_path / "b", layout="bridge", workers=0, progress=False)
    assert bridge.media_store == "inline" and bridge.media_stored == 0
    with pytest.raises(ConfigError) as err:
        convert(source, tmp_path / "c", layout="bridge", media_store="dedup", workers=0, progress=False)
    assert err.value.knob == "media_store" and "--media-store inline" in err.value.fix
    with pytest.raises(ConfigError, match="unknown media store 'hardlink'"):
        convert(source, tmp_path / "d", media_store="hardlink", workers=0, progress=False)


def test_object_storage_output_reads_its_shared_media(source, outputs, s3_store):
    """Converted into ``msc://`` and loaded from there: the references resolve through S3, the packs of inline."""
    _, _, out = outputs
    url = s3_store.url("dedup")
    summary = convert(source, url, workers=0, samples_per_shard=4, progress=False)
    assert (summary.out_dir, summary.media_stored, summary.images + summary.videos) == (url, 3, 16)
    remote = [signature(b) for b in loader(url, workers=0)]
    assert remote == [signature(b) for b in loader(out / "inline", workers=0)]
