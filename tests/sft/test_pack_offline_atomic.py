"""pack-offline's output is whole or absent: a finished output is refused without overwrite, a failed, killed or
concurrent run leaves the old Parquet and metadata byte for byte (never one run's Parquet beside another's
metadata), other splits are kept, and a malformed old metadata file is one clear error."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_pack_offline import _write_pc

from _bridge_light import tiny_tokenizer
from energon_pack.errors import AllSkippedError, ConfigError
from energon_pack.sft import pack_offline as po
from energon_pack.sft import staged_output as so
from energon_pack.sft.pack_offline import pack_offline

pytest.importorskip("pyarrow")
ROOT = Path(__file__).resolve().parents[2]


def _run(src: Path, out: Path, tmp_path: Path, **kw):
    return pack_offline(src, out, seq_length=256, tokenizer=tiny_tokenizer(), cache_dir=tmp_path / "cache", **kw)


def _digest(out: Path) -> dict[str, str]:
    """Every file of the output folder (hidden ones too) -> sha256 of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


def _siblings(out: Path) -> list[str]:
    """What lies beside the output folder, apart from the source, the cache and the (empty) lock file."""
    return sorted(p.name for p in out.parent.iterdir() if p.name not in {"data.jsonl", "other.jsonl", "cache"})


@pytest.fixture
def first(tmp_path):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 60)
    _run(src, out, tmp_path, seed=1)
    return src, out, _digest(out)


def test_a_finished_output_is_refused_unless_overwrite_and_other_splits_are_kept(tmp_path, first):
    src, out, before = first
    with pytest.raises(ConfigError) as err:
        _run(src, out, tmp_path, seed=2)
    assert err.value.knob == "overwrite" and "training_256.idx.parquet" in str(err.value)
    assert _digest(out) == before
    other = tmp_path / "other.jsonl"
    _write_pc(other, 30, seed=5)
    _run(other, out, tmp_path, split="validation")  # another split: added, the training split kept
    entries = json.loads((out / "256_metadata.jsonl").read_text())
    assert [e["energon_pack"]["split"] for e in entries] == ["training", "validation"]
    assert _digest(out)["training_256.idx.parquet"] == before["training_256.idx.parquet"]
    s = _run(src, out, tmp_path, seed=2, overwrite=True)
    after = _digest(out)
    assert after["training_256.idx.parquet"] != before["training_256.idx.parquet"]
    entries = json.loads((out / "256_metadata.jsonl").read_text())
    assert [(e["energon_pack"]["split"], e["energon_pack"]["seed"]) for e in entries] == [
        ("validation", 0),
        ("training", 2),
    ]
    assert s.packs_path == str(out / "training_256.idx.parquet")
    assert sorted(after) == ["256_metadata.jsonl", "training_256.idx.parquet", "validation_256.idx.parquet"]
    assert _siblings(out) == [".packs.lock", "packs"]  # no staging folder, no temporary file left


def test_a_failing_run_leaves_the_old_output_and_nothing_else(tmp_path, first, monkeypatch):
    src, out, before = first

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(po, "pack_rows", broken)
    with pytest.raises(OSError, match="disk full"):
        _run(src, out, tmp_path, seed=2, overwrite=True)
    assert _digest(out) == before and _siblings(out) == [".packs.lock", "packs"]
    fresh = tmp_path / "fresh"
    with pytest.raises(OSError):
        _run(src, fresh, tmp_path)
    assert not fresh.exists()


def test_an_all_skipped_run_leaves_no_folder(tmp_path):
    src = tmp_path / "data.jsonl"
    src.write_text('{"prompt": "x", "completion": "' + "y" * 900 + '"}\n')
    with pytest.raises(AllSkippedError):
        _run(src, tmp_path / "packs", tmp_path)
    assert not (tmp_path / "packs").exists()


@pytest.mark.parametrize("text", ["{not json", '{"a": 1}', '[{"energon_pack": {"split": "x"}}, [1, 2]]'])
def test_a_malformed_old_metadata_file_is_one_clear_error(tmp_path, text):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 10)
    out.mkdir()
    (out / "256_metadata.jsonl").write_text(text)
    for overwrite in (False, True):
        with pytest.raises(ConfigError) as err:
            _run(src, out, tmp_path, overwrite=overwrite)
        assert err.value.knob == "out" and "256_metadata.jsonl is not a packing-metadata" in str(err.value)
    assert [p.name for p in out.iterdir()] == ["256_metadata.jsonl"]


def _cli(src: Path, out: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENERGON_PACK_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "energon_pack.cli", "pack-offline", str(src), str(out), "--tokenizer", "demo"]
    return subprocess.run(
        [*cmd, "--seq-length", "256", *extra], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )


def test_a_second_process_is_refused_while_one_writes(tmp_path):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 10)
    with so.staged_output(out) as stage:  # this process writes: the lock is held
        second = _cli(src, out, tmp_path)
        assert second.returncode == 2, second.stderr
        assert "another run is writing" in second.stderr and len(second.stderr.strip().splitlines()) == 1
        (stage / "note.txt").write_text("ours")
    assert [p.name for p in out.iterdir()] == ["note.txt"]  # only the first writer's output


_KILLED = """
import os, signal, sys
from energon_pack.sft import staged_output as so
from energon_pack.sft.pack_offline import pack_offline
from _bridge_light import tiny_tokenizer
where = sys.argv[3]
if where == "before_swap":  # both new files are written (staged), the swap has not happened
    so._swap_in = lambda stage, out: os.kill(os.getpid(), signal.SIGKILL)
else:  # no atomic exchange: killed between moving the old folder aside and moving the new one in
    so._exchange = lambda a, b: False
    real = os.rename
    def rename(a, b, _n=[0]):
        real(a, b)
        _n[0] += 1
        if _n[0] == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    so.os.rename = rename
pack_offline(sys.argv[1], sys.argv[2], seq_length=256, tokenizer=tiny_tokenizer(), seed=9, overwrite=True,
             cache_dir=sys.argv[4])
"""


@pytest.mark.parametrize("where", ["before_swap", "between_renames"])
def test_a_killed_run_leaves_the_old_output_and_the_next_run_cleans_up(tmp_path, first, where):
    src, out, before = first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    code = textwrap.dedent(_KILLED)
    killed = subprocess.run(
        [sys.executable, "-c", code, str(src), str(out), where, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    if where == "between_renames":
        assert not out.exists() and any(".old-" in name for name in _siblings(out) if name != "packs")
    else:
        assert _digest(out) == before and any(".staging-" in name for name in _siblings(out))
    again = _run(src, out, tmp_path, seed=9, overwrite=True)  # recovers the old folder, then replaces it whole
    assert again.packs == json.loads((out / "256_metadata.jsonl").read_text())[-1]["energon_pack"]["packs"]
    assert _siblings(out) == [".packs.lock", "packs"]


def test_without_an_atomic_exchange_the_two_renames_still_give_a_whole_output(tmp_path, first, monkeypatch):
    src, out, before = first
    monkeypatch.setattr(so, "_exchange", lambda a, b: False)
    _run(src, out, tmp_path, seed=4, overwrite=True)
    meta = json.loads((out / "256_metadata.jsonl").read_text())
    assert [e["energon_pack"]["seed"] for e in meta] == [4] and _siblings(out) == [".packs.lock", "packs"]


def test_the_current_folder_and_a_folder_with_folders_are_refused(tmp_path, monkeypatch):
    src = tmp_path / "data.jsonl"
    _write_pc(src, 10)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="current folder"):
        _run(src, Path("."), tmp_path)
    (tmp_path / "packs" / "sub").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds the folder sub"):
        _run(src, tmp_path / "packs", tmp_path)
    assert [p.name for p in (tmp_path / "packs").iterdir()] == ["sub"]


def test_the_command_refuses_a_finished_output_and_overwrites_when_asked(tmp_path):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 20)
    assert _cli(src, out, tmp_path).returncode == 0
    before = _digest(out)
    again = _cli(src, out, tmp_path, "--seed", "5")
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "already holds a finished training output" in again.stderr and "--overwrite" in again.stderr
    assert _digest(out) == before
    assert _cli(src, out, tmp_path, "--seed", "5", "--overwrite").returncode == 0
    assert json.loads((out / "256_metadata.jsonl").read_text())[0]["energon_pack"]["seed"] == 5
