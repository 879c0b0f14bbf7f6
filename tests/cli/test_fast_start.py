"""``energon-pack --help`` and ``energon-pack convert`` start without the heavy imports (torch, numba,
transformers, PyAV, pyarrow, Megatron-Energon): each runs in a fresh interpreter that then lists what it
loaded. Parquet input needs pyarrow (and only that); images need PIL (and not torch)."""

import json
import subprocess
import sys

import pytest

from _cli_entry import ROOT

HEAVY = ("torch", "numba", "transformers", "av", "pyarrow", "megatron.energon", "webdataset")

PROBE = """
import contextlib, io, json, sys
from energon_pack.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        rc = main(json.loads(sys.argv[1]))
    except SystemExit as exc:
        rc = exc.code
heavy = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)
print(json.dumps({"rc": rc, "out": out.getvalue(), "heavy": heavy}))
"""


def run_fresh(args: list[str]) -> dict:
    """``main(args)`` in a new interpreter: its exit status, its stdout and the heavy modules it imported."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def turns(i: int, image: bool = False) -> list:
    return [
        {"from": "human", "value": ("<image>\n" if image else "") + f"question {i}"},
        {"from": "gpt", "value": f"answer {i}"},
    ]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    root = tmp_path_factory.mktemp("fast_start")
    (root / "text.json").write_text(json.dumps([{"id": str(i), "conversations": turns(i)} for i in range(10)]))
    Image.new("RGB", (32, 24), (200, 10, 10)).save(root / "a.png")
    records = [{"id": str(i), "image": "a.png", "conversations": turns(i, image=True)} for i in range(10)]
    (root / "images.json").write_text(json.dumps(records))
    png = (root / "a.png").read_bytes()
    messages = [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "yo"}]
    pq.write_table(
        pa.table({"messages": [messages] * 10, "images": [[{"bytes": png, "path": "a.png"}]] * 10}),
        root / "data.parquet",
    )
    return root


def test_help_imports_nothing_heavy():
    result = run_fresh(["--help"])
    assert result["rc"] == 0 and "convert" in result["out"] and result["heavy"] == []


@pytest.mark.parametrize(
    "source,allowed,images",
    [("text.json", [], 0), ("images.json", [], 10), ("data.parquet", ["pyarrow"], 10)],
)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_convert_imports_nothing_heavy(sources, tmp_path, source, allowed, images, workers):
    """In this process (--workers 0: the records are converted here too) and with a worker pool."""
    out = tmp_path / "out"
    result = run_fresh(["convert", str(sources / source), str(out), "--workers", workers, "--no-progress", "--json"])
    assert result["rc"] == 0
    summary = json.loads(result["out"])
    assert (summary["written"], summary["images"], summary["shards"]) == (10, images, 1)
    assert result["heavy"] == allowed
    assert json.loads((out / ".nv-meta" / ".info.json").read_text())["shard_counts"] == {"data-000000.tar": 10}
    assert (out / "data-000000.tar.idx").stat().st_size == 8 * 11  # 10 sample offsets and the end


def test_training_imports_need_no_pyav():
    """The encoder and the HF integration import with PyAV blocked (a GPU image without it trains image data);
    PyAV loads where a video is read."""
    code = (
        "import sys; sys.modules['av'] = None\n"
        "from energon_pack import QwenVLPackingTaskEncoder, hf_forward_kwargs, packed_loss\n"
        "import energon_pack.integrations.hf, energon_pack.video\n"
        "print('imported')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "imported", proc.stderr[-2000:]
