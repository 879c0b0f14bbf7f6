"""``energon-pack convert``: user data (LLaVA JSON, ShareGPT JSONL, OpenAI-messages JSONL, Parquet) ->
prepared Energon shards, streamed end to end through the real loader with 2 workers."""

import base64
import hashlib
import io
import json
import pickle
import tarfile

import numpy as np
import pytest
from megatron.energon import WorkerConfig, get_loader, get_train_dataset
from PIL import Image

from energon_pack.cli.convert import ConvertSummary, convert, detect_format, main
from energon_pack.errors import ConfigError
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder


def image(fmt, w=40, h=28, seed=0):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def turns(q, a, n_images=0):
    return [{"from": "human", "value": "<image>\n" * n_images + q}, {"from": "gpt", "value": a}]


def stream(path, te):
    """Every pack of one finite pass with 2 loader workers: (keys in packs, images in packs, encoder skips)."""
    ds = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    tracker, keys, n_images = PackingStatsTracker(), [], 0
    for b in get_loader(ds):
        keys.extend(b["__keys__"])
        tracker.update(b["packing_stats"])
        grid = b["visual_inputs"].image_grid_thw if "visual_inputs" in b else b.get("image_grid_thw")
        n_images += 0 if grid is None else int(grid.shape[0])
    return keys, n_images, dict(tracker.total.skips)


def shard_members(out, resolve=True):
    """{member name: bytes} over every shard of a convert output; ``resolve``: a record's media stored once in an
    earlier record (its ``media_refs.json``) under its own names, as the loader reads them back."""
    members = {}
    for shard in sorted(out.glob("data-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                assert m.name not in members
                members[m.name] = tar.extractfile(m).read()
    for name in [n for n in members if resolve and n.endswith(".media_refs.json")]:
        key = name.split(".", 1)[0]
        for field, ref in json.loads(members.pop(name)).items():
            assert hashlib.sha256(members[ref["member"]]).hexdigest() == ref["sha256"]
            members[f"{key}.{field}"] = members[ref["member"]]
    return members


def written_keys(out):
    return sorted({name.split(".", 1)[0] for name in shard_members(out)})


def assert_streams_exactly_once(out, summary, te=None):
    keys, n_images, skips = stream(
        out, te or QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=2048)
    )
    assert skips == {} and n_images == summary.images
    assert len(keys) == len(set(keys)) == summary.written  # each converted sample exactly once
    assert sorted(keys) == written_keys(out)


# ------------------------------------------------------------------------------ LLaVA JSON
@pytest.fixture(scope="module")
def llava_source(tmp_path_factory):
    """13 LLaVA records: 9 usable (one PNG named .jpg, two images, text-only), 2 missing images, 1 corrupt,
    1 mismatch."""
    root = tmp_path_factory.mktemp("llava")
    (root / "imgs").mkdir()
    files = {f"imgs/{i}.jpg": image("JPEG", 32 + 8 * i, 28, i) for i in range(6)}
    files["imgs/really_a_png.jpg"] = image("PNG", 36, 30, 99)
    files["imgs/broken.jpg"] = b"\xff\xd8 this is not a jpeg" * 4
    for name, data in files.items():
        (root / name).write_bytes(data)
    records = [
        {"id": f"img{i}", "image": f"imgs/{i}.jpg", "conversations": turns(f"What is {i}?", f"Thing {i}.", 1)}
        for i in range(6)
    ]
    records += [
        {"id": "png", "image": "imgs/really_a_png.jpg", "conversations": turns("Colour?", "Noise.", 1)},
        {"id": "two", "images": ["imgs/0.jpg", "imgs/1.jpg"], "conversations": turns("Same?", "No.", 2)},
        {"id": "text", "conversations": turns("Hi", "Hello there.")},
        {"id": "gone1", "image": "imgs/nope.jpg", "conversations": turns("?", "x", 1)},
        {"id": "broken", "image": "imgs/broken.jpg", "conversations": turns("?", "x", 1)},
        {"id": "gone2", "image": "elsewhere/also_missing.png", "conversations": turns("?", "x", 1)},
        {"id": "mismatch", "image": "imgs/2.jpg", "conversations": turns("?", "x", 2)},
    ]
    (root / "llava.json").write_text(json.dumps(records, indent=1))
    return root, records, files


EXTS = [*((i, "jpg") for i in range(6)), (6, "png")]


def test_llava_json_missing_and_corrupt_images_counted_and_streamed(llava_source, tmp_path):
    root, records, files = llava_source
    assert detect_format(root / "llava.json")[0] == "llava"
    s = convert(root / "llava.json", tmp_path / "out", workers=2, samples_per_shard=4, progress=False)
    assert isinstance(s, ConvertSummary) and s.format == "llava" and "JSON array of 13 records" in s.detected
    assert (s.records, s.written, s.skipped) == (
        13,
        9,
        {"corrupt_image": 1, "media_count_mismatch": 1, "missing_image": 2},
    )
    assert s.written + s.skipped_total == len(records)
    assert s.examples["missing_image"] == [
        f"record 9: image 0: {root / 'imgs/nope.jpg'} not found",
        f"record 11: image 0: {root / 'elsewhere/also_missing.png'} not found",
    ]
    assert s.examples["corrupt_image"][0].startswith(f"record 10: image 0 ({root / 'imgs/broken.jpg'})")
    assert s.examples["media_count_mismatch"] == ["record 12: 2 <image> placeholder(s) but 1 image(s)"]
    assert s.images == 9 and s.shards == 3  # chunks of 4 records: 4 + 4 + 1 + 0 usable samples
    members = shard_members(tmp_path / "out", resolve=False)
    # original bytes, extension sniffed from the bytes (the PNG named .jpg is stored as .png)
    for i in range(6):
        assert members[f"{i:09d}.0.jpg"] == files[f"imgs/{i}.jpg"]
    assert members["000000006.0.png"] == files["imgs/really_a_png.jpg"]
    # record 7 reuses images 0 and 1: stored once, it references the members of records 0 and 1 (by SHA-256)
    assert "000000007.0.jpg" not in members and "000000007.1.jpg" not in members
    assert json.loads(members["000000007.media_refs.json"]) == {
        f"{i}.jpg": {"member": f"00000000{i}.0.jpg", "sha256": hashlib.sha256(files[f"imgs/{i}.jpg"]).hexdigest()}
        for i in (0, 1)
    }
    assert (s.media_stored, s.media_stored_bytes) == (7, sum(len(members[f"{i:09d}.0.{e}"]) for i, e in EXTS))
    doc = json.loads(members["000000008.json"])
    assert doc == {"id": "text", "conversations": records[8]["conversations"]}
    assert written_keys(tmp_path / "out") == [f"{i:09d}" for i in range(9)]
    assert_streams_exactly_once(tmp_path / "out", s)
    summary_file = json.loads((tmp_path / "out" / "convert_summary.json").read_text())
    assert summary_file["written"] == 9 and summary_file["skipped"]["missing_image"] == 2


def test_output_does_not_depend_on_workers(llava_source, tmp_path):
    root, _, _ = llava_source
    a = convert(root / "llava.json", tmp_path / "a", workers=0, samples_per_shard=3, progress=False)
    b = convert(root / "llava.json", tmp_path / "b", workers=2, samples_per_shard=3, progress=False)
    assert (a.written, a.skipped, a.examples, a.shards) == (b.written, b.skipped, b.examples, b.shards)
    for name in [f"data-{i:06d}.tar" for i in range(a.shards)]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_bridge_layout_trains_through_the_bridge_encoder(llava_source, tmp_path):
    from energon_pack.integrations.bridge import BridgeQwenVLPackingTaskEncoder

    root, _, files = llava_source
    s = convert(root / "llava.json", tmp_path / "out", layout="bridge", workers=2, progress=False)
    assert (s.written, s.skipped_total, s.shards) == (9, 4, 1)
    members = shard_members(tmp_path / "out")
    assert {n.split(".", 1)[1] for n in members} == {"json", "jpgs", "videos"}
    assert pickle.loads(members["000000007.jpgs"]) == [files["imgs/0.jpg"], files["imgs/1.jpg"]]
    assert pickle.loads(members["000000006.jpgs"]) == [files["imgs/really_a_png.jpg"]]
    assert pickle.loads(members["000000008.jpgs"]) == [] and pickle.loads(members["000000008.videos"]) == []
    te = BridgeQwenVLPackingTaskEncoder(
        tokenizer="demo", preset="qwen2.5-vl", seq_length=2048, cp=2, tp=2, sp=True, pad_to_max_length=True
    )
    assert_streams_exactly_once(tmp_path / "out", s, te)


# ------------------------------------------------------------------------------ ShareGPT JSONL
def test_sharegpt_jsonl_with_a_broken_line(tmp_path):
    a, b = image("JPEG", 48, 32, 1), image("WEBP", 30, 40, 2)
    (tmp_path / "a.jpg").write_bytes(a)
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "b.webp").write_bytes(b)
    lines = [
        {
            "conversations": [{"from": "system", "value": "Be brief."}, *turns("Compare.", "Left is wider.", 2)],
            "images": ["a.jpg", "pics/b.webp"],
        },
        {"conversations": turns("One?", "Yes.", 1), "images": ["pics/b.webp"]},
        {"conversations": turns("No image here.", "Fine.") + turns("More?", "No.")},
        {"conversations": turns("Images without placeholders go first.", "Ok."), "images": ["a.jpg"]},
    ]
    text = "\n".join(json.dumps(r) for r in lines[:2]) + "\n\n" + '{"conversations": [{"from": "human"\n'
    text += "\n".join(json.dumps(r) for r in lines[2:]) + "\n"
    (tmp_path / "data.jsonl").write_text(text)
    s = convert(tmp_path / "data.jsonl", tmp_path / "out", workers=2, samples_per_shard=2, progress=False)
    assert s.format == "sharegpt" and "JSONL" in s.detected
    assert (s.records, s.written, s.blank_lines, s.skipped) == (5, 4, 1, {"invalid_json": 1})
    assert s.examples["invalid_json"][0].startswith("line 4: ")
    members = shard_members(tmp_path / "out")
    assert (members["000000000.0.jpg"], members["000000000.1.webp"], members["000000001.0.webp"]) == (a, b, b)
    assert members["000000004.0.jpg"] == a  # the record after the broken line keeps its own index
    assert_streams_exactly_once(tmp_path / "out", s)


# ------------------------------------------------------------------------------ OpenAI messages JSONL
def test_messages_jsonl_typed_parts_data_uris_and_tool_calls(tmp_path):
    a, b = image("JPEG", 40, 40, 3), image("PNG", 28, 56, 4)
    (tmp_path / "a.jpg").write_bytes(a)
    (tmp_path / "b.png").write_bytes(b)
    uri = "data:image/png;base64," + base64.b64encode(b).decode()
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    records = [
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}]},
        {
            "messages": [{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "A."}],
            "images": ["a.jpg"],
        },
        {
            "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "B."}]},
            ],
            "images": [{"path": "b.png"}],
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": "a.jpg"},
                        {"type": "image_url", "image_url": {"url": uri}},
                        {"type": "text", "text": "Both?"},
                    ],
                },
                {"role": "assistant", "content": "Two."},
            ]
        },
        {
            "messages": [
                {"role": "system", "content": "You can call tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
                {"role": "assistant", "content": "21 degrees."},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        },
        {"messages": [{"role": "user", "content": "Only a question."}]},
        {
            "messages": [{"role": "user", "content": "https?"}, {"role": "assistant", "content": "no"}],
            "images": ["https://example.com/x.jpg"],
        },
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    s = convert(tmp_path / "chat.jsonl", tmp_path / "out", workers=2, samples_per_shard=3, progress=False)
    assert s.format == "messages"
    assert (s.records, s.written, s.skipped) == (7, 5, {"no_assistant_turn": 1, "remote_image": 1})
    assert s.examples["no_assistant_turn"] == ["line 6: conversation has no assistant turn"]
    members = shard_members(tmp_path / "out")
    assert members["000000001.0.jpg"] == a and members["000000002.0.png"] == b
    assert (members["000000003.0.jpg"], members["000000003.1.png"]) == (a, b)
    inline = json.loads(members["000000003.json"])["messages"][0]["content"]
    assert inline == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Both?"}]  # sources moved out
    assert json.loads(members["000000004.json"]) == {"tools": records[4]["tools"], "messages": records[4]["messages"]}
    # tool calls render only where the official template handles them (Qwen3-VL; the Qwen2/2.5-VL
    # templates have none: a counted tool_calls_unsupported skip there, tests/cli/test_tool_calls.py)
    assert_streams_exactly_once(
        tmp_path / "out", s, QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen3-vl", seq_length=2048)
    )


# ------------------------------------------------------------------------------ Parquet
def test_parquet_with_image_bytes(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    imgs = [image("JPEG", 32 + 4 * i, 30, 10 + i) for i in range(5)]
    (tmp_path / "on_disk.png").write_bytes(image("PNG", 30, 30, 50))
    rows = []
    for i in range(5):
        rows.append(
            {
                "id": i,
                "images": [{"bytes": imgs[i], "path": f"img{i}.jpg"}],
                "messages": [
                    {"role": "user", "content": f"<image>Describe {i}."},
                    {"role": "assistant", "content": f"Picture {i}."},
                ],
            }
        )
    rows.append(
        {
            "id": 5,
            "images": [{"bytes": imgs[0], "path": None}, {"bytes": imgs[1], "path": None}],
            "messages": [{"role": "user", "content": "<image><image>Two."}, {"role": "assistant", "content": "Yes."}],
        }
    )
    rows.append(
        {
            "id": 6,
            "images": [],
            "messages": [{"role": "user", "content": "Text."}, {"role": "assistant", "content": "Ok."}],
        }
    )
    rows.append(
        {
            "id": 7,
            "images": [{"bytes": b"\x89PNG\r\n\x1a\n truncated", "path": "bad.png"}],
            "messages": [{"role": "user", "content": "<image>?"}, {"role": "assistant", "content": "?"}],
        }
    )
    rows.append(
        {
            "id": 8,
            "images": [{"bytes": None, "path": "on_disk.png"}],
            "messages": [{"role": "user", "content": "<image>disk"}, {"role": "assistant", "content": "d"}],
        }
    )
    rows.append(
        {
            "id": 9,
            "images": [{"bytes": None, "path": "not_there.png"}],
            "messages": [{"role": "user", "content": "<image>gone"}, {"role": "assistant", "content": "g"}],
        }
    )
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "train.parquet", row_group_size=4)
    fmt, how = detect_format(tmp_path / "train.parquet")
    assert fmt == "parquet" and "conversation column 'messages'" in how and "image column 'images'" in how
    s = convert(tmp_path / "train.parquet", tmp_path / "out", workers=2, samples_per_shard=4, progress=False)
    assert (s.records, s.written, s.skipped) == (10, 8, {"corrupt_image": 1, "missing_image": 1})
    assert s.examples["corrupt_image"][0].startswith("row 7: image 0 (bytes of bad.png)")
    assert s.examples["missing_image"] == [f"row 9: image 0: {tmp_path / 'not_there.png'} not found"]
    members = shard_members(tmp_path / "out")
    for i in range(5):
        assert members[f"{i:09d}.0.jpg"] == imgs[i]
    assert (members["000000005.0.jpg"], members["000000005.1.jpg"]) == (imgs[0], imgs[1])
    assert members["000000008.0.png"] == (tmp_path / "on_disk.png").read_bytes()
    assert json.loads(members["000000002.json"]) == {"id": 2, "messages": rows[2]["messages"]}
    assert_streams_exactly_once(tmp_path / "out", s)


# ------------------------------------------------------------------------------ refusals and errors
def test_rerun_refused_overwrite_and_foreign_folders(llava_source, tmp_path, capsys):
    root, _, _ = llava_source
    src = root / "llava.json"
    first = convert(src, tmp_path / "out", workers=0, progress=False)
    with pytest.raises(ConfigError, match="already holds a finished conversion .9 samples") as err:
        convert(src, tmp_path / "out", workers=0, progress=False)
    assert err.value.knob == "out_dir" and "--overwrite" in str(err.value)
    again = convert(src, tmp_path / "out", workers=0, progress=False, overwrite=True)
    assert again.written == first.written and sorted(p.name for p in (tmp_path / "out").glob("*.tar")) == [
        "data-000000.tar"
    ]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not an energon-pack convert output"):
        convert(src, tmp_path / "mine", workers=0, progress=False, overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "out" / "notes.txt").write_text("a user file in our output")
    with pytest.raises(ConfigError, match="notes.txt"):
        convert(src, tmp_path / "out", workers=0, progress=False, overwrite=True)
    assert main([str(src), str(tmp_path / "out"), "--workers", "0", "--no-progress"]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("energon-pack convert: error: out_dir:")
    # 4 of 13 skipped: over the default --max-skipped-share 0.1, so exit 2 after a whole output and its summary
    assert main([str(src), str(tmp_path / "cli"), "--workers", "0", "--no-progress", "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["written"] == 9 and json.loads(captured.out)["failed"] in captured.err
    assert captured.err.startswith("energon-pack convert: error: 4 of 13 records skipped (")
    assert "30.8% of the records were skipped, over --max-skipped-share 0.1" in captured.err
    assert (tmp_path / "cli" / "convert_summary.json").exists()
    cli = [str(src), str(tmp_path / "cli"), "--workers", "0", "--no-progress", "--overwrite"]
    assert main([*cli, "--max-skipped-share", "0.4"]) == 0
    text = capsys.readouterr().out
    assert "records  13: written 9, skipped 4" in text and "missing_image: 2" in text


def test_config_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="does not exist") as err:
        convert(tmp_path / "missing.json", tmp_path / "out", progress=False)
    assert err.value.knob == "source" and not (tmp_path / "out").exists()
    (tmp_path / "x.json").write_text(
        '[{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]'
    )
    with pytest.raises(ConfigError) as err:
        convert(tmp_path / "x.json", tmp_path / "out", format="yaml", progress=False)
    assert err.value.knob == "format"
    (tmp_path / "odd.json").write_text('[{"question": "a", "answer": "b"}]')  # prompt + completion is TRL's
    with pytest.raises(ConfigError, match="cannot tell the record shape"):
        convert(tmp_path / "odd.json", tmp_path / "out", progress=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file") as err:
        convert(tmp_path / "x.json", tmp_path / "file", progress=False)
    assert err.value.knob == "out_dir"
    assert main([str(tmp_path / "missing.json"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"energon-pack convert: error: source: {tmp_path / 'missing.json'} does not exist. Fix: pass a LLaVA/ShareGPT "
        "JSON or JSONL file, an OpenAI-messages JSONL file, or Parquet file(s)"
    )
    with pytest.raises(ConfigError):
        main([str(tmp_path / "missing.json"), str(tmp_path / "out"), "--debug"])
    # everything skipped: a ConfigError naming the reasons, and no half-made output left behind
    (tmp_path / "all_bad.json").write_text(json.dumps([{"image": "no.jpg", "conversations": turns("?", "x", 1)}]))
    with pytest.raises(ConfigError, match="missing_image=1"):
        convert(tmp_path / "all_bad.json", tmp_path / "out2", workers=0, progress=False)
    assert not any(p.suffix == ".tar" for p in (tmp_path / "out2").iterdir())


@pytest.mark.parametrize("shape", ["binary_list", "image_struct", "cauldron_texts", "conversations_json_string"])
def test_parquet_column_shapes(tmp_path, shape):
    """The other common Parquet layouts: images as a list of binary, one ``image`` struct column,
    the_cauldron's ``texts`` (user/assistant pairs, no placeholders), conversations stored as a JSON string."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    imgs = [image("JPEG", 30 + 2 * i, 30, 70 + i) for i in range(4)]
    conv = [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "That."}]
    if shape == "binary_list":
        table = pa.table({"images": [[imgs[i]] for i in range(4)], "conversations": [conv] * 4})
    elif shape == "image_struct":
        table = pa.table(
            {"image": [{"bytes": imgs[i], "path": f"{i}.jpg"} for i in range(4)], "conversations": [conv] * 4}
        )
    elif shape == "cauldron_texts":
        table = pa.table(
            {
                "images": [[imgs[i], imgs[(i + 1) % 4]] for i in range(4)],
                "texts": [
                    [
                        {"user": "Compare.", "assistant": "Alike.", "source": "x"},
                        {"user": "Sure?", "assistant": "Yes.", "source": "x"},
                    ]
                ]
                * 4,
            }
        )
    else:
        table = pa.table({"images": [[imgs[i]] for i in range(4)], "conversations": [json.dumps(conv)] * 4})
    pq.write_table(table, tmp_path / "d.parquet")
    s = convert(tmp_path / "d.parquet", tmp_path / "out", workers=0, progress=False)
    assert (s.format, s.records, s.written, s.skipped) == ("parquet", 4, 4, {})
    members = shard_members(tmp_path / "out")
    assert members["000000002.0.jpg"] == imgs[2]
    if shape == "cauldron_texts":
        assert members["000000002.1.jpg"] == imgs[3]
        doc = json.loads(members["000000002.json"])
        assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "user", "assistant"]
        assert_streams_exactly_once(tmp_path / "out", s)  # images without placeholders go first


def test_text_only_output_works_with_both_encoders(tmp_path):
    from energon_pack.energon import TextPackingTaskEncoder

    recs = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i} " * (i + 1)}]}
        for i in range(10)
    ] + [{"conversations": turns("x", "y")}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = convert(tmp_path / "t.jsonl", tmp_path / "out", workers=2, samples_per_shard=4, progress=False)
    assert (s.written, s.shards, s.images) == (11, 3, 0)
    assert_streams_exactly_once(tmp_path / "out", s)
    assert_streams_exactly_once(
        tmp_path / "out", s, TextPackingTaskEncoder(tokenizer="demo", format="chat", seq_length=512)
    )
