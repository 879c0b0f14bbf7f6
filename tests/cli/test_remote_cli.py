"""Every CLI command on ``msc://`` paths served by moto's S3 server: it works on object storage, or it
refuses in one line (exit 2) before anything is written, locally (no ``./msc:/...`` folder) or remotely.

Commands run in this process (``main``) from an empty working folder, which must stay empty.
"""

import io
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from _cli_entry import one_error_line
from energon_pack.cli import main
from energon_pack.storage import list_names


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty working folder: what a command leaves in it is what it wrote locally."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture(scope="module")
def raw_shards(s3_store, demo_shards):
    """The demo shards without their Energon index, uploaded: what `prepare` is given."""
    names = sorted(n for n in os.listdir(demo_shards) if n.endswith(".tar"))
    for name in names:
        s3_store.client.upload_file(str(demo_shards / name), "energon-pack-test", f"raw/{name}")
    return s3_store.url("raw"), names


@pytest.fixture(scope="module")
def llava_json(tmp_path_factory):
    """A LLaVA JSON of 5 records (4 with one image each, 1 text-only) with its image files."""
    root = tmp_path_factory.mktemp("llava")
    records = []
    for i in range(5):
        turns = [
            {"from": "human", "value": ("<image>\n" if i < 4 else "") + f"What is {i}?"},
            {"from": "gpt", "value": f"Thing {i}."},
        ]
        record = {"id": f"r{i}", "conversations": turns}
        if i < 4:
            buf = io.BytesIO()
            Image.fromarray(np.random.default_rng(i).integers(0, 255, (28, 36 + 4 * i, 3), dtype=np.uint8)).save(
                buf, format="JPEG"
            )
            (root / f"{i}.jpg").write_bytes(buf.getvalue())
            record["image"] = f"{i}.jpg"
        records.append(record)
    (root / "llava.json").write_text(json.dumps(records))
    return root / "llava.json"


REFUSALS = {
    # command line (REMOTE = the s3 bucket's msc:// root, DEMO = the uploaded demo dataset) -> words of the message
    "make-demo": (["make-demo", "REMOTE/new"], "demo data is written to local disk only"),
    "demo-missing": (["demo", "--data", "REMOTE/new", "--workers", "0"], "holds no object"),
    "demo-out": (["demo", "--data", "DEMO", "--out", "REMOTE/demo.json"], "--out is written to local disk only"),
    "bench-unprepared": (["bench", "--data", "REMOTE/raw"], "energon-pack prepare REMOTE/raw"),
    "bench-out-dir": (["bench", "--data", "DEMO", "--out-dir", "REMOTE/res"], "--out-dir is written to local disk"),
    "bench-profile": (["bench", "--data", "msc://no-such-profile/b/x"], 'Profile "no-such-profile" not found'),
    "bench-unreachable": (
        ["bench", "--data", "msc://energon-s3-down/energon-pack-test/demo"],
        "Fix: check the MSC profile's endpoint, bucket and credentials",
    ),
    "inspect": (["inspect", "REMOTE/chat.jsonl"], "JSONL files are read from local disk only"),
    "prepare-jsonl": (["prepare", "REMOTE/chat.jsonl"], "JSONL files are indexed on local disk only"),
    "prepare-nothing": (["prepare", "REMOTE/nothing"], "holds no object: pass the prefix of your *.tar shards"),
    "convert-source": (["convert", "REMOTE/llava.json", "out"], "convert reads its source and the images"),
    "convert-taken": (["convert", "LLAVA", "DEMO"], "already holds 17 object(s)"),
    "pack-offline": (["pack-offline", "REMOTE/chat.jsonl", "out"], "JSONL files are read from local disk only"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_in_one_line_writing_nothing(case, s3_store, remote_demo, raw_shards, llava_json, cwd, capsys):
    argv, words = REFUSALS[case]
    fill = {"REMOTE": s3_store.url(), "DEMO": remote_demo, "LLAVA": str(llava_json)}
    for key, value in fill.items():
        argv = [a.replace(key, value) for a in argv]
        words = words.replace(key, value)
    before = list_names(s3_store.url())
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err, argv[0])
    assert words in line
    assert os.listdir(cwd) == []  # no ./msc:/ folder, no report
    assert list_names(s3_store.url()) == before


def test_bench_on_object_storage_equals_local(demo_shards, remote_demo, cwd, capsys):
    """The same cells (packs, samples, real and pad tokens, skips) from the remote copy as from the local one."""
    cells = {}
    for name, data in (("local", str(demo_shards)), ("remote", remote_demo)):
        argv = [
            "bench",
            "--data",
            data,
            "--tokenizer",
            "demo",
            "--buffers",
            "8",
            "--packs",
            "3",
            "--workers",
            "0",
            "--modes",
            "carry,rounds",
            "--no-plots",
            "--out-dir",
            name,
        ]
        assert main(argv) == 0
        report = json.loads((cwd / name / "buffer_sizes.json").read_text())
        assert report["dataset"] == data
        cells[name] = [
            {k: c[k] for k in ("mode", "buffer", "packs", "samples", "real_tokens", "slots", "skips")}
            for c in report["cells"]
        ]
    assert [c["packs"] for c in cells["remote"]] == [3, 3]
    assert cells["remote"] == cells["local"]
    assert sorted(os.listdir(cwd)) == ["local", "remote"]


def test_bench_read_ahead_flags_same_cells_fewer_requests(demo_shards, remote_demo, cwd, capsys, monkeypatch):
    """--whole-object-limit 0 --read-ahead 1 MiB: range reads through the read-ahead (no whole-shard GET),
    the same cells as the local copy, and MSC's own reads again after the command."""
    import botocore.endpoint
    from multistorageclient.file import ObjectFile

    ranged, original = [], botocore.endpoint.Endpoint.make_request

    def make_request(self, operation_model, request_dict):
        if operation_model.name == "GetObject" and request_dict.get("url_path", "").endswith(".tar"):
            ranged.append("Range" in request_dict.get("headers", {}))
        return original(self, operation_model, request_dict)

    monkeypatch.setattr(botocore.endpoint.Endpoint, "make_request", make_request)
    before = ObjectFile.__init__, ObjectFile._open_large_file
    cells = {}
    for name, data, flags in (
        ("local", str(demo_shards), []),
        ("remote", remote_demo, ["--whole-object-limit", "0", "--read-ahead", "1048576"]),
    ):
        assert (
            main(
                [
                    "bench",
                    "--data",
                    data,
                    "--tokenizer",
                    "demo",
                    "--buffers",
                    "8",
                    "--packs",
                    "3",
                    "--workers",
                    "0",
                    "--modes",
                    "carry",
                    "--no-plots",
                    "--out-dir",
                    name,
                    *flags,
                ]
            )
            == 0
        )
        cells[name] = [
            {k: c[k] for k in ("packs", "samples", "real_tokens", "skips")}
            for c in json.loads((cwd / name / "buffer_sizes.json").read_text())["cells"]
        ]
    assert cells["remote"] == cells["local"]
    assert ranged and all(ranged)  # every shard GET was a range read
    # one 1 MiB request per shard opened (6 shards), by the untimed warm-up pack and again by the timed cell
    assert len(ranged) <= 12
    assert (ObjectFile.__init__, ObjectFile._open_large_file) == before


def test_demo_streams_a_remote_prepared_dataset(remote_demo, cwd, capsys):
    assert (
        main(["demo", "--data", remote_demo, "--packs", "2", "--workers", "0", "--buffer", "8", "--out", "demo.json"])
        == 0
    )
    report = json.loads((cwd / "demo.json").read_text())
    assert report["dataset"] == remote_demo
    assert [(c["mode"], c["packs"]) for c in report["cells"]] == [("carry", 2), ("rounds", 2)]
    assert os.listdir(cwd) == ["demo.json"]


def test_prepare_indexes_remote_shards_in_place(raw_shards, demo_shards, s3_store, cwd, capsys):
    """The index Energon writes remotely names the same shards and counts as the local one."""
    url, names = raw_shards
    assert main(["prepare", url]) == 0
    out = capsys.readouterr().out
    assert f"prepared {url}: 600 samples" in out and "shards per split: train 6, val 0, test 0" in out
    remote = list_names(url)
    assert remote == sorted(
        [
            *names,
            *(n + ".idx" for n in names),
            ".nv-meta/.info.json",
            ".nv-meta/dataset.yaml",
            ".nv-meta/index.sqlite",
            ".nv-meta/index.uuid",
            ".nv-meta/split.yaml",
        ]
    )
    for name in (".nv-meta/.info.json", ".nv-meta/dataset.yaml", *(n + ".idx" for n in names)):
        body = s3_store.client.get_object(Bucket="energon-pack-test", Key=f"raw/{name}")["Body"].read()
        local = (demo_shards / name).read_bytes()
        assert (
            (json.loads(body)["shard_counts"] == json.loads(local)["shard_counts"])
            if name.endswith(".json")
            else body == local
        ), name
    assert os.listdir(cwd) == []


def test_convert_into_object_storage(llava_json, s3_store, tmp_path, cwd, capsys):
    """Converted (in a temporary folder, removed after) and uploaded: the objects are the local output's files."""
    url = s3_store.url("converted")
    assert main(["convert", str(llava_json), url, "--workers", "0", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["out_dir"], summary["written"], summary["images"]) == (url, 5, 4)
    assert main(["convert", str(llava_json), str(tmp_path / "local"), "--workers", "0", "--no-progress"]) == 0
    local = tmp_path / "local"
    assert list_names(url) == list_names(local)
    for name in list_names(local):
        if name.endswith(".tar"):
            body = s3_store.client.get_object(Bucket="energon-pack-test", Key=f"converted/{name}")["Body"].read()
            assert body == (local / name).read_bytes(), name
    assert (
        json.loads(
            s3_store.client.get_object(Bucket="energon-pack-test", Key="converted/convert_summary.json")["Body"].read()
        )["out_dir"]
        == url
    )
    assert os.listdir(cwd) == []
    shutil.rmtree(local)
