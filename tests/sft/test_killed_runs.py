"""A killed or terminated ``pack-offline`` leaves nothing holding its output lock: its forked tokenizer workers die
with it (SIGKILL included), SIGTERM ends it through its cleanup, a lock left to a killed run's orphaned workers (an
older version's) is taken over with one warning, and a lock held by anything else is still refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from test_pack_offline import _write_pc

from _bridge_light import tiny_tokenizer
from _killed import ENV, ROOT, alive, started_workers, still_alive
from energon_pack.errors import ConfigError
from energon_pack.processes import StaleLockWarning, holder_note
from energon_pack.sft import staged_output as so
from energon_pack.sft.pack_offline import pack_offline

pytest.importorskip("pyarrow")

#: the real command, its length-pass workers forced on (a small file: the 32 MiB threshold lowered) and held in
#: their first task, so the test kills the run while they run
_SLOW_WORKERS = """
import sys, time
import energon_pack.sft.length_pass as lp
import energon_pack.sft.pack_offline as po
po.PARALLEL_MIN_BYTES = 0
def slow(*args, _real=lp._length_range):
    time.sleep(120)
    return _real(*args)
lp._length_range = slow  # the forked workers call it
from energon_pack.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name not in {"data.jsonl", "cache"})


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_pack_offline_leaves_no_worker_and_the_next_run_succeeds(tmp_path, sig):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 200)
    cmd = [sys.executable, "-c", textwrap.dedent(_SLOW_WORKERS), "pack-offline", str(src), str(out)]
    cmd += ["--tokenizer", "demo", "--seq-length", "256", "--workers", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = started_workers(proc, 2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert still_alive(workers) == []  # the workers died with it (they sleep 120 s in their task)
    if sig == signal.SIGTERM:  # ended through its cleanup: exit status 128 + 15, staging removed, no traceback
        assert proc.returncode == 143 and "Traceback" not in err, err
        assert _siblings(out) == [".packs.lock"]
    else:
        assert proc.returncode == -signal.SIGKILL
    summary = pack_offline(src, out, seq_length=256, tokenizer=tiny_tokenizer(), cache_dir=tmp_path / "cache")
    assert (summary.lines, summary.skips) == (202, {"invalid_json": 1, "too_long": 1})
    assert _siblings(out) == [".packs.lock", "packs"]


#: a run of a version whose workers outlived it: it holds the lock, forks a worker that keeps the lock's file
#: descriptor and is not bound to it (the registry of held locks emptied), then is SIGKILLed
_ORPHANING = """
import os, signal, sys, time
from energon_pack import processes
from energon_pack.sft.staged_output import staged_output
with staged_output(sys.argv[1]):
    processes._HELD.clear()
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_lock_left_to_a_killed_runs_orphans_is_taken_over_with_one_warning(tmp_path):
    src, out = tmp_path / "data.jsonl", tmp_path / "packs"
    _write_pc(src, 20)
    lock = tmp_path / ".packs.lock"
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(_ORPHANING), str(out)], env=ENV, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    holder = int(lock.read_text().split()[0].removeprefix("pid="))
    orphans = [p.pid for p in psutil.process_iter() if p.pid != os.getpid() and _holds(p, lock)]
    assert len(orphans) == 1 and orphans[0] != holder and alive(orphans[0])  # the orphan holds the lock
    with pytest.warns(StaleLockWarning) as caught:
        summary = pack_offline(src, out, seq_length=256, tokenizer=tiny_tokenizer(), cache_dir=tmp_path / "cache")
    assert [str(w.message) for w in caught] == [
        f"took over the lock of {tmp_path}: the run that held it (pid {holder}) is gone and its orphaned worker(s) "
        f"{orphans[0]} still held it; they were killed"
    ]
    assert summary.packs > 0 and still_alive(orphans, within=0) == []
    assert lock.read_text() == f"{holder_note()}\n"  # the new holder noted (this process, until the next run)


def _holds(proc: psutil.Process, path: Path) -> bool:
    try:
        return any(f.path == str(path) for f in proc.open_files())
    except psutil.Error:
        return False


_FOREIGN = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, sys.argv[2].encode())
print("locked", flush=True)
time.sleep(120)
"""


def test_a_lock_held_by_another_program_is_refused_even_if_its_noted_holder_is_gone(tmp_path):
    out = tmp_path / "packs"
    gone = subprocess.Popen(["true"])
    gone.wait()
    note = holder_note().replace(f"pid={os.getpid()}", f"pid={gone.pid}")  # a dead holder, of our command line
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_FOREIGN), str(tmp_path / ".packs.lock"), note],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "locked\n"
        with pytest.raises(ConfigError, match="another run is writing") as err:
            with so.staged_output(out):
                pass
        assert err.value.fix == "wait for it to finish, or write to another output folder"
        assert proc.poll() is None  # not ours to kill: its command line is not the noted holder's
    finally:
        proc.kill()
        proc.wait()
