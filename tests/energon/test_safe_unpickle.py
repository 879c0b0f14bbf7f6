"""Pickled media members (Bridge's ``jpgs`` / ``imgs`` / ``images`` / ``videos``) are loaded without
running code: a ``__reduce__`` payload never executes and becomes the counted skip ``unsafe_pickle``."""

import builtins
import json
import os
import pickle
import subprocess
import types

import pytest
import webdataset as wds
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from test_energon_bridge_layout import jpeg

from energon_pack.energon import prepare_webdataset
from energon_pack.energon.chatml import ALLOW_UNSAFE_PICKLE_ENV, parse_chatml, unpickle_media
from energon_pack.errors import SampleSkipped
from energon_pack.integrations.bridge import bridge_chatml_to_sample
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder


class Payload:
    """Pickles as a call of ``func(*args)``: what a hostile dataset would ship."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def payloads(marker):
    touch = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": pickle.dumps([Payload(os.system, touch)]),
        "subprocess": pickle.dumps([b"\xff\xd8", Payload(subprocess.call, ["touch", str(marker)])]),
        "eval": pickle.dumps([Payload(builtins.eval, code)]),
        "exec": pickle.dumps(Payload(builtins.exec, code), protocol=2),
        # hand-written protocol-0 opcodes: GLOBAL 'os system', then REDUCE
        "opcodes": b"cos\nsystem\n(V" + touch.encode() + b"\ntR.",
        "frames": pickle.dumps([[b"frame", Payload(os.system, touch)]]),
    }


@pytest.mark.parametrize("kind", ["os.system", "subprocess", "eval", "exec", "opcodes", "frames"])
@pytest.mark.parametrize("field", ["jpgs", "imgs", "images", "videos"])
def test_reduce_payloads_never_run(tmp_path, kind, field):
    marker = tmp_path / "pwned"
    raw = payloads(marker)[kind]
    with pytest.raises(SampleSkipped) as err:
        parse_chatml(types.SimpleNamespace(fields={"json": b'[{"role": "user", "content": "hi"}]', field: raw}))
    assert err.value.reason == "unsafe_pickle" and ALLOW_UNSAFE_PICKLE_ENV in err.value.detail
    assert not marker.exists()
    if field == "videos" or raw[:1] == b"\x80":  # Bridge's typed samples with raw members (a protocol-0
        with pytest.raises(SampleSkipped, match="unsafe_pickle"):  # ``imgs`` is one image there, never unpickled)
            bridge_chatml_to_sample(
                types.SimpleNamespace(
                    conversation="[]",
                    imgs=raw if field != "videos" else None,
                    videos=raw if field == "videos" else None,
                )
            )
    assert not marker.exists()


def test_real_bridge_media_load_exactly():
    images = [b"\xff\xd8jpeg-1", b"\x89PNG-2"]
    videos = [[b"f0", b"f1", b"f2"], (b"g0",)]
    conv, imgs, vids = parse_chatml(
        types.SimpleNamespace(
            fields={
                "json": b'[{"role": "user", "content": "hi"}]',
                "jpgs": pickle.dumps(images, protocol=4),
                "imgs": pickle.dumps(tuple(images), protocol=2),
                "videos": pickle.dumps(videos, protocol=5),
            }
        )
    )
    assert conv == [{"role": "user", "content": "hi"}]
    assert imgs == [b"\xff\xd8jpeg-1", b"\x89PNG-2"] * 2 and vids == [[b"f0", b"f1", b"f2"], [b"g0"]]
    assert unpickle_media(pickle.dumps([]), "videos", frames=True) == []
    for protocol in range(6):  # protocols 0-2 spell bytes as _codecs.encode / bytes(): loaded, safely
        assert unpickle_media(pickle.dumps([b"\xff\x00a", b""], protocol=protocol), "jpgs") == [b"\xff\x00a", b""]
    with pytest.raises(SampleSkipped, match=r"unsafe_pickle: field 'jpgs' names _codecs.encode\(str, 'rot13'\)"):
        unpickle_media(b"\x80\x02]c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00rot13\x86Ra.", "jpgs")


@pytest.mark.parametrize(
    "value, detail",
    [
        ({"a": b"x"}, "holds dict, expected a list"),
        ([b"ok", "a string"], "jpgs 1 holds str, expected encoded image bytes"),
        ([b"ok", 7], "jpgs 1 holds int, expected encoded image bytes"),
    ],
)
def test_other_shapes_are_bad_media(value, detail):
    with pytest.raises(SampleSkipped) as err:
        unpickle_media(pickle.dumps(value), "jpgs")
    assert err.value.reason == "bad_media" and detail in err.value.detail
    with pytest.raises(SampleSkipped, match="videos 0 is bytes, expected a list of frames"):
        unpickle_media(pickle.dumps([b"x"]), "videos", frames=True)
    with pytest.raises(SampleSkipped, match="bad_media: field 'jpgs' is not a pickled list"):
        unpickle_media(b"\x80\x04garbage", "jpgs")


def test_opt_in_loads_exotic_pickles(monkeypatch):
    raw = pickle.dumps([bytearray(b"img")], protocol=4)  # names builtins.bytearray
    with pytest.raises(SampleSkipped, match="unsafe_pickle: field 'jpgs' names builtins.bytearray"):
        unpickle_media(raw, "jpgs")
    assert unpickle_media(raw, "jpgs", allow_unsafe=True) == [bytearray(b"img")]
    monkeypatch.setenv(ALLOW_UNSAFE_PICKLE_ENV, "1")
    assert unpickle_media(raw, "jpgs") == [bytearray(b"img")]


def test_hostile_shard_is_a_counted_skip_through_the_loader(tmp_path):
    marker = tmp_path / "pwned"
    conv = json.dumps([{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A cat."}]).encode()
    (tmp_path / "ds").mkdir()
    with wds.ShardWriter(str(tmp_path / "ds" / "bridge-%06d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(3):
            sink.write({"__key__": f"good{i}", "json": conv, "jpgs": pickle.dumps([jpeg(48, 40, i)])})
        sink.write({"__key__": "evil", "json": conv, "jpgs": payloads(marker)["os.system"]})
    prepare_webdataset(tmp_path / "ds")
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=2048)
    ds = get_train_dataset(
        str(tmp_path / "ds"),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    tracker, keys = PackingStatsTracker(), []
    for b in get_loader(ds):
        keys.extend(b["__keys__"])
        tracker.update(b["packing_stats"])
    assert sorted(keys) == ["good0", "good1", "good2"]
    assert dict(tracker.total.skips) == {"unsafe_pickle": 1}
    assert not marker.exists()
