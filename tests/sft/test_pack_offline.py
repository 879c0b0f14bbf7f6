"""pack-offline: Bridge's own GPTSFTPackedParquetDataset (CPU route of _bridge_light) reads our packs
and yields exactly our tokens, labels and loss masks; the output is deterministic; bad lines are counted."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from _bridge_light import tiny_tokenizer
from _bridge_sft_light import gpt_sft_modules
from energon_pack.errors import ConfigError
from energon_pack.sft import JsonlSFTDataset
from energon_pack.sft import pack_offline as po
from energon_pack.sft.pack_offline import pack_offline, plan_packs, runtime_lengths
from energon_pack.thd import shifted_labels_and_loss_mask

pytest.importorskip("pyarrow")
EOS = 151643  # <|endoftext|> in tiny_tokenizer: what Bridge's tokenizer reports as eos_id here


def _bridge_parquet_dataset():
    """Bridge's GPTSFTPackedParquetDataset class, imported on CPU."""
    mods = gpt_sft_modules()
    if mods is None:
        pytest.skip("megatron-bridge is not installed")
    return mods.parquet.GPTSFTPackedParquetDataset


class _BridgeTokenizer:
    eos_id = eod = EOS
    bos_id = None


def _write_pc(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt": "q " * rng.randint(1, 40), "completion": "ans " * rng.randint(1, 30)}) + "\n")
        f.write("{not json\n")  # a bad line: a counted skip
        f.write(json.dumps({"prompt": "x", "completion": "y" * 900}) + "\n")  # too long for 256


def _write_chat(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            turns = []
            for _ in range(rng.randint(1, 2)):
                turns += [
                    {"role": "user", "content": "hi " * rng.randint(1, 10)},
                    {"role": "assistant", "content": "ok " * rng.randint(1, 12)},
                ]
            f.write(json.dumps({"messages": turns}) + "\n")
        f.write(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n")


def _expected(encs, multiple: int, width: int) -> dict[str, list[int]]:
    """What Bridge's collate must yield for these samples, from our own per-sample labels and loss mask."""
    out = {k: [] for k in ("tokens", "labels", "loss_mask", "position_ids")}
    cu, cu_padded = [0], [0]
    for enc in encs:
        ids = torch.as_tensor(enc.input_ids)
        labels, loss = shifted_labels_and_loss_mask(ids, torch.as_tensor(enc.target_mask))
        n = len(ids)
        span = int(runtime_lengths(np.asarray([n]), multiple)[0])
        padded = ids.tolist() + [EOS] * (span + 1 - n)
        assert loss[-1] == 0  # our last position predicts nothing: Bridge's dropped position loses no loss
        out["tokens"] += padded[:span]
        out["labels"] += padded[1 : span + 1]
        assert all(
            labels[i] == padded[i + 1] for i in range(n - 1) if loss[i]
        )  # our labels = Bridge's where supervised
        out["loss_mask"] += loss[: n - 1].long().tolist() + [0] * (span - n + 1)
        out["position_ids"] += list(range(span))
        # Bridge's logical length ends at the last non-EOS input token: a sample not ending in EOS
        # (chat) keeps its last token, label EOS and loss 0, in the logical span when alignment pads it
        real = [i for i, t in enumerate(padded[:span]) if t != EOS]
        cu.append(cu[-1] + (real[-1] + 1 if real else 0))
        cu_padded.append(cu_padded[-1] + span)
    tail = width - len(out["tokens"])
    for key, pad in (("tokens", EOS), ("labels", EOS), ("loss_mask", 0), ("position_ids", 0)):
        out[key] += [pad] * tail
    return {**out, "cu": cu, "cu_padded": cu_padded}


@pytest.mark.parametrize("fmt,multiple", [("prompt_completion", 1), ("prompt_completion", 4), ("chat", 8)])
def test_bridge_reads_our_packs_exactly(tmp_path, monkeypatch, fmt, multiple):
    monkeypatch.setattr(po, "PARALLEL_MIN_BYTES", 0)  # worker processes even for this small file
    src = tmp_path / "data.jsonl"
    (_write_pc if fmt == "prompt_completion" else _write_chat)(src, 240)
    width = 256
    summary = pack_offline(
        src,
        tmp_path / "out",
        seq_length=width,
        tokenizer=tiny_tokenizer(),
        format=fmt,
        pad_seq_to_mult=multiple,
        cache_dir=tmp_path / "cache",
        workers=2,
        row_group_size=16,
    )
    meta = json.loads(Path(summary.metadata_path).read_text())[-1]
    assert meta["energon_pack"]["supervised_eos_inputs"] == 0 and meta["energon_pack"]["pad_seq_to_mult"] == multiple
    ours = JsonlSFTDataset(
        src, tiny_tokenizer(), fmt, max_length=width + 1, cache_dir=tmp_path / "cache2", length_workers=1
    )
    packs = plan_packs(ours.lengths, width, multiple, seed=0)
    assert sorted(i for p in packs for i in p) == list(np.flatnonzero(ours.lengths > 0))  # every usable line once
    assert summary.samples == 240 and summary.packs == len(packs) and sum(summary.skips.values()) == summary.lines - 240

    cls = _bridge_parquet_dataset()
    bridge = cls(
        summary.packs_path,
        _BridgeTokenizer(),
        max_seq_length=width,
        pad_to_max_length=True,
        pad_seq_to_mult=multiple,
        pad_cu_seqlens=True,
        pack_metadata_file_path=summary.metadata_path,
        prompt_template="{input} {output}",
        label_key="output",
        truncation_field="input",
    )
    assert len(bridge) == len(packs)
    for k, pack in enumerate(packs):
        batch = bridge.collate_fn([bridge[k]])
        want = _expected([ours.encode_line(i) for i in pack], multiple, width)
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert batch[key][0].tolist() == want[key], (k, key)
        padded = batch["cu_seqlens_q_padded" if multiple > 1 else "cu_seqlens_q"][0].tolist()
        assert padded[: len(want["cu_padded"])] == want["cu_padded"]
        if multiple > 1:
            assert batch["cu_seqlens_q"][0].tolist()[: len(want["cu"])] == want["cu"]
        assert len(padded) == meta["max_samples_per_bin"] + 2  # pad_cu_seqlens: static length from our metadata


def test_same_seed_same_bytes_any_workers_and_counted_skips(tmp_path, monkeypatch):
    monkeypatch.setattr(po, "PARALLEL_MIN_BYTES", 0)
    src = tmp_path / "data.jsonl"
    _write_pc(src, 300)

    def run(out, seed, workers):
        s = pack_offline(
            src,
            tmp_path / out,
            seq_length=256,
            tokenizer=tiny_tokenizer(),
            seed=seed,
            workers=workers,
            cache_dir=tmp_path / "cache",
            row_group_size=20,
        )
        return s, hashlib.sha256(Path(s.packs_path).read_bytes()).hexdigest()

    a, ha = run("a", 3, 1)
    b, hb = run("b", 3, 2)
    c, hc = run("c", 4, 2)
    assert ha == hb and ha != hc
    assert a.skips == {"invalid_json": 1, "too_long": 1} and a.lines == 302 and a.samples == 300
    assert Path(a.metadata_path).read_text() == Path(b.metadata_path).read_text().replace("/b/", "/a/")


def test_alignment_and_width_are_checked(tmp_path):
    src = tmp_path / "data.jsonl"
    _write_pc(src, 10)
    kw = dict(tokenizer=tiny_tokenizer(), cache_dir=tmp_path / "cache")
    with pytest.raises(ConfigError, match="pad_seq_to_mult"):
        pack_offline(src, tmp_path / "o", seq_length=256, pad_seq_to_mult=2, tp=4, sp=True, **kw)  # rule: 4
    with pytest.raises(ConfigError, match="seq_length"):
        pack_offline(src, tmp_path / "o", seq_length=250, cp=2, **kw)  # rule: 4
    assert not (tmp_path / "o").exists()


def test_cli_writes_and_checks_the_packs(tmp_path, capsys):
    from energon_pack.cli import main

    src = tmp_path / "data.jsonl"
    _write_chat(src, 40)
    out, summary = tmp_path / "packs", tmp_path / "summary.json"
    assert (
        main(
            [
                "pack-offline",
                str(src),
                str(out),
                "--format",
                "chat",
                "--tokenizer",
                "demo",
                "--seq-length",
                "256",
                "--tp",
                "2",
                "--sp",
                "--split",
                "validation",
                "--json-out",
                str(summary),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "no_assistant_turn: 1" in printed and "pad_seq_to_mult=2" in printed
    entry = json.loads((out / "256_metadata.jsonl").read_text())[-1]
    assert (entry["pad_seq_to_mult"], entry["tensor_model_parallel_size"], entry["sequence_parallel"]) == (2, 2, True)
    assert entry["energon_pack"]["split"] == "validation" and (out / "validation_256.idx.parquet").is_file()
    assert json.loads(summary.read_text())["samples"] == 40
    assert not list(out.glob("*.tmp"))  # the token file and the partial parquet are gone
