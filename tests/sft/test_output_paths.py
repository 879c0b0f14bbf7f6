"""pack-offline's output folder whatever its path: a symlinked output is replaced behind the link (the link kept), a
mount point is refused before any work (it cannot be renamed), a full disk is one error naming the folder, and the
overwrite hint is a flag argparse accepts."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_pack_offline import _write_pc

from _bridge_light import tiny_tokenizer
from _killed import ENV
from energon_pack.cli import pack_offline as pack_offline_command
from energon_pack.cli.wording import one_line
from energon_pack.errors import ConfigError
from energon_pack.sft import pack_offline as po
from energon_pack.sft import staged_output as so

pytest.importorskip("pyarrow")


def _pack(src: Path, out: Path, tmp_path: Path, **kw):
    return po.pack_offline(src, out, seq_length=256, tokenizer=tiny_tokenizer(), cache_dir=tmp_path / "cache", **kw)


def _seeds(out: Path) -> list[int]:
    return [e["energon_pack"]["seed"] for e in json.loads((out / "256_metadata.jsonl").read_text())]


def test_a_symlinked_output_is_replaced_behind_the_link(tmp_path):
    src, real, link = tmp_path / "data.jsonl", tmp_path / "disk" / "packs", tmp_path / "runs" / "packs"
    _write_pc(src, 30)
    _pack(src, real, tmp_path, seed=1)
    link.parent.mkdir()
    link.symlink_to(real, target_is_directory=True)
    _pack(src, link, tmp_path, seed=2, overwrite=True)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert _seeds(real) == [2]  # the link's target holds the new output, whole
    assert sorted(p.name for p in link.parent.iterdir()) == ["packs"]  # nothing left beside the link
    assert sorted(p.name for p in real.parent.iterdir()) == [".packs.lock", "packs"]
    assert sorted(p.name for p in real.iterdir()) == ["256_metadata.jsonl", "training_256.idx.parquet"]


def test_a_mount_point_is_refused_before_any_work(tmp_path, monkeypatch):
    src, out = tmp_path / "data.jsonl", tmp_path / "vol"
    _write_pc(src, 10)
    out.mkdir()
    monkeypatch.setattr(so, "_mount_points", lambda: {str(out)})  # as /proc/self/mountinfo lists a bind mount
    monkeypatch.setattr(po, "_pack_into", lambda *a, **k: pytest.fail("the work ran"))
    with pytest.raises(ConfigError) as err:
        _pack(src, out, tmp_path)
    assert (err.value.knob, err.value.fix) == ("out", f"write the packs to a folder inside it (e.g. {out / 'packs'})")
    assert err.value.problem.startswith(f"{out} is a mount point; the output folder is replaced as a whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "data.jsonl", "vol"]  # no lock, no staging


def test_a_swap_the_file_system_refuses_is_one_error_and_the_old_output_stays(tmp_path, monkeypatch):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 10)
    _pack(src, out, tmp_path, seed=1)

    def busy(stage, dest):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(dest))

    monkeypatch.setattr(so, "_swap_in", busy)
    with pytest.raises(ConfigError) as err:
        _pack(src, out, tmp_path, seed=2, overwrite=True)
    assert str(err.value).startswith(f"out: {out} cannot be renamed (Device or resource busy)")
    assert _seeds(out) == [1] and sorted(p.name for p in tmp_path.iterdir()) == [
        ".packs.lock",
        "cache",
        "data.jsonl",
        "packs",
    ]


def test_a_full_disk_names_the_output_folder(tmp_path, monkeypatch):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 10)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a file object's write raises it: no file name

    monkeypatch.setattr(po, "token_pass", full)
    with pytest.raises(ConfigError) as err:
        _pack(src, out, tmp_path)
    assert err.value.knob == "out"
    assert err.value.problem == f"no space left on the device of {out}; the old output is kept"
    assert err.value.fix.startswith(f"free space on the disk of {tmp_path} or write the packs to a folder")
    assert not out.exists()


def test_the_finished_output_hint_is_a_flag_argparse_accepts(tmp_path):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 10)
    _pack(src, out, tmp_path)
    with pytest.raises(ConfigError) as err:
        _pack(src, out, tmp_path)
    assert one_line(err.value, pack_offline_command.KNOB_FLAGS) == (
        f"--overwrite: {out} already holds a finished training output (training_256.idx.parquet, "
        "256_metadata.jsonl). Fix: pass --overwrite to replace it, or write to another folder"
    )


# ----------------------------------------------------------------------------- real mounts (root in a sandbox)
_IN_MOUNTS = """
import sys
from pathlib import Path
from _bridge_light import tiny_tokenizer
from energon_pack.errors import ConfigError
from energon_pack.sft.pack_offline import pack_offline
vol, full, src, cache = (Path(a) for a in sys.argv[1:5])
for out in (vol, vol / "packs", full / "packs"):
    try:
        s = pack_offline(src, out, seq_length=256, tokenizer=tiny_tokenizer(), cache_dir=cache)
        print("ok", out, s.packs)
    except ConfigError as exc:
        print("error", exc.knob, exc.problem)
"""


def test_real_mounts_a_mount_point_refused_a_folder_inside_it_works_a_full_disk_named(tmp_path):
    """In a private mount namespace (skipped where none can be made): a 16 MiB tmpfs at ``vol`` and an 8 KiB one at
    ``full``."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is missing")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    src, vol, full = tmp_path / "data.jsonl", tmp_path / "vol", tmp_path / "full"
    _write_pc(src, 400)
    vol.mkdir()
    full.mkdir()
    code = [sys.executable, "-c", textwrap.dedent(_IN_MOUNTS), str(vol), str(full), str(src), str(tmp_path / "cache")]
    script = 'mount -t tmpfs -o size=16m tmpfs "$4" && mount -t tmpfs -o size=8k tmpfs "$5" && exec "$@"'
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *code]
    run = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert run.returncode == 0, run.stderr
    expected = _pack(src, tmp_path / "here", tmp_path).packs
    assert run.stdout.splitlines() == [
        f"error out {vol} is a mount point; the output folder is replaced as a whole (staged beside it, then "
        "renamed), which a mount point does not allow",
        f"ok {vol / 'packs'} {expected}",
        f"error out no space left on the device of {full / 'packs'}; the old output is kept",
    ]
