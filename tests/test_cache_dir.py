"""Issue 21 item 4: caches never next to user data. ``inspect`` (the JSONL line index and length
caches) writes to the package's cache folder (``$ENERGON_PACK_CACHE_DIR``, else
``$XDG_CACHE_HOME/energon_pack``, else ``~/.cache/energon_pack``; ``--cache-dir`` moves it), keyed
by the file's identity, and reuses it on the next run."""

import json
import os
import stat
from pathlib import Path

from _cli_entry import energon_pack
from energon_pack.env import cache_dir
from energon_pack.sft.index import cache_key, cache_path, load_line_index


def listing(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def test_inspect_caches_in_the_user_cache_not_beside_the_file_and_reuses_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    path = data / "train.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"q {i}", "completion": "a " * (i % 30 + 1)}) + "\n" for i in range(300))
    )
    data.chmod(stat.S_IRUSR | stat.S_IXUSR)  # read-only, as a shared data folder is
    before = listing(data)
    env = {k: v for k, v in os.environ.items() if k != "ENERGON_PACK_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "home"))
    report = tmp_path / "report.json"
    try:
        runs = [
            energon_pack("inspect", str(path), "--tokenizer", "demo", "--json-out", str(report), env=env)
            for _ in range(2)
        ]
        assert listing(data) == before  # nothing new next to the input, nothing rewritten
    finally:
        data.chmod(stat.S_IRWXU)
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert "cannot write cache" not in run.stderr
    folder = tmp_path / "xdg" / "energon_pack" / "jsonl"
    assert f"cache   {folder} (written;" in runs[0].stdout and f"cache   {folder} (reused;" in runs[1].stdout
    assert json.loads(report.read_text())["cache"] == {"folder": str(folder), "state": "reused"}
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 4 and all(n.startswith(f"train.jsonl.{cache_key(path)}.") for n in names), names
    assert [n.rsplit(".", 1)[1] for n in names] == ["json", "npy", "json", "npy"]  # the index and the lengths


def test_cache_dir_flag_and_environment_variable_move_the_cache(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "q", "completion": "a"}) + "\n")
    env = dict(os.environ, ENERGON_PACK_CACHE_DIR=str(tmp_path / "by_env"))
    run = energon_pack("inspect", str(path), "--tokenizer", "demo", env=env)
    assert run.returncode == 0, run.stderr
    assert len(list((tmp_path / "by_env" / "jsonl").iterdir())) == 4
    run = energon_pack("inspect", str(path), "--tokenizer", "demo", "--cache-dir", str(tmp_path / "by_flag"), env=env)
    assert run.returncode == 0, run.stderr
    assert f"cache   {tmp_path / 'by_flag' / 'jsonl'} (written;" in run.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["by_env", "by_flag", "d.jsonl"]


def test_cache_folder_defaults_and_key_follow_the_file_identity(tmp_path, monkeypatch):
    monkeypatch.delenv("ENERGON_PACK_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == tmp_path / "home" / ".cache" / "energon_pack"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "energon_pack"
    monkeypatch.setenv("ENERGON_PACK_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n')
    first = cache_path(path, ".idx.npy")
    assert first.parent == tmp_path / "mine" / "jsonl" and load_line_index(path).tolist() == [8]
    assert first.exists() and cache_path(tmp_path / "." / "d.jsonl", ".idx.npy") == first  # the resolved path
    path.write_text('{"a": 1}\n{"b": 2}\n')  # a new identity: a new entry, and the old one is dropped
    assert cache_path(path, ".idx.npy") != first and load_line_index(path).tolist() == [8, 17]
    assert not first.exists() and len(list(first.parent.iterdir())) == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "d.jsonl").write_text('{"a": 1}\n')  # the same name elsewhere: its own entry
    assert cache_path(other / "d.jsonl", ".idx.npy") != cache_path(path, ".idx.npy")


def test_cache_dir_flag_is_scoped_to_the_command(tmp_path, monkeypatch):
    from energon_pack.cli import main

    monkeypatch.setenv("ENERGON_PACK_CACHE_DIR", str(tmp_path / "before"))
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "q", "completion": "a"}) + "\n")
    assert main(["inspect", str(path), "--tokenizer", "demo", "--cache-dir", str(tmp_path / "flag")]) == 0
    assert len(list((tmp_path / "flag" / "jsonl").iterdir())) == 4
    assert os.environ["ENERGON_PACK_CACHE_DIR"] == str(tmp_path / "before")  # restored after the command
