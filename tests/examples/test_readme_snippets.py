"""Every Python block of the README and the docs pages marked ``<!-- runnable -->`` runs as written, in a
temporary folder (never the repository root) holding a small demo dataset in ``demo_data/``; the README's first
road also runs in an empty folder, where it writes the demo data itself; the batch contract
table names every key the real batches carry. The docs' rule: unmarked blocks are illustrative (GPUs,
Bridge, a model)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from _docs import doc_section, fenced_blocks, markdown_pages

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MARK = "<!-- runnable -->"
CONTRACT = "docs/concepts/batch_contract.md"


def python_blocks() -> list[tuple[str, bool, str]]:
    """(page, runnable, code) for every ```python block of the README and the docs pages, runnable when
    the line before is the marker."""
    return [
        (page.relative_to(ROOT).as_posix(), before == MARK, code)
        for page in markdown_pages()
        for before, code in fenced_blocks(page.read_text(), "python")
    ]


#: each runnable block once (the README repeats some of the guides' blocks verbatim), with where it is
RUNNABLE = list({code: page for page, runnable, code in python_blocks() if runnable}.items())


def test_the_rule_marks_the_energon_snippet_runnable():
    assert MARK in README and "tests/examples/test_readme_snippets.py" in README
    assert any("QwenVLPackingTaskEncoder(" in code for code, _ in RUNNABLE)
    assert any(page.startswith("docs/") for _, page in RUNNABLE)
    assert not any("my_qwen_tokenizer" in code for code, _ in RUNNABLE)


@pytest.fixture(scope="module")
def demo_cwd(tmp_path_factory):
    from energon_pack.energon.demo_data import make_demo_shards

    cwd = tmp_path_factory.mktemp("readme")
    make_demo_shards(cwd / "demo_data", samples=200, per_shard=100)
    return cwd


@pytest.mark.parametrize("index", range(len(RUNNABLE)), ids=[f"{page}-{i}" for i, (_, page) in enumerate(RUNNABLE)])
def test_runnable_block_runs_as_written(demo_cwd, index):
    script = demo_cwd / f"snippet_{index}.py"
    script.write_text(RUNNABLE[index][0])
    proc = subprocess.run([sys.executable, str(script)], cwd=demo_cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_road_1_runs_in_an_empty_folder_and_says_what_it_packed(tmp_path):
    """A user's first script, saved anywhere: no demo data there yet, no repository around it."""
    road_1 = next(code for code, _ in RUNNABLE if "get_savable_loader(dataset)" in code)
    (tmp_path / "road_1.py").write_text(road_1)
    proc = subprocess.run([sys.executable, "road_1.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"pack {i}" for i in range(5)]
    for line in lines:
        assert re.fullmatch(r"pack \d: \d+ samples, \d+ of 8192 tokens", line), line
        assert 8000 <= int(line.split()[4]) <= 8192  # full packs (the demo data fill ~99%)
    assert (tmp_path / "demo_data" / ".nv-meta" / "dataset.yaml").is_file()
    assert len(list((tmp_path / "demo_data").glob("demo-*.tar"))) == 2  # 200 samples, 100 per shard


def contract_keys() -> set[str]:
    section = doc_section(CONTRACT, "Keys")
    keys = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


def test_contract_names_every_key_of_real_batches(demo_shards):
    import json
    import tempfile

    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from energon_pack.chat.tokenizer import load_demo_tokenizer
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
    from energon_pack.sft import InBatchPacker, JsonlSFTDataset, TokenBudgetBatchSampler

    keys = contract_keys()
    te = QwenVLPackingTaskEncoder(tokenizer=load_demo_tokenizer(), seq_length=4096)
    ds = get_train_dataset(
        str(demo_shards),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=16,
    )
    batch = next(iter(get_savable_loader(ds)))
    assert set(batch) <= keys, set(batch) - keys

    path = Path(tempfile.mkdtemp()) / "a.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q {i}", "completion": "an answer"}) + "\n" for i in range(20)))
    sft = JsonlSFTDataset(path, load_demo_tokenizer())
    sampler = TokenBudgetBatchSampler(sft.lengths, 256)
    row = InBatchPacker.for_dataset(sft, 256)([sft[i] for i in next(iter(sampler))])
    assert set(row) <= keys, set(row) - keys
    assert {"padding_mask", "packing_stats", "padding_segments", "cu_seqlens_q_padded", "__restore_key__"} <= keys


def test_docstrings_and_readme_cite_only_files_in_the_repository():
    """The project's docs stand alone: no citation of the planning notes outside the repository."""
    outside = re.compile(r"CONTRACT\.md|ARCHITECTURE\.md|shared/reference|\.\./shared|/work/notes")
    hits = []
    for path in [
        *markdown_pages(),
        *sorted((ROOT / "energon_pack").rglob("*.py")),
        *sorted((ROOT / "examples").glob("*.py")),
    ]:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if outside.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not hits, hits
