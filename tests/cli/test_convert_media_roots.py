"""convert never loses data quietly: relative media found under the guessed roots (the source's folder, the
LLaMA-Factory dataset_info.json folder, the current folder) and said; exit 2 after a whole output when a media kind is
lost or more than --max-skipped-share of the records is skipped; LLaMA-Factory datasets by name
(``dataset_info.json#mllm_demo``); audio refused with its own fix; every reason convert can count in SKIP_REASONS."""

import ast
import json
import shutil
from pathlib import Path

import pytest
from test_convert import shard_members

from _video_files import video_bytes
from energon_pack.cli.convert import SKIP_REASONS, main

ROOT = Path(__file__).resolve().parents[2]
LF = ROOT / "tests" / "data" / "llamafactory"
#: what convert runs on a record: its own modules and the readers they call (conversation rules, JSON records, the
#: video probe and --layout bridge's frame plan)
CONVERT_READERS = [
    *sorted((ROOT / "energon_pack" / "cli" / "convert").glob("*.py")),
    *(
        ROOT / "energon_pack" / p
        for p in (
            "chat/conversation.py",
            "records.py",
            "video/probe.py",
            "video/decode.py",
            "video/sampling.py",
            "qwen_vl/video.py",
            "qwen_vl/vision.py",
        )
    ),
]
#: LLaMA-Factory's own entries (data/dataset_info.json)
DATASET_INFO = {
    "mllm_demo": {
        "file_name": "mllm_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    },
    "mllm_video_demo": {
        "file_name": "mllm_video_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "videos": "videos"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    },
    "alpaca_en": {"hf_hub_url": "llamafactory/alpaca_en", "ms_hub_url": "llamafactory/alpaca_en"},
}


def reason_literals(path: Path) -> set:
    """The reasons ``SampleSkipped(...)`` is raised with in ``path``: literals, both arms of a conditional, and
    f-strings over the two media kinds (``f"missing_{kind}"``)."""

    def values(node) -> set:
        if isinstance(node, ast.Constant):
            return {node.value}
        if isinstance(node, ast.IfExp):
            return values(node.body) | values(node.orelse)
        if isinstance(node, ast.JoinedStr):
            parts = ["{}" if isinstance(v, ast.FormattedValue) else v.value for v in node.values]
            return {"".join(parts).replace("{}", kind) for kind in ("image", "video")}
        return set()  # a reason passed on (skip.reason): raised where it was made

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "SampleSkipped" and node.args:
            found |= values(node.args[0])
    return found


def test_every_reason_convert_can_count_is_in_skip_reasons():
    raised = set().union(*(reason_literals(p) for p in CONVERT_READERS))
    assert {"unsupported_audio", "preference_data", "kto_undesirable", "kto_label_unreadable", "not_an_image"} <= raised
    assert sorted(raised - set(SKIP_REASONS)) == []


def chat(prompt, answer="A", **media):
    return {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}], **media}


def run(capsys, *argv):
    rc = main([*map(str, argv), "--workers", "0", "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_llamafactory_file_finds_images_under_its_dataset_info_folder(tmp_path, capsys, monkeypatch):
    """A file in a subfolder of LLaMA-Factory's data folder: its paths are relative to the data folder
    (media_dir's default), found there and counted in one line."""
    data = tmp_path / "data"
    shutil.copytree(LF / "mllm_demo_data", data / "mllm_demo_data")
    (data / "dataset_info.json").write_text(json.dumps(DATASET_INFO))
    (data / "sub").mkdir()
    shutil.copy(LF / "mllm_demo.json", data / "sub" / "mllm_demo.json")
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, data / "sub" / "mllm_demo.json", tmp_path / "out")
    assert (rc, err) == (0, "")
    assert "  records  2: written 2, skipped 0\n" in out
    assert f"  media    relative paths found (no --image-root given, roots guessed): 3 under {data}\n" in out
    assert sorted(n for n in shard_members(tmp_path / "out") if not n.endswith(".json")) == [
        "000000000.0.jpg",
        "000000000.1.jpg",
        "000000001.0.jpg",
    ]
    summary = json.loads((tmp_path / "out" / "convert_summary.json").read_text())
    assert (summary["media_roots"], summary["failed"]) == ({str(data): 3}, "")


def test_the_current_folder_is_the_last_guessed_root(tmp_path, capsys, monkeypatch):
    (tmp_path / "imgs").mkdir()
    shutil.copy(LF / "mllm_demo_data" / "1.jpg", tmp_path / "imgs" / "a.jpg")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "b.jpg").write_bytes((LF / "mllm_demo_data" / "2.jpg").read_bytes())
    records = [chat("<image>Q", image="imgs/a.jpg"), chat("<image>Q", image="b.jpg"), chat("<image>Q", image="a.jpg")]
    (tmp_path / "src" / "llava.json").write_text(json.dumps(records))
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "src/llava.json", "out", "--max-skipped-share", "0.5")
    assert (rc, err) == (0, "")
    assert "  records  3: written 2, skipped 1\n" in out
    assert "  skipped  missing_image: 1\n" in out  # a.jpg: in no root (imgs/ is not one)
    assert (
        f"  media    relative paths found (no --image-root given, roots guessed): 1 under {tmp_path / 'src'}, "
        f"1 under {tmp_path}\n"
    ) in out
    # a given --image-root is the only lookup root: no guessing, no media line
    rc, out, err = run(capsys, "src/llava.json", "out2", "--image-root", "imgs", "--max-skipped-share", "1")
    assert rc == 0 and "written 1, skipped 2" in out and "  media " not in out


def test_guessed_roots_keep_the_confinement(tmp_path, capsys, monkeypatch):
    """A relative path found under the current folder that resolves (a symlink) outside every root stays refused."""
    secret = tmp_path / "secret"
    secret.mkdir()
    shutil.copy(LF / "mllm_demo_data" / "1.jpg", secret / "s.jpg")
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "link.jpg").symlink_to(secret / "s.jpg")
    (work / "src" / "d.json").write_text(json.dumps([chat("<image>Q", image="link.jpg"), chat("Q")]))
    monkeypatch.chdir(work)
    rc, out, err = run(capsys, "src/d.json", "out", "--max-skipped-share", "1")
    assert rc == 0 and "  skipped  path_outside_root: 1\n" in out and "written 1, skipped 1" in out


def test_a_lost_media_kind_or_share_exits_2_after_a_whole_output(tmp_path, capsys):
    """LLaVA records whose images are elsewhere: half the set skipped, exit 2 naming --image-root; the output is
    written whole and loads; --max-skipped-share 1 accepts it."""
    (tmp_path / "src").mkdir()
    records = [chat("<image>Q", image=f"coco/{i}.jpg") for i in range(3)] + [chat("Q") for _ in range(3)]
    (tmp_path / "src" / "llava.json").write_text(json.dumps(records))
    rc, out, err = run(capsys, tmp_path / "src" / "llava.json", tmp_path / "out")
    assert rc == 2 and "  records  6: written 3, skipped 3\n" in out
    assert err == (
        "energon-pack convert: error: 3 of 6 records skipped (missing_image: 3): every image record was skipped "
        "(3 missing_image, 0 images written); 50.0% of the records were skipped, over --max-skipped-share 0.1. "
        "Fix: pass --image-root DIR, the folder the relative image paths are relative to, or accept the loss with "
        f"--max-skipped-share 1 (the 3 written records in {tmp_path / 'out'} are a valid dataset)\n"
    )
    assert len(list((tmp_path / "out").glob("data-*.tar"))) == 1 and (tmp_path / "out" / ".nv-meta").is_dir()
    assert json.loads((tmp_path / "out" / "convert_summary.json").read_text())["failed"] == err[29:-1]
    rc, out, err = run(capsys, tmp_path / "src" / "llava.json", tmp_path / "ok", "--max-skipped-share", "1")
    assert (rc, err) == (0, "") and "written 3, skipped 3" in out


def test_every_video_missing_exits_2_under_the_share(tmp_path, capsys):
    """1 skip in 20 records (5%, under 0.1), but it was the only video record: a whole kind lost."""
    (tmp_path / "src").mkdir()
    records = [chat("<video>Q", video="clips/v.mp4")] + [chat("Q") for _ in range(19)]
    (tmp_path / "src" / "d.json").write_text(json.dumps(records))
    rc, out, err = run(capsys, tmp_path / "src" / "d.json", tmp_path / "out")
    assert rc == 2 and "written 19, skipped 1" in out
    assert err.startswith(
        "energon-pack convert: error: 1 of 20 records skipped (missing_video: 1): every video record was skipped "
        "(1 missing_video, 0 videos written). Fix: pass --image-root DIR, the folder the relative video paths are "
        "relative to, or accept"
    )
    rc, _, err = run(capsys, tmp_path / "src" / "d.json", tmp_path / "out2", "--max-skipped-share", "1")
    assert (rc, err) == (0, "")
    rc, _, err = run(capsys, tmp_path / "src" / "d.json", tmp_path / "out3", "--max-skipped-share", "1.5")
    assert rc == 2 and err == (
        "energon-pack convert: error: max_skipped_share: must be a share from 0 to 1, got 1.5. Fix: pass e.g. 0.1 "
        "(1 accepts any loss)\n"
    )


def test_audio_records_get_the_audio_fix(tmp_path, capsys):
    """LLaMA-Factory's mllm_audio_demo shape: refused as audio, with audio's fix (not --image-root)."""
    rec = {
        "messages": [{"role": "user", "content": "<audio>What is it?"}, {"role": "assistant", "content": "Rain."}],
        "audios": ["mllm_demo_data/1.mp3"],
    }
    (tmp_path / "audio.json").write_text(json.dumps([rec, rec]))
    rc, out, err = run(capsys, tmp_path / "audio.json", tmp_path / "out")
    assert (rc, out) == (2, "")
    assert err.startswith("energon-pack convert: error: source: none of the 2 records of ")
    assert err.endswith(
        "Fix: audio is not trained here (images, videos and text are): drop the audio records, or train them with "
        "an audio-capable pipeline\n"
    )
    assert "image-root" not in err


def write_llamafactory_data(data: Path, tmp_path: Path) -> None:
    """LLaMA-Factory's data folder as it ships: dataset_info.json, mllm_demo.json, mllm_video_demo.json and the media
    under mllm_demo_data/."""
    shutil.copytree(LF / "mllm_demo_data", data / "mllm_demo_data")
    shutil.copy(LF / "mllm_demo.json", data / "mllm_demo.json")
    (data / "mllm_demo_data" / "1.mp4").write_bytes(video_bytes(8, 4, 64, 48, tmp_path))
    video = {
        "messages": [
            {"content": "<video>Why is this video funny?", "role": "user"},
            {"content": "Because a baby is reading, and he is so cute!", "role": "assistant"},
        ],
        "videos": ["mllm_demo_data/1.mp4"],
    }
    (data / "mllm_video_demo.json").write_text(json.dumps([video]))
    (data / "dataset_info.json").write_text(json.dumps(DATASET_INFO))


def test_llamafactory_mllm_demos_convert_by_name(tmp_path, capsys, monkeypatch):
    data = tmp_path / "LLaMA-Factory" / "data"
    write_llamafactory_data(data, tmp_path)
    monkeypatch.chdir(tmp_path)  # not the data folder: its paths resolve against dataset_info.json's folder
    rc, out, err = run(capsys, "LLaMA-Factory/data/dataset_info.json#mllm_demo", "img")
    assert (rc, err) == (0, "")
    assert "  input    LLaMA-Factory dataset mllm_demo (dataset_info.json): sharegpt (JSON array of 2 records" in out
    assert "  records  2: written 2, skipped 0\n" in out
    members = shard_members(tmp_path / "img")
    assert members["000000000.0.jpg"] == (LF / "mllm_demo_data" / "1.jpg").read_bytes()
    assert members["000000001.0.jpg"] == (LF / "mllm_demo_data" / "2.jpg").read_bytes()
    assert json.loads(members["000000001.json"]) == {
        "conversations": [
            {"from": "human", "value": "<image>Please describe this image"},
            {"from": "gpt", "value": json.loads((LF / "mllm_demo.json").read_text())[1]["messages"][1]["content"]},
        ]
    }
    rc, out, err = run(capsys, "LLaMA-Factory/data/dataset_info.json#mllm_video_demo", "vid")
    assert (rc, err) == (0, "")
    assert "  records  1: written 1, skipped 0\n" in out and "1 video(s)" in out
    members = shard_members(tmp_path / "vid")
    assert sorted(members) == ["000000000.0.mp4", "000000000.json"]
    assert members["000000000.0.mp4"] == (data / "mllm_demo_data" / "1.mp4").read_bytes()
    assert json.loads(members["000000000.json"])["conversations"][0] == {
        "from": "human",
        "value": "<video>Why is this video funny?",
    }


@pytest.mark.parametrize(
    "ref, problem, fix",
    [
        (
            "dataset_info.json#nope",
            "no dataset named 'nope' in {info} (alpaca_en, mllm_demo, mllm_video_demo)",
            "pass {info}#NAME with NAME one of its entries",
        ),
        (
            "dataset_info.json",
            "{info} names 3 dataset(s) (alpaca_en, mllm_demo, mllm_video_demo)",
            "pass {info}#NAME with NAME one of its entries",
        ),
        (
            "dataset_info.json#alpaca_en",
            "{info}#alpaca_en has no file_name (it is read from hf_hub_url: llamafactory/alpaca_en)",
            "download the data and convert its local file (convert never downloads)",
        ),
    ],
)
def test_dataset_info_refusals_name_the_fix(tmp_path, capsys, ref, problem, fix):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset_info.json").write_text(json.dumps(DATASET_INFO))
    info = data / "dataset_info.json"
    rc, out, err = run(capsys, f"{data}/{ref}", tmp_path / "out")
    assert (rc, out) == (2, "")
    assert err == f"energon-pack convert: error: source: {problem.format(info=info)}. Fix: {fix.format(info=info)}\n"
