"""Faults of video files, object storage and ``pack-offline``, each case with the outcome it must have.

:func:`run_faults` runs three groups and counts every case whose outcome is not the expected one:

- **video files**: WebDataset shards (``KEY.json`` + ``KEY.0.mp4`` / ``.mkv``) read through the real Energon
  loader (2 worker processes, :class:`~energon_pack.qwen_vl.task_encoder.QwenVLPackingTaskEncoder`) where good
  videos, images and text sit next to two concatenated 16000x16000 PNGs stored as ``KEY.0.mp4`` (a counted
  ``video_too_large`` skip decided from the header, each worker's peak USS, its private memory, under
  :data:`RSS_BOUND_MB` where the uncapped decode took 3.77 GB), a video of 8192x8192 frames (``video_too_large``
  from the header) and an MKV of 30 frames at a declared 1e6 fps whose frames share millisecond timestamps
  (delivered, its pack rows equal to the planned frames of a sequential PyAV decode). Every good sample delivered
  once, counted by ``__keys__``.
- **object storage** (moto behind the stalling front of ``tests/_s3_server.py``): a shard whose whole-object GET
  is accepted and never answered, with ``configure_object_waits(connect_timeout=1, read_timeout=1,
  wait_budget=5)``, fails the loader (2 workers, in a subprocess: a hang cannot hang the tier) with
  ``ObjectStoreTimeout`` naming the shard, within the budget plus :data:`LATE_SLACK` seconds; the same prefix
  through the normal profile delivers the local copy's keys.
- **pack-offline** (the CLI's ``main`` in processes of their own, forked from one that imported it: see
  :data:`_ZYGOTE`): two runs started at once into one folder (``--overwrite``,
  different seeds) leave one run's whole output, byte-equal to a clean run with its seed, and a loser says so in
  one stderr line with exit status 2; a run SIGKILLed after a seeded delay (spread over a run's measured duration)
  leaves the old output byte for byte or the new whole one, and the next run succeeds and leaves nothing beside the
  folder but its lock file.

Figures: ``crashes``, ``hangs``, ``wrong_outcome``, ``mixed_outputs``, ``over_memory_bound``, ``late_failures``
(all targets of 0) and ``cases`` (how many were checked); ``outcomes`` lists each case, expected and got.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from .loaders import stress_out_dir

TESTS = Path(__file__).resolve().parents[2]
ROOT = TESTS.parent
#: trials per scale
SCALE_SIZES = {
    "bounded": dict(races=2, kills=4, vp9=False),
    "full": dict(races=10, kills=30, vp9=True),
}
FIGURES = ("crashes", "hangs", "wrong_outcome", "mixed_outputs", "over_memory_bound", "late_failures")
#: the bound on a loader worker's peak USS while the PNG "video" is in its stream (the uncapped decode: 3.77 GB);
#: USS, not RSS: a forked worker's RSS also counts the parent's pages it shares, however large the parent has grown
RSS_BOUND_MB = 1024
MB = 2**20
#: a call that runs past this is a hang
HANG_SECONDS = 120
#: a stalled read that fails later than its wait budget plus this is a late failure
LATE_SLACK = 20
WAIT_BUDGET = 5
#: kill delays spread over this many times a run's measured duration: runs vary by about 20 %, and the swap comes in
#: the last tenth of a run, so the span reaches past the end of a run a little slower than the measured one
KILL_SPAN = 1.1
F2 = 28 * 28


class Tally:
    """The figures and every case's expected and got outcome."""

    def __init__(self) -> None:
        self.figures = dict.fromkeys(FIGURES, 0)
        self.outcomes: list[dict] = []

    def case(self, name: str, expected: Any, got: Any, figure: str = "wrong_outcome", ok: bool | None = None) -> bool:
        """Record one case; a mismatch (``ok`` False, by default ``got != expected``) counts under ``figure``."""
        ok = got == expected if ok is None else ok
        self.outcomes.append(dict(case=name, expected=expected, got=got, ok=ok, figure=None if ok else figure))
        if not ok:
            self.figures[figure] += 1
        return ok


def _tests_importable() -> None:
    """``tests/`` on ``sys.path`` (``_s3_server``, ``_video_files``): pytest puts it there, report.py does not."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


# ---------------------------------------------------------------------------------------- video files
def png_of_zero_rows(side: int) -> bytes:
    """A ``side`` x ``side`` black RGB PNG built by hand (IHDR, one IDAT of zlib-compressed zero rows fed in
    blocks, IEND): the generator holds a few MB, never the pixels (16000 x 16000: 768 MB decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows_per_block = 64
    block = (b"\x00" * (1 + 3 * side)) * rows_per_block  # filter byte 0, then the row's zero pixels
    compressor = zlib.compressobj(1)
    parts = [compressor.compress(block) for _ in range(side // rows_per_block)]
    parts.append(compressor.compress(block[: (side % rows_per_block) * (1 + 3 * side)]))
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


def flat_frames_video(path: Path, side: int, codec: str, frames: int = 2) -> bytes:
    """``frames`` flat grey ``side`` x ``side`` frames encoded with PyAV (``codec``: mjpeg encodes 8K fast)."""
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.width = stream.height = side
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if codec == "libvpx-vp9":
            stream.options = {"deadline": "realtime", "cpu-used": "8"}
        frame = av.VideoFrame.from_ndarray(np.full((side, side, 3), 90, np.uint8), format="rgb24")
        for _ in range(frames):
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path.read_bytes()


def _conversation(kind: str | None, i: int) -> bytes:
    parts = [{"type": kind}] if kind else []
    return json.dumps(
        [
            {"role": "user", "content": [*parts, {"type": "text", "text": f"What is in sample {i}?"}]},
            {"role": "assistant", "content": f"Sample {i} shows bars." + " More." * (i % 4)},
        ]
    ).encode()


def video_samples(root: Path, scale: str) -> tuple[list[dict], dict[str, tuple]]:
    """(WebDataset samples, key -> expected outcome): ``("delivered",)`` or ``("skip", reasons...)``."""
    from PIL import Image

    from _video_files import video_bytes

    scratch = root / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    hostile: list[tuple[str, dict, tuple]] = []
    png = png_of_zero_rows(16000)
    hostile.append(("png_16000_as_mp4", {"0.mp4": png + png}, ("skip", "video_too_large", "corrupt_video")))
    big = flat_frames_video(scratch / "big_8192.mkv", 8192, "mjpeg")
    hostile.append(("frames_8192_mjpeg_mkv", {"0.mkv": big}, ("skip", "video_too_large")))
    if SCALE_SIZES[scale]["vp9"]:
        big_vp9 = flat_frames_video(scratch / "big_8192.webm", 8192, "libvpx-vp9", frames=1)
        hostile.append(("frames_8192_vp9_webm", {"0.webm": big_vp9}, ("skip", "video_too_large")))
    dense = video_bytes(30, 1_000_000, 64, 48, scratch, ext="mkv")
    hostile.append(("mkv_30_frames_at_1e6_fps", {"0.mkv": dense}, ("delivered", "sequential frames")))
    good = [
        {"0.mp4": video_bytes(9, 10, 64, 48, scratch)},
        {"0.webm": video_bytes(12, 24, 40, 32, scratch, ext="webm")},
        {"0.mkv": video_bytes(17, 25, 90, 56, scratch, ext="mkv", gop=3)},
        {"0.mov": video_bytes(20, 5, 32, 64, scratch, ext="mov")},
    ]
    for side in ((40, 30), (56, 72)):
        buf = io.BytesIO()
        Image.new("RGB", side, (200, 10, 10)).save(buf, format="PNG")
        good.append({"0.png": buf.getvalue()})
    samples, expected = [], {}
    queue = [(f"good_{i}", media, ("delivered",)) for i, media in enumerate(good)]
    for i, item in enumerate(hostile):
        queue.insert(2 * i + 1, item)
    queue += [(f"text_{i}", {}, ("delivered",)) for i in range(4)]
    for i, (name, media, outcome) in enumerate(queue):
        key = f"{i:07d}"
        kind = None if not media else "image" if "0.png" in media else "video"
        samples.append({"__key__": key, "json": _conversation(kind, i), **media})
        expected[key] = (name, *outcome)
    return samples, expected


class WorkerMemory:
    """Samples each loader worker (this process's children): peak RSS and peak USS (its private pages: what it
    allocated itself; RSS also counts the pages it shares with this process since the fork, however large this
    process has grown), per worker."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.rss, self.uss = interval, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            for child in me.children(recursive=True):
                try:
                    info = child.memory_full_info()
                except psutil.Error:
                    continue
                self.rss[child.pid] = max(self.rss.get(child.pid, 0), info.rss)
                self.uss[child.pid] = max(self.uss.get(child.pid, 0), info.uss)
            self._stop.wait(self.interval)

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def reference_rows(data: bytes, preset, sampling):
    """The patch rows of ``data``'s planned frames, the frames decoded in order by PyAV (no seek, no timeline)."""
    import av
    import numpy as np

    from energon_pack import pixels
    from energon_pack.qwen_vl.video import plan_video
    from energon_pack.video import probe_video

    plan = plan_video(probe_video(data), preset, sampling)
    with av.open(io.BytesIO(data)) as container:
        decoded = [f.to_image() for f in container.decode(container.streams.video[0])]
    fast = pixels.compiled(preset.resample) is not None
    frames = np.stack(
        [
            pixels.resize(decoded[i], plan.resized_height, plan.resized_width, preset.resample, fast)
            for i in plan.frame_indices
        ]
    )
    return pixels.PendingPatchRows([frames], preset).to_tensor(), plan


def _pack_video_rows(batch: dict, key: str, video_keys: set[str]):
    """The ``pixel_values_videos`` rows of ``key``'s video in a pack (videos lie in ``__keys__`` order)."""
    start = 0
    grids = batch["video_grid_thw"].tolist()
    for k, grid in zip([k for k in batch["__keys__"] if k in video_keys], grids):
        rows = grid[0] * grid[1] * grid[2]
        if k == key:
            return batch["pixel_values_videos"][start : start + rows]
        start += rows
    return None


def run_video_cases(root: Path, scale: str, tally: Tally, workers: int = 2) -> dict:
    """The video-file cases through the loader; returns the peaks measured (MB) and the skips counted."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from energon_pack.packing import PackingStatsTracker
    from energon_pack.qwen_vl import get_preset
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    from .memory import _write
    from .watchdog import Hang, hang_alarm

    samples, expected = video_samples(root, scale)
    _write(root / "shards", samples)
    preset = get_preset("qwen2-vl", video_min_pixels=4 * F2, video_max_pixels=8 * F2)
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=2048)
    names = {key: outcome[0] for key, outcome in expected.items()}
    dense_key = next(k for k, name in names.items() if name == "mkv_30_frames_at_1e6_fps")
    dense = next(s for s in samples if s["__key__"] == dense_key)["0.mkv"]
    want_rows, plan = reference_rows(dense, preset, te.video_sampling)
    video_keys = {s["__key__"] for s in samples if any(m.split(".")[-1] in ("mp4", "webm", "mkv", "mov") for m in s)}
    delivered, tracker, crash, dense_rows = Counter(), PackingStatsTracker(), None, []
    ds = get_train_dataset(
        str(root / "shards"),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=False,
    )
    crash_figure = "crashes"
    with WorkerMemory() as memory:
        try:
            with hang_alarm(HANG_SECONDS):
                for batch in get_loader(ds):
                    tracker.update(batch["packing_stats"])
                    delivered.update(batch["__keys__"])
                    if dense_key in batch["__keys__"]:
                        dense_rows.append(_pack_video_rows(batch, dense_key, video_keys))
        except Hang:
            crash, crash_figure = f"no pack for {HANG_SECONDS} s", "hangs"
        except Exception as exc:  # noqa: BLE001 - a crash is a figure
            crash = f"{type(exc).__name__}: {exc}"[:500]
    tally.case("video loader pass ends", None, crash, crash_figure)
    skips = Counter(tracker.total.skips)
    wanted_skips = Counter()
    for key, (name, outcome, *detail) in expected.items():
        got = delivered[key]
        if outcome == "delivered":
            tally.case(f"{name}: delivered once", 1, got)
        else:
            tally.case(f"{name}: not delivered", 0, got)
            reason = next((r for r in detail if skips[r] > wanted_skips[r]), detail[0])
            wanted_skips[reason] += 1
    tally.case("skips by reason", dict(sorted(wanted_skips.items())), dict(sorted(skips.items())))
    tally.case("no key delivered that was not written", [], sorted(set(delivered) - set(expected)))
    rows = dense_rows[0] if len(dense_rows) == 1 else None
    if rows is None or rows.shape != want_rows.shape:
        got = f"rows of shape {None if rows is None else tuple(rows.shape)} in {len(dense_rows)} packs"
    else:
        diff = float((rows.float() - want_rows.float()).abs().max())
        got = "equal" if diff == 0 else f"max difference {diff}"
    tally.case(
        f"mkv_30_frames_at_1e6_fps: pack rows = {tuple(want_rows.shape)} rows of the sequential decode", "equal", got
    )
    peak_mb = max(memory.uss.values(), default=0) / MB
    tally.case(
        f"loader worker peak USS <= {RSS_BOUND_MB} MB with the 16000x16000 PNGs in the stream",
        True,
        peak_mb <= RSS_BOUND_MB,
        "over_memory_bound",
    )
    return dict(
        video_peak_worker_uss_mb=round(peak_mb, 1),
        video_peak_worker_rss_mb=round(max(memory.rss.values(), default=0) / MB, 1),
        video_workers_seen=len(memory.uss),
        video_skips=dict(sorted(skips.items())),
        video_delivered=sum(delivered.values()),
        video_planned_frames=list(plan.frame_indices),
    )


# ---------------------------------------------------------------------------------------- object storage
#: the stalled read, in a process of its own (argv: stress dir, dataset url, budget); prints one JSON line
_STALLED_READ = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from energon_pack.cli.wording import reported, worker_user_error
from energon_pack.object_waits import ObjectStoreTimeout, configure_object_waits
configure_object_waits(connect_timeout=1, read_timeout=1, wait_budget=float(sys.argv[3]))
from harness.loaders import make_loader
out = {"error": None}
start = time.perf_counter()
try:
    out["batches"] = sum(1 for _ in make_loader(sys.argv[2], mode="carry", workers=2, finite=True))
except Exception as exc:
    ours = reported(exc)
    from_worker = worker_user_error(exc)
    out["error"] = type(exc).__name__
    out["timeout_in_chain"] = isinstance(ours, ObjectStoreTimeout) or (
        from_worker is not None and issubclass(from_worker[0], ObjectStoreTimeout))
    out["message"] = str(ours) if isinstance(ours, ObjectStoreTimeout) else (from_worker or ("", str(exc)))[1]
finally:
    configure_object_waits(wait_budget=None)
out["seconds"] = time.perf_counter() - start
print(json.dumps(out))
"""


def _keys_of(path: str) -> Counter:
    from .loaders import close, make_loader

    loader = make_loader(path, mode="carry", workers=2, finite=True)
    keys = Counter(k for batch in loader for k in batch["__keys__"])
    close(loader)
    return keys


def _remote_keys(url: str) -> Counter:
    """:func:`_keys_of` in a fresh process: MSC keeps the storage clients of a profile name for the life of a
    process, so in a test session whose own S3 server came first, an in-process read would go to that server."""
    code = (
        "import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; from harness.faults import _keys_of; "
        "print(json.dumps(dict(_keys_of(sys.argv[3]))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(TESTS / "stress"), str(TESTS), url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=HANG_SECONDS,
    )
    if run.returncode != 0:
        raise RuntimeError(" | ".join(run.stderr.strip().splitlines()[-3:]))
    return Counter(json.loads(run.stdout.strip().splitlines()[-1]))


def _stalled_read(stalled: str, log: Path) -> subprocess.Popen:
    """:data:`_STALLED_READ` on ``stalled``, started (its one JSON line goes to ``log``)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _STALLED_READ, str(TESTS / "stress"), stalled, str(WAIT_BUDGET)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )


def _stalled_outcome(proc: subprocess.Popen, log: Path) -> dict:
    """The stalled read's JSON line; ``{"error": "hang"}`` when it gave none in time (it is then killed)."""
    try:
        proc.wait(timeout=HANG_SECONDS + 60)  # + the child's imports and loader start
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"error": "hang", "seconds": float(HANG_SECONDS)}
    lines = log.read_text(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"error": f"no answer, exit status {proc.returncode}: {' | '.join(lines[-8:])}"[:800]}


def run_store_cases(root: Path, tally: Tally) -> dict:
    """A stalled shard fails in time naming it; the same prefix through the normal profile delivers it whole (read
    while the stalled read waits)."""
    _tests_importable()
    from _s3_server import PROFILE, PROFILE_STALL, STALL_PREFIX, s3_server

    from .data import random_records, valid_keys, write_shards
    from .watchdog import Hang, hang_alarm

    records = [random_records(20, seed=s, max_len=200) for s in range(3)]
    local = write_shards(root / "local", records)
    wanted = Counter(valid_keys(records))
    with s3_server(root) as store:
        prefix = f"{STALL_PREFIX}faults"
        store.upload(local, prefix)
        stalled = store.url(prefix, PROFILE_STALL)
        proc = _stalled_read(stalled, root / "stalled_read.log")
        try:
            with hang_alarm(HANG_SECONDS):
                local_keys = _keys_of(str(local))
                remote_keys = _remote_keys(store.url(prefix, PROFILE))
            tally.case("normal profile: the local copy's keys, each once", local_keys, remote_keys)
            tally.case("local copy: every valid key once", wanted, local_keys)
        except Hang:
            tally.case("normal profile: read", "delivered", "hang", "hangs")
        except Exception as exc:  # noqa: BLE001 - a crash is a figure
            tally.case("normal profile: read", "delivered", f"{type(exc).__name__}: {exc}"[:500], "crashes")
        got = _stalled_outcome(proc, root / "stalled_read.log")
    seconds = float(got.get("seconds", 0.0))
    shard = re.compile(re.escape(stalled) + r"/part-\d{5}\.tar: not delivered after ")
    named = bool(got.get("timeout_in_chain")) and bool(shard.search(got.get("message", "")))
    hung = got.get("error") == "hang" or seconds > HANG_SECONDS
    tally.case(
        "stalled shard: the loader fails with ObjectStoreTimeout naming the shard",
        "ObjectStoreTimeout naming the shard",
        "ObjectStoreTimeout naming the shard" if named else got,
        "hangs" if hung else "wrong_outcome",
    )
    if not hung:
        tally.case(
            f"stalled shard: fails within the {WAIT_BUDGET} s budget + {LATE_SLACK} s",
            True,
            seconds <= WAIT_BUDGET + LATE_SLACK,
            "late_failures",
        )
    return dict(stalled_read_seconds=round(seconds, 1), store_keys=sum(wanted.values()))


# ---------------------------------------------------------------------------------------- pack-offline
def _source(path: Path, n: int = 1500, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt": "q " * rng.randint(1, 40), "completion": "ans " * rng.randint(1, 30)}) + "\n")
    return path


#: imports what a pack-offline run imports once, then forks one process per job line read from stdin (printing its
#: pid): the process, in a session of its own, waits for a byte on the job's FIFO ("go"), runs the CLI's
#: ``main(argv)`` (stderr to the job's log) and writes its exit status to the job's status file. Two runs then begin
#: at the same moment (the 3 s of imports would otherwise decide a race), a kill's delay counts from the start of the
#: run itself, and the tier pays for the imports once, not once per run
_ZYGOTE = """
import json, os, signal, sys, traceback
from energon_pack.cli.main import main
import energon_pack.cli.pack_offline, energon_pack.sft.pack_offline, pyarrow.parquet
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runs are reaped when they end; the harness watches their pids
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        continue
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    rc = 1
    try:
        os.setsid()
        os.environ.update(job["env"])
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        with open(job["go"], "rb") as go:
            go.read(1)
        rc = main(job["argv"])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    with open(job["status"], "w") as f:
        f.write(str(rc))
    os._exit(rc)
"""


class Runs:
    """Starts ``pack-offline SRC OUT --tokenizer demo --seq-length 256 --seed S --overwrite`` runs (see
    :data:`_ZYGOTE`); a ``with`` block ends the starter."""

    def __init__(self, root: Path) -> None:
        self.root, self.started = root, []
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def start(self, src: Path, out: Path, seed: int, cache: Path) -> CliRun:
        """A run of ``seed`` into ``out`` (caches in ``cache``), ready, waiting for :meth:`CliRun.go`."""
        base = self.root / f"run{len(self.started) + 1:04d}"
        os.mkfifo(f"{base}.go")
        argv = ["pack-offline", str(src), str(out), "--tokenizer", "demo", "--seq-length", "256"]
        job = dict(
            argv=[*argv, "--seed", str(seed), "--overwrite"],
            env={"ENERGON_PACK_CACHE_DIR": str(cache)},
            log=f"{base}.err",
            go=f"{base}.go",
            status=f"{base}.status",
        )
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the run starter gave no pid (exit status {self.proc.poll()})")
        self.started.append(CliRun(int(line), Path(job["go"]), Path(job["status"]), Path(job["log"])))
        return self.started[-1]

    def __enter__(self) -> Runs:
        return self

    def __exit__(self, *exc: Any) -> None:
        for run in self.started:  # a run never let go (the block failed) would wait on its FIFO for ever
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, signal.SIGKILL)
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class CliRun:
    """One started run: its pid (a session leader), FIFO, status file and stderr log."""

    def __init__(self, pid: int, go: Path, status: Path, log: Path) -> None:
        self.pid, self.go_path, self.status, self.log = pid, go, status, log

    def go(self) -> float:
        """Let the run begin; the time it began (``time.perf_counter``)."""
        with open(self.go_path, "wb") as go:
            go.write(b"g")
        return time.perf_counter()

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def finish(self) -> tuple[int | None, str]:
        """(exit status: -9 when it wrote none, i.e. was killed; None after :data:`HANG_SECONDS`; stderr); what is
        left of the run's process group is ended."""
        deadline = time.perf_counter() + HANG_SECONDS
        while self.alive() and time.perf_counter() < deadline:
            time.sleep(0.01)
        hung = self.alive()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # a hung run, or stray children of a killed one
        rc = None if hung else int(self.status.read_text()) if self.status.exists() else -signal.SIGKILL
        return rc, self.log.read_text(errors="replace") if self.log.exists() else ""


def _digest(folder: Path) -> dict[str, str] | None:
    """File name -> sha256 of every file in ``folder``; None when it is absent."""
    if not folder.is_dir():
        return None
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def whole(folder: Path) -> str | None:
    """None when ``folder`` is one whole output (its Parquet opens and holds its metadata's pack count), else why."""
    import pyarrow.parquet as pq

    try:
        meta = json.loads((folder / "256_metadata.jsonl").read_text())
        rows = pq.ParquetFile(folder / "training_256.idx.parquet").metadata.num_rows
    except Exception as exc:  # noqa: BLE001 - the figure is what a reader would meet
        return f"{type(exc).__name__}: {exc}"[:240]
    packs = meta[-1]["energon_pack"]["packs"]
    return None if rows == packs else f"{rows} Parquet rows, metadata says {packs} packs"


def _clean(runs: Runs, src: Path, out: Path, seed: int, tally: Tally) -> tuple[dict | None, float]:
    """(digest, seconds from go to exit) of a run alone into a new folder, with a cache of its own."""
    run = runs.start(src, out, seed, out.parent / f"cache{seed}")
    start = run.go()
    rc, err = run.finish()
    seconds = time.perf_counter() - start
    figure = "hangs" if rc is None else "crashes"
    tally.case(f"clean run, seed {seed}", 0, rc if rc == 0 else [rc, err[-600:]], figure)
    return _digest(out), seconds


def _race(runs: Runs, src: Path, folder: Path, seeds: tuple[int, int], clean: dict, tally: Tally, t: int) -> bool:
    """Two runs into one folder holding an older output, begun at the same moment (one cache, new to both); True
    when they met (one was refused). Where both win, the lock made them take turns: the later one's output holds."""
    out = folder / "packs"
    pair = [runs.start(src, out, s, folder.parent / f"{folder.name}.cache") for s in seeds]
    for run in pair:
        run.go()
    done = [run.finish() for run in pair]
    if any(rc is None for rc, _ in done):
        tally.case(f"race {t}", "both runs end", [rc for rc, _ in done], "hangs")
        return False
    ended = {s: run.status.stat().st_mtime_ns for s, run in zip(seeds, pair) if run.status.exists()}
    won = sorted((s for s, (rc, _) in zip(seeds, done) if rc == 0), key=ended.get)
    for s, (rc, err) in zip(seeds, done):
        if rc == 0:
            continue
        lines = [line for line in err.splitlines() if line.strip()]
        said = rc == 2 and len(lines) == 1 and "another run is writing" in lines[0]
        tally.case(
            f"race {t}: the run with seed {s} lost and says so in one line, exit status 2",
            "said",
            "said" if said else [rc, err[-600:]],
            "crashes" if "Traceback" in err or rc not in (0, 2) else "wrong_outcome",
        )
    tally.case(f"race {t}: a run wins", True, bool(won))
    problem, digest = whole(out), _digest(out)
    tally.case(
        f"race {t}: the folder is the (last) winner's whole output, equal to its clean run",
        "whole, equal to the winner's clean run",
        "whole, equal to the winner's clean run"
        if problem is None and won and digest == clean[won[-1]]
        else (problem or "bytes differ"),
        "mixed_outputs",
    )
    tally.case(
        f"race {t}: nothing beside the folder but its lock", [".packs.lock", "packs"], sorted(os.listdir(folder))
    )
    return len(won) == 1


def _kill(runs: Runs, src: Path, folder: Path, delay: float, clean: dict, tally: Tally, k: int) -> dict:
    """A run over the old output (seed 1's) SIGKILLed ``delay`` s after it began, then the next run (the cache the
    killed run began, maybe half-written, is the next run's)."""
    out, cache = folder / "packs", folder.parent / f"{folder.name}.cache"
    run, again = runs.start(src, out, 9, cache), runs.start(src, out, 9, cache)
    start = run.go()
    time.sleep(max(0.0, start + delay - time.perf_counter()))
    finished_first = not run.alive()
    run.kill()
    run.finish()
    digest = _digest(out)
    state = "old" if digest == clean[1] else "new" if digest == clean[9] else "absent" if digest is None else "other"
    tally.case(
        f"kill {k} at {delay:.2f} s: the old output byte for byte or the new whole one",
        "old or new",
        state,
        "mixed_outputs",
        ok=state in ("old", "new"),
    )
    again.go()
    rc, err = again.finish()
    figure = "hangs" if rc is None else "crashes" if "Traceback" in err else "wrong_outcome"
    tally.case(f"kill {k}: the next run succeeds", 0, rc if rc == 0 else [rc, err[-600:]], figure)
    beside = sorted(p.name for p in folder.iterdir())
    tally.case(
        f"kill {k}: the next run leaves the new output and only its lock beside it",
        [".packs.lock", "packs", "new"],
        [*beside, "new" if _digest(out) == clean[9] else "not the new output"],
    )
    return dict(delay=round(delay, 3), state=state, finished_first=finished_first)


def run_pack_offline_cases(root: Path, scale: str, tally: Tally, seed: int = 0) -> dict:
    """Races of two runs into one folder, and runs SIGKILLed at seeded points, against clean runs' bytes."""
    rng = random.Random(seed)
    sizes = SCALE_SIZES[scale]
    root.mkdir(parents=True, exist_ok=True)
    src = _source(root / "source.jsonl")
    refs = root / "clean"
    refs.mkdir(parents=True, exist_ok=True)
    clean: dict[int, dict | None] = {}
    kills, contended = [], 0
    with Runs(root) as runs:
        clean[9], duration = _clean(runs, src, refs / "seed9", 9, tally)  # the killed runs' seed: its duration
        for s in (1, 2):
            clean[s], _ = _clean(runs, src, refs / f"seed{s}", s, tally)
        tally.case(
            "clean runs of seeds 1, 2, 9 differ", 3, len({json.dumps(d, sort_keys=True) for d in clean.values()})
        )
        for t in range(sizes["races"]):
            folder = root / f"race{t}"
            shutil.copytree(refs / "seed9", folder / "packs")  # an existing output: --overwrite replaces it
            contended += _race(runs, src, folder, (1, 2) if t % 2 == 0 else (2, 1), clean, tally, t)
        for k in range(sizes["kills"]):
            folder = root / f"kill{k}"
            shutil.copytree(refs / "seed1", folder / "packs")  # the old output
            delay = KILL_SPAN * duration * (k + rng.random()) / sizes["kills"]  # one in each slice of the span
            kills.append(_kill(runs, src, folder, delay, clean, tally, k))
    return dict(
        pack_run_seconds=round(duration, 3),
        races=sizes["races"],
        races_contended=contended,
        kill_states=dict(sorted(Counter(k["state"] for k in kills).items())),
        kills=kills,
    )


# ---------------------------------------------------------------------------------------- the part
def run_faults(out_dir, scale: str = "bounded", seed: int = 0) -> dict:
    """Every case of the three groups; the figures (targets of 0), ``cases``, per-group seconds and ``outcomes``."""
    out_dir = stress_out_dir(out_dir, scale)
    _tests_importable()
    tally = Tally()
    result: dict[str, Any] = dict(scale=scale)
    for group, run in (
        ("video", lambda: run_video_cases(out_dir / "video", scale, tally)),
        ("store", lambda: run_store_cases(out_dir / "store", tally)),
        ("pack_offline", lambda: run_pack_offline_cases(out_dir / "pack_offline", scale, tally, seed)),
    ):
        start = time.perf_counter()
        try:
            result.update(run())
        except Exception as exc:  # noqa: BLE001 - a crashing group is a figure, the others still run
            tally.case(f"{group}: runs", None, f"{type(exc).__name__}: {exc}"[:500], "crashes")
        result[f"{group}_seconds"] = round(time.perf_counter() - start, 1)
    result.update(tally.figures, cases=len(tally.outcomes), outcomes=tally.outcomes)
    result["missed"] = [o for o in tally.outcomes if not o["ok"]]
    (out_dir / "faults.json").write_text(json.dumps(result, indent=2, default=str))
    return result
