"""A killed or terminated ``convert`` leaves no worker holding its folder's lock, and the next run succeeds; a full
disk is one error naming the folder."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _killed import ENV, ROOT, started_workers, still_alive
from energon_pack.cli.convert import convert, shards
from energon_pack.errors import ConfigError


def test_convert_names_its_folder_on_a_full_disk_and_removes_its_partial_tars(tmp_path, monkeypatch):
    src, out = tmp_path / "t.jsonl", tmp_path / "out"
    src.write_text(_messages(4))

    def full(ctx, *a):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(ctx.tmp_dir) / "data-000000.tar"))

    monkeypatch.setattr(shards, "_convert_chunk", full)
    with pytest.raises(ConfigError) as err:
        convert(src, out, workers=0, progress=False)
    assert err.value.knob == "out_dir"
    assert err.value.problem == f"no space left on the device of {out} (writing {out}/.convert_tmp/data-000000.tar)"
    assert sorted(p.name for p in out.iterdir()) == [".convert_in_progress", ".convert_manifest.json"]


_SLOW_CONVERT = """
import sys, time
import energon_pack.cli.convert.shards as shards
def slow_chunk(*args, _real=shards._convert_chunk):
    time.sleep(120)
    return _real(*args)
shards._convert_chunk = slow_chunk  # the forked workers run it
from energon_pack.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _messages(n: int) -> str:
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    return "".join(json.dumps({"messages": turns}) + "\n" for _ in range(n))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_convert_leaves_no_worker_and_the_next_run_succeeds(tmp_path, sig):
    src, out = tmp_path / "t.jsonl", tmp_path / "out"
    src.write_text(_messages(8))
    cmd = [sys.executable, "-c", textwrap.dedent(_SLOW_CONVERT), "convert", str(src), str(out)]
    cmd += ["--workers", "2", "--samples-per-shard", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = started_workers(proc, 2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert still_alive(workers) == []
    if sig == signal.SIGTERM:  # its cleanup ran: the partial tars removed, the folder an interrupted conversion
        assert proc.returncode == 143 and "Traceback" not in err, err
        assert sorted(p.name for p in out.iterdir()) == [".convert_in_progress", ".convert_manifest.json"]
    else:
        assert proc.returncode == -signal.SIGKILL
    summary = convert(src, out, workers=2, samples_per_shard=2, progress=False, overwrite=True)
    assert (summary.written, summary.shards) == (8, 4)
