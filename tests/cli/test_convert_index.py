"""The pure-Python Energon index (:mod:`energon_pack.energon.index_writer`, what ``energon-pack convert`` and
``prepare_webdataset`` write on a tested Energon release) against Energon's own ``prepare_dataset``: the same
sqlite schema and rows, the same ``.tar.idx`` bytes, ``.info.json`` and ``split.yaml``; and the real loader
reading a converted dataset completely with worker processes."""

import contextlib
import io
import json
import shutil
import sqlite3
import uuid

import numpy as np
import pytest
from megatron.energon import BaseWebdatasetFactory, WorkerConfig, get_loader, get_train_dataset
from megatron.energon.bracecollapse import collapse
from PIL import Image

from energon_pack.cli.convert import convert
from energon_pack.cli.convert.tar_sink import TarSink
from energon_pack.energon import index_writer
from energon_pack.energon.index_writer import _collapse, write_webdataset_index
from energon_pack.energon.prepare import prepare_webdataset
from energon_pack.errors import ConfigError
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

META_FILES = (".info.json", "split.yaml")


def png(seed: int, w: int = 24, h: int = 16) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write_shards(root, names, per_shard=(3, 1, 5, 2, 4)):
    """Shards of samples with 1 to 4 parts (json, images of several sizes, a text part), keys unique overall."""
    root.mkdir(parents=True, exist_ok=True)
    n = 0
    for name, count in zip(names, per_shard):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        with TarSink(str(root / name)) as sink:
            for _ in range(count):
                sample = {"__key__": f"s{n:05d}", "json": json.dumps({"i": n}).encode()}
                for k in range(n % 4):
                    sample[f"{k}.png"] = png(n * 10 + k, w=8 + 13 * k)
                if n % 3 == 0:
                    sample["txt"] = ("x" * (n * 97)).encode()
                sink.write(sample)
                n += 1


def energon_prepare(root, names, ratio):
    with contextlib.redirect_stdout(io.StringIO()):
        BaseWebdatasetFactory.prepare_dataset(root, names, split_parts_ratio=ratio, shuffle_seed=None, workers=1)


def sqlite_dump(path):
    """(schema, samples rows, sample_parts rows) in insertion order."""
    db = sqlite3.connect(path)
    try:
        schema = sorted(db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall(), key=str)
        samples = db.execute("SELECT * FROM samples ORDER BY rowid").fetchall()
        parts = db.execute("SELECT * FROM sample_parts ORDER BY rowid").fetchall()
    finally:
        db.close()
    return schema, samples, parts


def assert_same_index(ours, theirs, names):
    assert sqlite_dump(ours / ".nv-meta" / "index.sqlite") == sqlite_dump(theirs / ".nv-meta" / "index.sqlite")
    for name in names:
        assert (ours / (name + ".idx")).read_bytes() == (theirs / (name + ".idx")).read_bytes(), name
        assert (ours / (name + ".idx")).stat().st_mode == (theirs / (name + ".idx")).stat().st_mode
        assert not (ours / (name + ".idx.tmp")).exists()
    for name in META_FILES:
        assert (ours / ".nv-meta" / name).read_bytes() == (theirs / ".nv-meta" / name).read_bytes(), name
    for name in ("index.sqlite", "index.uuid", *META_FILES):
        assert (ours / ".nv-meta" / name).stat().st_mode == (theirs / ".nv-meta" / name).stat().st_mode, name
    uuid.UUID((ours / ".nv-meta" / "index.uuid").read_text())  # a fresh uuid4, like Energon's
    written = {p.name for p in (ours / ".nv-meta").iterdir()} - {"dataset.yaml"}  # prepare_webdataset's own
    assert written == {p.name for p in (theirs / ".nv-meta").iterdir()}


@pytest.mark.parametrize(
    "names,ratio",
    [
        (["data-000000.tar", "data-000001.tar", "data-000002.tar"], [("train", 1.0), ("val", 0.0), ("test", 0.0)]),
        # runs that break (a gap, another width, another template), shards in a subfolder, a 3-way split
        (
            ["part-007.tar", "part-008.tar", "part-010.tar", "sub/part-0011.tar", "x.tar"],
            [("train", 0.6), ("val", 0.2), ("test", 0.2)],
        ),
    ],
)
def test_pure_python_index_equals_energons_prepare(tmp_path, names, ratio):
    write_shards(tmp_path / "ours", names)
    shutil.copytree(tmp_path / "ours", tmp_path / "theirs")
    counts = write_webdataset_index(tmp_path / "ours", names, split_parts_ratio=ratio)
    energon_prepare(tmp_path / "theirs", names, ratio)
    assert counts == dict(zip(names, (3, 1, 5, 2, 4)))
    assert_same_index(tmp_path / "ours", tmp_path / "theirs", names)
    _, samples, parts = sqlite_dump(tmp_path / "ours" / ".nv-meta" / "index.sqlite")
    total = sum(counts.values())
    assert len(samples) == total and len(parts) == sum(1 + i % 4 + (i % 3 == 0) for i in range(total))


def test_convert_output_equals_energons_prepare_of_its_shards(tmp_path):
    """Convert's own output (images, several shards) indexed as Energon indexes the same tars."""
    (tmp_path / "src").mkdir()
    for i in range(3):
        (tmp_path / "src" / f"{i}.png").write_bytes(png(i))
    records = [
        {
            "id": str(i),
            "images": [f"{k}.png" for k in range(i % 3)],
            "conversations": [
                {"from": "human", "value": "<image>" * (i % 3) + f"question {i}"},
                {"from": "gpt", "value": f"answer {i}"},
            ],
        }
        for i in range(11)
    ]
    (tmp_path / "src" / "d.json").write_text(json.dumps(records))
    out = tmp_path / "out"
    summary = convert(tmp_path / "src" / "d.json", out, samples_per_shard=4, workers=0, progress=False)
    assert (summary.written, summary.shards, summary.images) == (11, 3, 10)
    names = [f"data-{i:06d}.tar" for i in range(3)]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name in names:
        shutil.copy2(out / name, theirs / name)
    energon_prepare(theirs, names, [("train", 1.0), ("val", 0.0), ("test", 0.0)])
    assert_same_index(out, theirs, names)


def test_the_loader_reads_a_converted_dataset_completely(tmp_path):
    """Energon's loader, 2 worker processes, over convert's pure-Python index: every sample once."""
    (tmp_path / "a.png").write_bytes(png(0, 40, 28))
    records = [
        {
            "id": str(i),
            **({"image": "a.png"} if i % 2 else {}),
            "conversations": [
                {"from": "human", "value": ("<image>\n" if i % 2 else "") + f"what is {i}?"},
                {"from": "gpt", "value": f"it is {i}"},
            ],
        }
        for i in range(14)
    ]
    (tmp_path / "d.json").write_text(json.dumps(records))
    summary = convert(tmp_path / "d.json", tmp_path / "out", samples_per_shard=3, workers=0, progress=False)
    assert (summary.written, summary.shards) == (14, 5)
    ds = get_train_dataset(
        str(tmp_path / "out"),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        task_encoder=QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=2048),
        packing_buffer_size=4,
        repeat=False,
    )
    keys, images = [], 0
    for batch in get_loader(ds):
        keys.extend(batch["__keys__"])
        grid = batch["visual_inputs"].image_grid_thw if "visual_inputs" in batch else batch.get("image_grid_thw")
        images += 0 if grid is None else int(grid.shape[0])
    _, samples, _ = sqlite_dump(tmp_path / "out" / ".nv-meta" / "index.sqlite")
    assert len(keys) == len(set(keys)) == 14 and set(keys) == {row[1] for row in samples}
    assert images == 7


def test_collapse_is_energons(tmp_path):
    cases = [
        [],
        ["a.tar"],
        [f"data-{i:06d}.tar" for i in range(12)],
        ["p-01.tar", "p-02.tar", "p-04.tar", "p-05.tar", "p-5.tar", "q-06.tar"],
        ["a1b1.tar", "a1b2.tar", "a2b2.tar", "a2b3.tar", "a3b3.tar"],
        ["x9.tar", "x10.tar", "x11.tar", "y.tar", "y.tar"],
        ["s/0/a-1.tar", "s/0/a-2.tar", "s/1/a-3.tar"],
    ]
    for names in cases:
        assert _collapse(names) == collapse(names, keep_order=True), names


def test_prepare_webdataset_uses_energon_on_an_untested_release(tmp_path, monkeypatch):
    names = ["data-000000.tar", "data-000001.tar"]
    write_shards(tmp_path / "ds", names)
    calls = []
    original = BaseWebdatasetFactory.prepare_dataset.__func__

    def spy(cls, *args, **kw):
        calls.append(args[1])
        with contextlib.redirect_stdout(io.StringIO()):
            return original(cls, *args, **kw)

    monkeypatch.setattr(BaseWebdatasetFactory, "prepare_dataset", classmethod(spy))
    monkeypatch.setattr(index_writer, "installed_energon_version", lambda: "99.0.0")
    assert prepare_webdataset(tmp_path / "ds") == 4
    assert calls == [names]
    monkeypatch.setattr(index_writer, "installed_energon_version", lambda: "7.4.1")
    assert prepare_webdataset(tmp_path / "ds") == 4  # re-prepared in place, by the writer
    assert calls == [names]
    assert (tmp_path / "ds" / ".nv-meta" / "dataset.yaml").is_file()


def test_duplicate_keys_and_empty_shards_are_one_line_errors(tmp_path):
    root = tmp_path / "dup"
    root.mkdir()
    for name in ("a.tar", "b.tar"):
        with TarSink(str(root / name)) as sink:
            sink.write({"__key__": "same", "json": b"{}"})
    with pytest.raises(ConfigError, match="sample key 'same' of .*b.tar occurs twice"):
        write_webdataset_index(root, ["a.tar", "b.tar"])
    with TarSink(str(root / "empty.tar")):
        pass
    with pytest.raises(ConfigError, match="empty.tar holds no sample"):
        write_webdataset_index(root, ["empty.tar"])
