"""Issue 21 item 5: the first Ctrl-C stops a CLI command at once with exit status 130, keeps the
finished results (``bench`` writes each cell as it finishes), ends its worker processes and
prints one line (no "Exception ignored ... KeyboardInterrupt" noise). Through the real
``energon-pack`` entry point, with SIGINT sent to the process group as a terminal does."""

import json
import os
import signal
import subprocess
import time

import psutil

from _cli_entry import ROOT, energon_pack_command


def live_members(pgid: int) -> list[int]:
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def test_first_ctrl_c_stops_bench_at_once_and_keeps_the_finished_cells(demo_shards, tmp_path):
    out = tmp_path / "out"
    result = out / "buffer_sizes.json"
    proc = subprocess.Popen(
        energon_pack_command()
        + [
            "bench",
            "--data",
            str(demo_shards),
            "--buffers",
            "1,4,16,64",
            "--packs",
            "40",
            "--tokenizer",
            "demo",
            "--workers",
            "2",
            "--out-dir",
            str(out),
            "--no-plots",
            "--loader-cells",  # a loader run per cell: the Ctrl-C lands in one of them
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while not result.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None and result.exists(), proc.communicate()
        time.sleep(1.0)  # into the next cell: its loader workers are running
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        sent = time.time()
        stdout, stderr = proc.communicate(timeout=30)
        took = time.time() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert took < 5, took
    lines = [line.strip("\r ") for line in stderr.replace("\r", "\n").splitlines()]
    assert [line for line in lines if "interrupted" in line] == ["energon-pack bench: interrupted"]
    for noise in ("Exception ignored", "KeyboardInterrupt", "Traceback"):
        assert noise not in stderr, stderr
    kept = json.loads(result.read_text())
    assert kept["complete"] is False and 1 <= len(kept["cells"]) < 8
    assert kept["cells"][0]["mode"] == "carry" and kept["cells"][0]["buffer"] == 1 and kept["cells"][0]["packs"] == 40
    time.sleep(0.5)
    assert live_members(proc.pid) == []  # no loader worker left behind
