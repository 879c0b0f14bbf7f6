"""convert and the loader agree by construction: every converted fixture (LLaVA, ShareGPT, OpenAI
messages with tool calls, LLaMA-Factory ShareGPT tool calls, alpaca with history and images, LLaMA-
Factory mllm, a file of mixed bad records) streams through the real Energon loader (2 worker
processes) with ``written == delivered + counted loader skips``, no AllSkippedError; convert's
skips carry the loader's reason names; tool calls are in the loss under Qwen3-VL. Also: relative
images missing without ``--image-root`` are called out in one line (the CLI, in a subprocess)."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_convert import image
from test_tool_calls import load

from energon_pack.chat import load_demo_tokenizer_raw
from energon_pack.cli.convert import convert
from energon_pack.errors import all_skipped_fix
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

HERE = Path(__file__).resolve().parents[1]  # tests/
LF = HERE / "data" / "llamafactory"
RAW = load_demo_tokenizer_raw()


def stream(out, preset="qwen3-vl", workers=2):
    """One finite pass: {key: (decoded ids, decoded supervised tokens)}, loader skips. (A worker whose
    whole share is skipped emits no batch, so its skips reach no batch's stats: it only warns.)"""
    segments, skips = load(out, QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=2048), workers)
    return {key: tuple(RAW.decode(x, skip_special_tokens=False) for x in pair) for key, pair in segments.items()}, skips


def convert_and_stream(source, out, preset="qwen3-vl", samples_per_shard=3):
    summary = convert(source, out, workers=2, samples_per_shard=samples_per_shard, progress=False)
    segments, loader_skips = stream(out, preset)
    assert summary.written + summary.skipped_total == summary.records
    assert summary.written == len(segments) + sum(loader_skips.values())  # the agreement, exactly
    return summary, segments, loader_skips


@pytest.fixture(scope="module")
def plain_sources(tmp_path_factory):
    """LLaVA JSON, ShareGPT JSONL and OpenAI-messages JSONL (with tool calls) sharing one image folder."""
    root = tmp_path_factory.mktemp("plain")
    (root / "imgs").mkdir()
    for i in range(3):
        (root / "imgs" / f"{i}.jpg").write_bytes(image("JPEG", 32 + 8 * i, 28, i))
    llava = [
        {
            "id": f"l{i}",
            "image": f"imgs/{i}.jpg",
            "conversations": [
                {"from": "human", "value": f"<image>\nWhat is {i}?"},
                {"from": "gpt", "value": f"Thing {i}."},
            ],
        }
        for i in range(3)
    ]
    (root / "llava.json").write_text(json.dumps(llava))
    sharegpt = [
        {
            "conversations": [
                {"from": "system", "value": "Be terse."},
                {"from": "human", "value": f"Q{i}"},
                {"from": "gpt", "value": f"A{i}"},
            ],
            "images": [],
        }
        for i in range(4)
    ]
    (root / "sharegpt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sharegpt))
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {
            "messages": [
                {"role": "user", "content": "<image>Where? Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "sunny"},
                {"role": "assistant", "content": "Paris, sunny."},
            ],
            "tools": tools,
            "images": ["imgs/0.jpg"],
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": "imgs/1.jpg"}, {"type": "text", "text": "Colour?"}],
                },
                {"role": "assistant", "content": "Noise."},
            ]
        },
    ]
    (root / "messages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in messages))
    return root


@pytest.mark.parametrize("name, written", [("llava.json", 3), ("sharegpt.jsonl", 4), ("messages.jsonl", 2)])
def test_plain_formats_stream_everything_they_write(plain_sources, tmp_path, name, written):
    summary, segments, loader_skips = convert_and_stream(plain_sources / name, tmp_path / "out")
    assert summary.written == written and summary.skipped == {} and loader_skips == {}
    assert len(segments) == written


def test_llamafactory_tool_calls_stream_with_the_calls_in_the_loss(tmp_path):
    summary, segments, loader_skips = convert_and_stream(LF / "glaive_toolcall_demo.json", tmp_path / "out")
    assert summary.format == "sharegpt" and summary.written == 3 and summary.skipped == {} and loader_skips == {}
    texts = dict(segments.values())
    with_tools = [t for t in texts if t.startswith("<|im_start|>system\n")]
    assert len(with_tools) == 2
    one = next(t for t in with_tools if "search_recipes" in t)
    assert texts[one] == (
        '<tool_call>\n{"name": "search_recipes", "arguments": {"ingredients": ["chicken", '
        '"bell peppers", "rice"]}}\n</tool_call><|im_end|>Try a Chicken and Bell Pepper Stir Fry.<|im_end|>'
    )
    assert (
        '<|im_start|>user\n<tool_response>\n{"recipes": [{"name": "Chicken and Bell Pepper Stir Fry"}]}\n'
        "</tool_response><|im_end|>" in one
    )
    assert '\n{"type": "function", "function": {"name": "search_recipes", ' in one  # the signature, wrapped
    two = next(t for t in with_tools if "convert_currency" in t)
    assert two.startswith("<|im_start|>system\nYou are a currency assistant.\n\n# Tools")  # the top-level system
    assert texts[two].count("<tool_call>") == 2 and texts[two].endswith(
        "</tool_call><|im_end|>100 USD is 92.5 EUR.<|im_end|>"
    )
    assert not any(role in t for t in texts for role in ("<|im_start|>function_call", "<|im_start|>observation"))
    # the Qwen2.5-VL template has no tool handling: the two tool chats are counted loader skips (one
    # worker: with two, the worker holding only a tool chat emits no batch to carry its count)
    segments, loader_skips = stream(tmp_path / "out", "qwen2.5-vl", workers=1)
    assert loader_skips == {"tool_calls_unsupported": 2} and len(segments) == 1
    # were they all tool chats, the all-skipped message names the preset that renders them
    assert all_skipped_fix({"tool_calls_unsupported": 2}, too_long="", mismatch="").startswith(
        "the Qwen2-VL / Qwen2.5-VL templates have no tool handling: use the qwen3-vl preset (--preset qwen3-vl"
    )


def test_alpaca_with_history_and_images(tmp_path):
    summary, segments, loader_skips = convert_and_stream(LF / "alpaca_demo.json", tmp_path / "out")
    assert summary.format == "alpaca" and summary.detected == "alpaca (JSON array of 4 records, auto-detected)"
    assert summary.written == 4 and summary.images == 3 and summary.skipped == {} and loader_skips == {}
    texts = {t: trained for t, trained in segments.values()}
    history = next(t for t in texts if "Add the two numbers." in t)
    assert history == (
        "<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\nWhat is 1 and 1?<|im_end|>\n"
        "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\nAnd 2 and 2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAdd the two numbers.\n2 and 3<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n"
    )
    assert texts[history] == "2<|im_end|>4<|im_end|>5<|im_end|>"
    two = next(t for t in texts if "Compare the two pictures." in t)
    assert two.count("<|vision_start|>") == 2 and "Compare the two pictures.\n<|vision_start|>" in two
    written = json.loads(next(iter(_members(tmp_path / "out", ".json"))))
    assert set(written) == {"messages"}  # alpaca fields became turns


def test_llamafactory_mllm_messages(tmp_path):
    summary, segments, loader_skips = convert_and_stream(LF / "mllm_demo.json", tmp_path / "out")
    assert summary.format == "messages" and summary.written == 2 and summary.images == 3 and loader_skips == {}


def test_alpaca_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pic = image("JPEG", 36, 30, 7)
    rows = [
        {
            "instruction": "What is shown?",
            "input": "<image>",
            "output": "Noise.",
            "system": None,
            "history": [],
            "images": [{"bytes": pic, "path": "a.jpg"}],
        },
        {
            "instruction": "And now?",
            "input": "",
            "output": "Still noise.",
            "system": "Be brief.",
            "history": [["Hi", "Hello."]],
            "images": [],
        },
        {"instruction": "No answer", "input": "", "output": None, "system": None, "history": [], "images": []},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "alpaca.parquet")
    summary, segments, loader_skips = convert_and_stream(tmp_path / "alpaca.parquet", tmp_path / "out")
    assert summary.detected.endswith(
        "conversation column 'instruction', image column 'images' (list<element: struct<bytes: binary, path: string>>))"
    )
    assert (summary.written, summary.images, summary.skipped, loader_skips) == (2, 1, {"no_assistant_turn": 1}, {})
    texts = sorted(t for t, _ in segments.values())
    assert texts[0].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>")
    assert "What is shown?\n<|vision_start|>" in texts[1]


def _members(out, suffix):
    import tarfile

    for shard in sorted(Path(out).glob("data-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(suffix):
                    yield tar.extractfile(m).read()


def test_mixed_bad_records_convert_skips_and_loader_skips_add_up(tmp_path):
    (tmp_path / "a.jpg").write_bytes(image("JPEG"))

    def chat(q="Q", a="A", **extra):
        return {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}], **extra}

    # one shard of 4 written records, so each of the 2 loader workers delivers one (a worker that skips
    # its whole share emits no batch, and its skips reach no stats: it warns instead)
    lines = [
        json.dumps(chat()),
        json.dumps(chat("Q <|im_start|> typed", "A")),  # convert cannot see tokens: a loader skip
        json.dumps({"conversations": [{"from": "human", "value": "Q"}, {"from": "bot", "value": "A"}]}),
        json.dumps(
            {
                "conversations": [
                    {"from": "human", "value": "Q"},
                    {"from": "function_call", "value": "{oops"},
                    {"from": "gpt", "value": "A"},
                ]
            }
        ),
        json.dumps(chat(tools="{not json")),
        json.dumps({"conversations": [{"from": "human", "value": "only a question"}]}),
        json.dumps({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": ""}]}),
        json.dumps(chat("<image><image>Q", images=["a.jpg"])),
        json.dumps(chat("<image>Q", images=["gone.jpg"])),
        "{broken json",
        json.dumps(chat("<image>Q", images=["a.jpg"])),
        json.dumps(chat("<image>" * 11 + "Q", images=["a.jpg"] * 11)),  # over max_num_images=10: a loader skip
    ]
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    summary, segments, loader_skips = convert_and_stream(
        tmp_path / "mixed.jsonl", tmp_path / "out", samples_per_shard=20
    )
    assert summary.skipped == {
        "bad_conversation": 2,
        "empty_assistant_turn": 1,
        "invalid_json": 1,
        "media_count_mismatch": 1,
        "missing_image": 1,
        "no_assistant_turn": 1,
        "unknown_role": 1,
    }
    assert summary.shards == 1 and summary.examples["unknown_role"] == [
        "line 3: turn 1 has role 'bot'; known: assistant, function_call, gpt, human, observation, system, tool, user"
    ]
    assert summary.written == 4 and len(segments) == 2
    assert loader_skips == {"control_token_in_text": 1, "too_many_images": 1}
    assert summary.hints == [
        f"1 record(s) skipped as missing_image: their relative image paths were looked up in "
        f"{tmp_path}, {os.getcwd()} (the roots guessed without --image-root); pass --image-root DIR, the folder they "
        "are relative to"
    ]


def test_missing_image_root_is_called_out_at_the_cli(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "media" / "imgs").mkdir(parents=True)
    (tmp_path / "media" / "imgs" / "a.jpg").write_bytes(image("JPEG"))
    records = [
        {
            "image": "imgs/a.jpg",
            "conversations": [{"from": "human", "value": "<image>Q"}, {"from": "gpt", "value": "A"}],
        }
    ] * 3
    src = tmp_path / "data" / "llava.json"

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "energon_pack.cli", "convert", *args, "--no-progress", "--workers", "0"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,  # the last guessed root: imgs/a.jpg is not there either
        )

    src.write_text(json.dumps(records))
    proc = run(str(src), str(tmp_path / "out"))  # every record skipped: exit 2, one line naming the flag
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.rstrip().endswith(
        f"Fix: 3 record(s) skipped as missing_image: their relative image paths were looked up in {tmp_path / 'data'}, "
        f"{tmp_path} (the roots guessed without --image-root); pass --image-root DIR, the folder they are relative to"
    )
    src.write_text(
        json.dumps(records + [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}])
    )
    proc = run(str(src), str(tmp_path / "out"))  # partly written, every image lost: the hint line, then exit 2
    assert proc.returncode == 2
    assert (
        "  hint     3 record(s) skipped as missing_image: their relative image paths were looked up in "
        f"{tmp_path / 'data'}, {tmp_path} (the roots guessed without --image-root); pass --image-root DIR, the folder "
        "they are relative to\n"
    ) in proc.stdout
    assert proc.stderr == (
        "energon-pack convert: error: 3 of 4 records skipped (missing_image: 3): every image record was skipped "
        "(3 missing_image, 0 images written); 75.0% of the records were skipped, over --max-skipped-share 0.1. "
        "Fix: pass --image-root DIR, the folder the relative image paths are relative to, or accept the loss with "
        f"--max-skipped-share 1 (the 1 written records in {tmp_path / 'out'} are a valid dataset)\n"
    )
    proc = run(str(src), str(tmp_path / "out2"), "--image-root", str(tmp_path / "media"))
    assert proc.returncode == 0 and "written 4, skipped 0" in proc.stdout and "hint" not in proc.stdout
    wrong = convert(src, tmp_path / "out3", image_root=tmp_path, progress=False, workers=0)
    assert wrong.skipped == {"missing_image": 3} and wrong.hints == []  # a given root: no hint to pass one


def test_readme_llamafactory_blocks_run_as_written(tmp_path):
    """The data guide's LLaMA-Factory commands and streaming snippet (docs/guides/your_data.md), on our files
    under LLaMA-Factory's names."""
    from _docs import block_after_marker

    marker = "<!-- tested: tests/cli/test_convert_loader_agree.py"
    bash = block_after_marker("docs/guides/your_data.md", marker, "bash")
    python = block_after_marker("docs/guides/your_data.md", marker, "python")
    shutil.copy(LF / "alpaca_demo.json", tmp_path / "alpaca_en_demo.json")
    shutil.copy(LF / "glaive_toolcall_demo.json", tmp_path / "glaive_toolcall_en_demo.json")
    shutil.copytree(LF / "mllm_demo_data", tmp_path / "mllm_demo_data")
    commands = [shlex.split(line.split("#")[0]) for line in bash.splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["energon-pack", "convert"]] * 2
    for command in commands:
        proc = subprocess.run(
            [sys.executable, "-m", "energon_pack.cli", *command[1:], "--no-progress"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0 and "skipped 0" in proc.stdout, proc.stderr
    (tmp_path / "snippet.py").write_text(python)
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "<tool_call> tokens in the loss: 3"
