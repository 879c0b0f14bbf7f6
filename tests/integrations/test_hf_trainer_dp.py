"""Two-process data parallelism (torchrun, gloo, CPU) through transformers.Trainer on our packs.

Each rank reads its own packs (GPT-SFT: the sampler's rank; Energon: WorkerConfig rank from torch.distributed) and
Accelerate's IterableDatasetShard, which would keep every second pack of each rank's stream, is a pass-through
(PackedDataCallback): every GPT-SFT sample is trained exactly once in the epoch, every Energon pack a rank reads is
trained, and the first step's gradients equal our own step over both ranks' packs, normalised over the supervised
tokens of both (num_items_in_batch gathered across ranks).
"""

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _hf_trainer_helpers import our_step, sft_loader, tiny_text_model, write_jsonl, write_shards
from energon_pack.integrations import hf as H
from energon_pack.qwen_vl import load_demo_tokenizer

pytest.importorskip("accelerate")
TESTS = Path(__file__).parents[1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_train_every_sample_once_with_the_global_token_loss(tmp_path):
    jsonl = write_jsonl(tmp_path / "train.jsonl")
    (tmp_path / "shards").mkdir()
    shards = write_shards(tmp_path / "shards", images=False)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        str(TESTS / "_hf_dp_worker.py"),
        str(tmp_path / "out"),
        str(shards),
        str(jsonl),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]

    # GPT-SFT: each line once over both ranks (a rank's padding step trains nothing), no pack dropped
    plans = [[[int(i) + 1 for i in p] for p in sft_loader(jsonl, num_replicas=2, rank=r)[1]] for r in range(2)]
    for r in range(2):
        assert ranks[r]["sft"] == plans[r]
    trained = sorted(k for r in ranks for pack in r["sft"] for k in pack if k > 0)
    assert trained == list(range(1, 31))

    # Energon: each rank trains the packs its own loader reads, in order; the ranks' samples are disjoint
    for r in ranks:
        assert len(r["energon_direct"]) >= 3
        assert r["energon"][:3] == r["energon_direct"][:3]
    direct = [k for r in ranks for pack in r["energon_direct"] for k in pack]
    assert sorted(direct) == sorted(set(direct)) and len(direct) == 24

    # the first step: DDP's mean of both ranks' gradients == our step over both packs, global supervised tokens
    firsts = [next(iter(sft_loader(jsonl, num_replicas=2, rank=r)[0])) for r in range(2)]
    model = H.prepare_model(tiny_text_model(load_demo_tokenizer()).train())
    _, want = our_step(copy.deepcopy(model), firsts)
    got = torch.load(tmp_path / "out" / "grads.pt")
    assert sorted(got) == sorted(want)
    for key, grad in want.items():
        torch.testing.assert_close(got[key], grad, rtol=1e-4, atol=1e-6, msg=key)
