"""Every README Python block marked ``<!-- runnable -->`` runs as written (against a small demo
dataset in ``demo_data/``, as after ``energon-pack demo``); the batch contract table names every
key the real batches carry. README rule: unmarked blocks are illustrative (GPUs, Bridge, a model)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MARK = "<!-- runnable -->"


def python_blocks() -> list[tuple[bool, str]]:
    """(runnable, code) for every ```python block, runnable when the line before is the marker."""
    out = []
    for m in re.finditer(r"(?m)^([^\n]*)\n```python\n(.*?)^```", README, re.S):
        out.append((m.group(1).strip() == MARK, m.group(2)))
    return out


RUNNABLE = [code for runnable, code in python_blocks() if runnable]


def test_the_rule_marks_the_energon_snippet_runnable():
    assert MARK in README and "tests/examples/test_readme_snippets.py" in README
    assert any("QwenVLPackingTaskEncoder(" in code for code in RUNNABLE)
    assert not any("my_qwen_tokenizer" in code for code in RUNNABLE)


@pytest.fixture(scope="module")
def demo_cwd(tmp_path_factory):
    from energon_pack.energon.demo_data import make_demo_shards

    cwd = tmp_path_factory.mktemp("readme")
    make_demo_shards(cwd / "demo_data", samples=200, per_shard=100)
    return cwd


@pytest.mark.parametrize("index", range(len(RUNNABLE)))
def test_runnable_block_runs_as_written(demo_cwd, index):
    script = demo_cwd / f"snippet_{index}.py"
    script.write_text(RUNNABLE[index])
    proc = subprocess.run([sys.executable, str(script)], cwd=demo_cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def contract_keys() -> set[str]:
    section = README[README.index("## The batch contract") :]
    section = section[: section.index("\n## ", 5)]
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
    outside = re.compile(r"CONTRACT\.md|ARCHITECTURE\.md|shared/reference|\.\./shared")
    hits = []
    for path in [
        ROOT / "README.md",
        *sorted((ROOT / "energon_pack").rglob("*.py")),
        *sorted((ROOT / "examples").glob("*.py")),
    ]:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if outside.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not hits, hits
