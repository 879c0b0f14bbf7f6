"""``energon-pack convert`` on hostile records: reads confined to the source folder and
``--image-root``, regular files only, a size cap, a header check before the rest is read, and
any single bad record a counted skip (issue 20, items 2, 3 and 9)."""

import base64
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile

import pytest
from test_convert import image, turns

from energon_pack.cli.convert import SKIP_REASONS, convert, detect, main, media, records, shards
from energon_pack.cli.convert.media import HEADER_BYTES
from energon_pack.errors import ConfigError
from harness.watchdog import hang_alarm  # fails the test instead of hanging on a FIFO


def members_bytes(out):
    blob = b""
    for shard in sorted(out.glob("data-*.tar")):
        with tarfile.open(shard) as tar:
            blob += b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    return blob


def rec(ref, q="What?"):
    return {"image": ref, "conversations": turns(q, "An answer.", 1)}


@pytest.fixture
def tree(tmp_path):
    """src/ (records, imgs/), images/ (an --image-root elsewhere), secret/ (must never be read)."""
    src, imgs, secret = tmp_path / "src", tmp_path / "images", tmp_path / "secret"
    for d in (src / "imgs", imgs, secret):
        d.mkdir(parents=True)
    (src / "imgs" / "ok.jpg").write_bytes(image("JPEG", 40, 28, 1))
    (imgs / "rooted.png").write_bytes(image("PNG", 36, 30, 2))
    secret_jpg = image("JPEG", 44, 32, 3) + b"SECRET-MARKER"
    (secret / "secret.jpg").write_bytes(secret_jpg)
    (secret / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (src / "imgs" / "link_out.jpg").symlink_to(secret / "secret.jpg")
    (src / "imgs" / "link_in.jpg").symlink_to(src / "imgs" / "ok.jpg")
    (src / "imgs" / "zero.jpg").symlink_to("/dev/zero")
    os.mkfifo(src / "imgs" / "pipe.jpg")
    (src / "imgs" / "text.jpg").write_bytes(b"not an image at all\n" * 200_000)  # 4 MB, never read whole
    return src, imgs, secret


def test_reads_stay_inside_the_source_and_image_root(tree, tmp_path, capsys):
    src, imgs, secret = tree
    records = [
        rec(str(src / "imgs" / "ok.jpg")),  # 0 written: absolute, under the source folder
        rec(str(imgs / "rooted.png")),  # 1 written: absolute, under --image-root
        rec("rooted.png"),  # 2 written: relative to --image-root
        rec(str(src / "imgs" / "link_in.jpg")),  # 3 written: a symlink that stays inside
        rec("file://" + str(src / "imgs" / "ok.jpg")),  # 4 written: a file:// URI inside
        rec(str(secret / "secret.jpg")),  # 5 absolute path outside
        rec("../secret/secret.jpg"),  # 6 traversal
        rec(str(src / "imgs" / ".." / ".." / "secret" / "secret.jpg")),  # 7 traversal inside an absolute path
        rec("file://" + str(secret / "secret.jpg")),  # 8 a file:// URI outside
        rec(str(src / "imgs" / "link_out.jpg")),  # 9 a symlink out of the tree
        rec("/etc/passwd"),  # 10 a system file
    ]
    (src / "data.json").write_text(json.dumps(records))
    s = convert(src / "data.json", tmp_path / "out", image_root=imgs, workers=0, progress=False)
    assert (s.records, s.written, s.skipped) == (11, 5, {"path_outside_root": 6})
    assert s.examples["path_outside_root"][0].startswith(f"record 5: image 0: {secret / 'secret.jpg'} resolves to ")
    assert "--allow-outside-paths" in s.examples["path_outside_root"][0]
    assert b"SECRET-MARKER" not in members_bytes(tmp_path / "out") and b"root:x:0" not in members_bytes(
        tmp_path / "out"
    )
    # the CLI summary prints the count; --allow-outside-paths opts in (the symlinked secret is then read)
    assert (
        main(
            [
                str(src / "data.json"),
                str(tmp_path / "cli"),
                "--image-root",
                str(imgs),
                "--workers",
                "0",
                "--no-progress",
            ]
        )
        == 2  # 6 of 11 skipped: over --max-skipped-share 0.1, the fix named
    )
    out, err = capsys.readouterr()
    assert "skipped  path_outside_root: 6" in out
    assert "6 of 11 records skipped (path_outside_root: 6)" in err
    assert "Fix: pass --image-root DIR (the folder holding the media) or --allow-outside-paths" in err
    s = convert(
        src / "data.json", tmp_path / "open", image_root=imgs, workers=0, progress=False, allow_outside_paths=True
    )
    assert (s.written, s.skipped) == (10, {"not_an_image": 1})  # /etc/passwd: header checked, not copied
    assert b"SECRET-MARKER" in members_bytes(tmp_path / "open") and b"root:x:0" not in members_bytes(tmp_path / "open")


def test_only_regular_files_within_the_cap_with_an_image_header(tree, tmp_path, monkeypatch, capsys):
    src, _, _ = tree
    records = [
        rec("imgs/ok.jpg"),
        rec("imgs/pipe.jpg"),
        rec("imgs/zero.jpg"),
        rec("imgs"),
        rec("imgs/text.jpg"),
        rec("imgs/big.png"),
        rec("/dev/zero"),
        rec("/dev/stdin"),
        rec("/dev/null"),
    ]
    (src / "imgs" / "big.png").write_bytes(image("PNG", 30, 20, 5) + bytes(9 << 20))  # 9 MB
    (src / "data.json").write_text(json.dumps(records))
    reads = []
    real_read = media._read_upto
    monkeypatch.setattr(media, "_read_upto", lambda fd, n: reads.append(len(data := real_read(fd, n))) or data)
    with hang_alarm(60):
        s = convert(src / "data.json", tmp_path / "out", workers=0, progress=False, max_media_mb=8)
    assert (s.records, s.written) == (9, 1)
    assert s.skipped == {"path_outside_root": 4, "not_a_regular_file": 2, "not_an_image": 1, "media_too_large": 1}
    ex = s.examples
    assert ex["not_a_regular_file"] == [
        f"record 1: image 0: {src / 'imgs/pipe.jpg'} is a FIFO",
        f"record 3: image 0: {src / 'imgs'} is a folder",
    ]
    assert ex["not_an_image"] == [f"record 4: image 0: {src / 'imgs/text.jpg'}: its first bytes are no image header"]
    assert ex["media_too_large"][0].startswith(f"record 5: image 0: {src / 'imgs/big.png'}: 9.4 MB > --max-media-mb 8")
    assert sum(reads) == len((src / "imgs" / "ok.jpg").read_bytes()) + HEADER_BYTES  # text.jpg: 64 kB only
    with hang_alarm(60):  # the devices themselves, when outside paths are allowed: refused by kind, never read
        s = convert(
            src / "data.json", tmp_path / "open", workers=0, progress=False, allow_outside_paths=True, max_media_mb=8
        )
    stdin_is_file = os.path.isfile("/dev/stdin")  # /dev/stdin is whatever fd 0 is: a regular file when redirected
    assert s.skipped["not_a_regular_file"] == 6 - stdin_is_file
    assert s.examples["not_a_regular_file"][1].endswith("is a device")
    with pytest.raises(ConfigError) as err:
        convert(src / "data.json", tmp_path / "bad", max_media_mb=0, progress=False)
    assert err.value.knob == "max_media_mb"
    # the same knobs from the command line; a data: URI and inline bytes are held to the cap too
    big_uri = "data:image/png;base64," + base64.b64encode((src / "imgs" / "big.png").read_bytes()).decode()
    (src / "more.json").write_text(json.dumps([rec("imgs/ok.jpg"), rec(big_uri), rec("/dev/zero")]))
    with hang_alarm(60):
        assert (
            main(
                [
                    str(src / "more.json"),
                    str(tmp_path / "cli"),
                    "--workers",
                    "0",
                    "--no-progress",
                    "--json",
                    "--max-media-mb",
                    "8",
                    "--allow-outside-paths",
                    "--max-skipped-share",
                    "1",
                ]
            )
            == 0
        )
    cli = json.loads(capsys.readouterr().out)
    assert (cli["written"], cli["skipped"]) == (1, {"media_too_large": 1, "not_a_regular_file": 1})
    assert cli["examples"]["media_too_large"] == ["record 1: image 0: data URI: 9.4 MB > --max-media-mb 8"]


def test_one_bad_record_never_ends_the_run(tree, tmp_path, monkeypatch):
    src, _, _ = tree
    lines = [
        json.dumps(rec("imgs/ok.jpg")),
        json.dumps(rec("imgs/ok.jpg", q="lone \ud800 surrogate")),  # \\ud800 escape in the JSON text
        json.dumps(rec("imgs/ok.jpg\u0000.png")),  # NUL in a path
        json.dumps(rec("imgs/\udcff\ud800.jpg")),  # a path the file system cannot encode
        "[" * 100_000 + "]" * 100_000,  # nested 100,000 deep
        json.dumps({"conversations": [[[[[[[[[[]]]]]]]]]] * 1, "deep": json.loads("[" * 80 + "]" * 80)}),
        json.dumps(rec("imgs/ok.jpg", q="boom")),
    ]
    (src / "data.jsonl").write_text("\n".join(lines) + "\n")
    real = records.normalize_conversation

    def flaky(turns_):
        if "boom" in json.dumps(turns_):
            raise KeyError("a bug we did not foresee")
        return real(turns_)

    monkeypatch.setattr(records, "normalize_conversation", flaky)
    s = convert(src / "data.jsonl", tmp_path / "out", workers=0, progress=False)
    assert (s.records, s.written) == (7, 1)
    assert s.skipped == {"invalid_text": 1, "bad_image_ref": 2, "invalid_json": 2, "unexpected_error": 1}
    assert s.examples["invalid_text"][0].startswith("line 2: not encodable as UTF-8 (surrogates not allowed")
    assert s.examples["bad_image_ref"] == [
        "line 3: image 0: the path holds a NUL byte ('imgs/ok.jpg\\x00.png')",
        "line 4: image 0: the path is not valid text ('imgs/\\udcff\\ud800.jpg')",
    ]
    assert s.examples["unexpected_error"] == ["line 7: KeyError: 'a bug we did not foresee'"]
    assert set(s.skipped) <= set(SKIP_REASONS)


# ------------------------------------------------------------------------------ --overwrite (item 8)
@pytest.fixture
def small_source(tree):
    src, _, _ = tree
    (src / "data.json").write_text(json.dumps([rec("imgs/ok.jpg")] * 3))
    return src / "data.json"


def test_overwrite_deletes_only_what_convert_wrote(small_source, tmp_path):
    out = tmp_path / "out"
    convert(small_source, out, workers=0, progress=False, image_root=small_source.parent)
    listed = json.loads((out / ".convert_manifest.json").read_text())["names"]
    assert listed == sorted(
        [
            ".convert_in_progress",
            ".convert_manifest.json",
            ".convert_tmp",
            ".nv-meta",
            "convert_summary.json",
            "data-000000.tar",
        ]
    )
    # user files named like shards / Energon files, and a source placed in the folder: never deleted
    for name in ("data-000007.tar", "data-000003.tar.idx", "my_source.json"):
        (out / name).write_text("the user's own file")
    with pytest.raises(
        ConfigError,
        match=r"not an energon-pack convert output \(it holds data-000003.tar.idx, "
        r"data-000007.tar, my_source.json\)",
    ):
        convert(small_source, out, workers=0, progress=False, overwrite=True, image_root=small_source.parent)
    assert all(
        (out / n).read_text() == "the user's own file"
        for n in ("data-000007.tar", "data-000003.tar.idx", "my_source.json")
    )
    assert (out / "data-000000.tar").is_file() and (out / ".nv-meta" / "index.sqlite").is_file()
    for name in ("data-000007.tar", "data-000003.tar.idx", "my_source.json"):
        (out / name).unlink()
    s = convert(small_source, out, workers=0, progress=False, overwrite=True, image_root=small_source.parent)
    assert s.written == 3 and sorted(p.name for p in out.iterdir()) == [
        ".convert_manifest.json",
        ".nv-meta",
        "convert_summary.json",
        "data-000000.tar",
        "data-000000.tar.idx",
    ]
    # a folder without our manifest (an older convert, or anything else) is never emptied
    (out / ".convert_manifest.json").unlink()
    with pytest.raises(ConfigError, match="not an energon-pack convert output"):
        convert(small_source, out, workers=0, progress=False, overwrite=True, image_root=small_source.parent)
    assert (out / "data-000000.tar").is_file()


def test_a_running_convert_holds_the_folder_and_a_killed_one_leaves_no_lock(small_source, tmp_path):
    out = tmp_path / "out"
    convert(small_source, out, workers=0, progress=False, image_root=small_source.parent)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from energon_pack.cli.convert.outdir import _lock_out_dir; _lock_out_dir(Path(sys.argv[1])); "
            "print('locked', flush=True); time.sleep(120)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match="another energon-pack convert is writing to") as err:
            convert(small_source, out, workers=0, progress=False, overwrite=True, image_root=small_source.parent)
        assert err.value.knob == "out_dir" and (out / "data-000000.tar").is_file()
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # kill -9: the kernel drops its lock with it
        holder.wait()
    s = convert(small_source, out, workers=0, progress=False, overwrite=True, image_root=small_source.parent)
    assert s.written == 3


def test_overwrite_recovers_from_a_run_killed_while_indexing(small_source, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def killed_while_indexing(root, **_):
        (root / "data-000000.tar.idx.tmp").write_bytes(b"half an index")  # what Energon leaves mid-shard
        (root / ".nv-meta").mkdir()
        (root / ".nv-meta" / "index.sqlite-journal").write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(shards, "prepare_webdataset", killed_while_indexing)
    with pytest.raises(KeyboardInterrupt):
        convert(small_source, out, workers=0, progress=False, image_root=small_source.parent)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="holds an interrupted conversion"):
        convert(small_source, out, workers=0, progress=False, image_root=small_source.parent)
    s = convert(small_source, out, workers=0, progress=False, overwrite=True, image_root=small_source.parent)
    assert s.written == 3 and not (out / "data-000000.tar.idx.tmp").exists()
    assert not (out / ".nv-meta" / "index.sqlite-journal").exists() and (out / "data-000000.tar.idx").is_file()


# ------------------------------------------------------------------------------ JSON arrays, streamed (items 9, 12)
def test_iter_json_array_splits_exactly_like_json():
    rng = random.Random(0)
    atoms = ['a "quoted" word', "back\\slash\\", "\\", '"', "[{,}]", "ünï©ødé ✓", "😀", "", "tab\t\nnl"]

    def value(depth=0):
        kind = rng.randrange(7 if depth < 4 else 4)
        if kind == 0:
            return rng.choice(atoms) + rng.choice(atoms)
        if kind == 1:
            return rng.choice([0, -1.5e-7, 12345678901234567890, True, False, None])
        if kind in (2, 3):
            return rng.choice(atoms)
        if kind in (4, 5):
            return {rng.choice(atoms) + str(i): value(depth + 1) for i in range(rng.randrange(4))}
        return [value(depth + 1) for _ in range(rng.randrange(4))]

    for trial in range(40):
        array = [value() for _ in range(rng.randrange(12))]
        text = json.dumps(array, ensure_ascii=trial % 2 == 0, indent=trial % 3 or None).encode()
        if trial % 5 == 0:
            text = b"\xef\xbb\xbf \n" + text + b"\n\n"
        for chunk in (1, 2, 3, 7, 64, 1 << 20):
            assert [json.loads(raw) for raw in detect.iter_json_array(io.BytesIO(text), chunk)] == array


@pytest.mark.parametrize(
    "text, elements",
    [
        (b"[]", []),
        (b"  [ ]  ", []),
        (b'[1, {"a": "]"}, ]', [b"1", b' {"a": "]"}']),  # a trailing comma is no element
        (b"[1,,2]", [b"1", b"", b"2"]),  # an empty element is one (its parse fails: counted)
        (b'[{"a": 1}, {"b": ', [b'{"a": 1}', b' {"b": ']),  # a truncated file: the broken tail is one
        (b"[1] trailing", [b"1", b"<data after the closing ]> trailing"]),
        (b"[" + b"[" * 100_000 + b"]" * 100_000 + b", 2]", [b"[" * 100_000 + b"]" * 100_000, b" 2"]),
    ],
)
def test_iter_json_array_edges(text, elements):
    for chunk in (1, 5, 1 << 20):
        assert list(detect.iter_json_array(io.BytesIO(text), chunk)) == elements


def test_a_json_array_with_hostile_records_converts_the_rest(tree, tmp_path):
    src, _, _ = tree
    good = json.dumps(rec("imgs/ok.jpg"))
    deep = "[" * 100_000 + "]" * 100_000
    items = [
        good,
        deep,
        json.dumps(rec("imgs/ok.jpg", q="lone \ud800")),
        json.dumps(rec("imgs/ok.jpg\u0000")),
        json.dumps({**rec("imgs/ok.jpg"), "meta": json.loads("[" * 100 + "]" * 100)}),
        good,
    ]
    (src / "data.json").write_text("[" + ",\n".join(items) + "]")
    s = convert(src / "data.json", tmp_path / "out", workers=2, progress=False)
    assert (s.records, s.written) == (6, 2) and "JSON array of 6 records" in s.detected
    assert s.skipped == {"invalid_json": 2, "invalid_text": 1, "bad_image_ref": 1}
    assert s.examples["invalid_json"] == [
        "record 1: nested too deeply (> 64 levels)",
        "record 4: nested too deeply (> 64 levels)",
    ]


def test_json_array_memory_is_bounded_by_the_largest_record(tmp_path):
    """A 120 MB JSON array converts with far less than 120 MB of extra memory (parsed whole it took
    ~250 MB); the peak over the resident size before convert is measured in a fresh process."""
    path = tmp_path / "big.json"
    record = {"conversations": turns("q" * 3000, "a " * 1500), "id": "x" * 100}
    n = 120_000_000 // len(json.dumps(record))
    with open(path, "w") as f:
        f.write("[")
        for i in range(n):
            f.write(("," if i else "") + json.dumps({**record, "id": f"{i:09d}"}))
        f.write("]")
    script = (  # VmHWM: this process's peak (ru_maxrss would carry the forking pytest's peak across exec)
        "import sys; from energon_pack.cli.convert import convert; import webdataset, PIL.Image; "
        "kb = lambda key: int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]); "
        "base = kb('VmRSS'); "
        "s = convert(sys.argv[1], sys.argv[2], workers=0, progress=False, samples_per_shard=1000); "
        "print(s.written, kb('VmHWM') - base)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "out")], capture_output=True, text=True, check=True
    ).stdout.split()
    written, growth_kb = int(out[0]), int(out[1])
    assert written == n and path.stat().st_size > 115_000_000
    assert growth_kb < 40_000, f"peak RSS grew by {growth_kb / 1e3:.0f} MB converting a 120 MB JSON array"


def test_a_deep_record_in_a_json_object_never_reaches_the_workers(tree, tmp_path):
    """``{"data": [records]}`` is read whole; a record 900 deep parses but would not pickle to a worker."""
    src, _, _ = tree
    good = json.dumps(rec("imgs/ok.jpg"))
    (src / "data.json").write_text('{"data": [\n' + ",\n".join([good, "[" * 900 + "]" * 900, good]) + "\n]}")
    s = convert(src / "data.json", tmp_path / "out", workers=2, progress=False)
    assert (s.records, s.written, s.skipped) == (3, 2, {"invalid_json": 1})
    assert s.examples["invalid_json"] == ["record 1: nested too deeply (> 64 levels)"]


@pytest.mark.parametrize(
    "first",
    [
        b"{broken",
        b"\xff\xfe{}",
        b"[1, 2]",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"messages": "' + b"x" * (2 << 20) + b'"}',
        b"not json at all",
    ],
    ids=["broken", "not-utf8", "array", "deep", "over-1-MiB", "text"],
)
def test_a_hostile_first_line_is_one_counted_skip_not_the_files_verdict(tree, tmp_path, first):
    """The container is decided from the lines that parse, never from the first line alone."""
    src, _, _ = tree
    good = json.dumps(rec("imgs/ok.jpg")).encode()
    (src / "first.jsonl").write_bytes(first + b"\n" + good + b"\n" + good + b"\n")
    s = convert(src / "first.jsonl", tmp_path / "out", workers=0, progress=False)
    assert (s.records, s.written, s.skipped_total) == (3, 2, 1)


def test_pretty_printed_documents_are_still_read_as_json(tree, tmp_path):
    src, _, _ = tree
    records = [rec("imgs/ok.jpg")] * 3
    (src / "pretty.json").write_text(json.dumps({"data": records}, indent=2))
    (src / "array.json").write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]")
    (src / "one.json").write_text("[\n" + json.dumps(records[0]) + "\n]")
    for name in ("pretty.json", "array.json", "one.json"):
        s = convert(src / name, tmp_path / name, workers=0, progress=False)
        assert (s.written, s.skipped_total) == (3 if name != "one.json" else 1, 0), name
