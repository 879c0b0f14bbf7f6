"""Fuzz ``energon-pack convert`` with hostile records mixed with good ones, then stream its output.

:func:`run_convert_fuzz` builds a tree (``src/`` with the records and ``src/imgs/`` as
``--image-root``, ``outside/`` holding files that must never be read) and a shuffled mix of good
records and hostile ones: paths (absolute outside, ``../``, ``file://`` incl. percent-encoded,
symlinks out and in loops, NUL, surrogates, very long, folders, missing), encodings (lone
surrogates, invalid UTF-8, a BOM, CR-only line ends, overlong strings, deep nesting), sizes (over
``--max-media-mb``, empty, truncated, headers that lie) and special files (FIFO, socket, a
character device, ``/dev/zero``, ``/dev/stdin``). Every record is labelled with its outcome: a
convert skip with a reason, written then a loader skip with a reason, or kept. The real CLI runs
in a subprocess (2 workers, timeout, stdin an open pipe) on the mix as JSONL and as a JSON array,
and on devices with ``--allow-outside-paths``; the real loader (Qwen2.5-VL, 2 workers) streams
each output. Figures: crashes, hangs, skips per reason wanted and counted, records written or
delivered other than wanted (or twice), outside bytes in shards, ``written - delivered - loader
skips``, and each line-level hostile record as a file's first line (:func:`first_line_probe`).
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import socket
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .loaders import stress_out_dir

TIMEOUT = 300
MAX_MEDIA_MB = 1
MARKER = b"OUTSIDE-SECRET-MARKER"
PASSWD = b"root:x:0:0:stress:/root:/bin/sh\n"
#: special files read with --allow-outside-paths: refused by kind or header, never read whole or waited on
DEVICES = [
    (name, (lambda p=p: _line(_rec(p))), ("convert", reason))
    for name, p, reason in (
        ("dev_zero", "/dev/zero", "not_a_regular_file"),
        ("dev_urandom", "/dev/urandom", "not_a_regular_file"),
        ("dev_null", "/dev/null", "not_a_regular_file"),
        ("dev_full", "/dev/full", "not_a_regular_file"),
        ("dev_shm_folder", "/dev/shm", "not_a_regular_file"),
        ("dev_stdin_open_pipe", "/dev/stdin", "missing_image"),  # realpath: /proc/PID/fd/pipe:[N], no such file
        ("proc_environ", "/proc/self/environ", "not_an_image"),
        ("proc_mem", "/proc/self/mem", "unreadable_image"),
    )
]
ARRAY_OUTCOMES = {"bom_mid_file": ("convert", "invalid_json")}
SCALE_SIZES = {"bounded": (1, 12), "full": (50, 1000)}  # (copies of every hostile case, good records)


def _image(fmt: str, w: int, h: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header states ``width`` x ``height`` over a few bytes of data (a header that lies)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


def build_tree(root: Path) -> dict[str, Path]:
    """The folders and files the records name (special files only where this system allows them)."""
    src, imgs, outside = root / "src", root / "src" / "imgs", root / "outside"
    for d in (imgs, outside):
        d.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        (imgs / f"ok{i}.jpg").write_bytes(_image("JPEG", 32 + 8 * i, 28, i))
    (imgs / "ok.png").write_bytes(_image("PNG", 36, 30, 7))
    (src / "top.png").write_bytes(_image("PNG", 30, 40, 8))  # in the source's folder, above --image-root
    (outside / "secret.jpg").write_bytes(_image("JPEG", 44, 32, 9) + MARKER)
    (outside / "passwd").write_bytes(PASSWD)
    (imgs / "big.png").write_bytes(_image("PNG", 30, 20, 5) + bytes((MAX_MEDIA_MB << 20) + 4096))
    (imgs / "empty.jpg").write_bytes(b"")
    jpeg = _image("JPEG", 64, 64, 11)
    (imgs / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (imgs / "lying.png").write_bytes(_png_claiming(60_000, 60_000))  # PIL's decompression-bomb limit
    (imgs / "lying_large.png").write_bytes(_png_claiming(4000, 3000))  # under it: too many tokens for the width
    (imgs / "lying_small.png").write_bytes(_png_claiming(300, 200))  # found when decoded
    (imgs / "text.jpg").write_bytes(b"not an image\n" * 10_000)
    (imgs / "garbage.jpg").write_bytes(b"\xff\xd8" + random.Random(3).randbytes(3000))
    links = {
        "link_in.jpg": imgs / "ok0.jpg",
        "link_out.jpg": outside / "secret.jpg",
        "outdir": outside,
        "loop_a.jpg": imgs / "loop_b.jpg",
        "loop_b.jpg": imgs / "loop_a.jpg",
        "zero.jpg": Path("/dev/zero"),
    }
    for name, target in links.items():
        (imgs / name).symlink_to(target)
    os.mkfifo(imgs / "pipe.jpg")
    with socket.socket(socket.AF_UNIX) as s:  # a bound socket leaves its file behind
        try:
            s.bind(str(imgs / "sock.jpg"))
        except OSError:  # path too long for AF_UNIX: the case is left out
            pass
    try:
        os.mknod(imgs / "chardev.jpg", 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero's device, inside the root
    except (OSError, AttributeError):  # not root: the case is left out
        pass
    return dict(src=src, imgs=imgs, outside=outside)


# ---------------------------------------------------------------------------------------- records
def _turns(q: str, n_images: int) -> list:
    return [{"from": "human", "value": "<image>\n" * n_images + q}, {"from": "gpt", "value": "An answer."}]


def _rec(image: Any = None, q: str = "What is shown?", **extra: Any) -> dict:
    images = [] if image is None else image if isinstance(image, list) else [image]
    return {**({"images": images} if images else {}), "conversations": _turns(q, len(images)), **extra}


def _line(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _nested(depth: int) -> bytes:
    return b'{"conversations": ' + _line(_turns("deep", 0)) + b', "meta": ' + b"[" * depth + b"]" * depth + b"}"


def cases(t: dict[str, Path]) -> list[tuple[str, str, Callable[[], bytes], tuple]]:
    """(name, category, JSONL line builder, outcome): ("convert", reason), ("loader", reason) or ("kept",)."""
    src, imgs, out = t["src"], t["imgs"], t["outside"]  # relative paths resolve against imgs (--image-root)
    secret = str(out / "secret.jpg")
    big_uri = "data:image/png;base64," + base64.b64encode((imgs / "big.png").read_bytes()).decode()
    good = _line(_rec(q="What is shown?"))  # text only: it stands alone as the first line too
    path = lambda ref, reason, stage="convert": (lambda: _line(_rec(ref)), (stage, reason))  # noqa: E731
    table = {
        "paths": {
            "absolute_outside": path(secret, "path_outside_root"),
            "traversal": path("../../outside/secret.jpg", "path_outside_root"),
            "traversal_in_absolute": path(f"{imgs}/../../outside/secret.jpg", "path_outside_root"),
            "file_uri_outside": path("file://" + secret, "path_outside_root"),
            "file_uri_percent_dotdot": path(f"file://{src}/%2E%2E/outside/secret.jpg", "missing_image"),  # not decoded
            "file_uri_percent_slash": path("file://%2Fetc%2Fpasswd", "missing_image"),
            "file_uri_host": path("file://localhost" + secret, "missing_image"),
            "system_file": path(str(out / "passwd"), "path_outside_root"),
            "symlink_out": path("link_out.jpg", "path_outside_root"),
            "symlink_dir_out": path("outdir/secret.jpg", "path_outside_root"),
            "symlink_loop": path("loop_a.jpg", "unreadable_image"),
            "nul_in_path": path("ok0.jpg\x00.png", "bad_image_ref"),
            "surrogate_escape_in_path": path("\udcff.jpg", "missing_image"),  # the byte 0xff: a valid file name
            "lone_surrogate_in_path": path("\ud800.jpg", "bad_image_ref"),
            "long_name": path("a" * 5000 + ".jpg", "unreadable_image"),
            "long_path": path("d/" * 3000 + "a.jpg", "unreadable_image"),
            "folder": path(str(imgs), "not_a_regular_file"),
            "missing": path("nope.jpg", "missing_image"),
            "remote": path("https://example.com/a.jpg", "remote_image"),
            "not_a_string": path(12345, "bad_image_ref"),
        },
        "encodings": {
            "lone_surrogate_text": (lambda: _line(_rec(q="bad \ud800 text")), ("convert", "invalid_text")),
            "invalid_utf8": (lambda: good.replace(b"What is", b"What \xff\xfe is"), ("convert", "invalid_utf8")),
            "overlong_utf8": (lambda: good.replace(b"What is", b"What \xc0\xaf is"), ("convert", "invalid_utf8")),
            "bom_mid_file": (lambda: b"\xef\xbb\xbf" + good, ("kept",)),
            "cr_only_line_ends": (lambda: good + b"\r" + good, ("convert", "invalid_json")),
            "escaped_nul_text": (lambda: _line(_rec(q="nul \x00 here")), ("kept",)),
            "overlong_string": (lambda: _line(_rec(q="word " * 20_000)), ("loader", "oversize")),
            "overlong_key": (lambda: _line(_rec(**{"k" * 100_000: 1})), ("kept",)),
            "deep_nesting_65": (lambda: _nested(65), ("convert", "invalid_json")),
            "deep_nesting_100000": (lambda: _nested(100_000), ("convert", "invalid_json")),
            "broken_json": (lambda: good[:-7], ("convert", "invalid_json")),
            "not_an_object": (lambda: b'["a", 1]', ("convert", "bad_record")),
        },
        "sizes": {
            "over_max_media_mb": path("big.png", "media_too_large"),
            "data_uri_over_cap": path(big_uri, "media_too_large"),
            "zero_bytes": path("empty.jpg", "not_an_image"),
            "no_header": path("text.jpg", "not_an_image"),
            "garbage_after_magic": path("garbage.jpg", "corrupt_image"),
            "truncated_jpeg": path("truncated.jpg", "corrupt_image", "loader"),
            "header_that_lies_bomb": path("lying.png", "corrupt_image"),
            "header_that_lies": path("lying_small.png", "corrupt_image", "loader"),
            "header_that_lies_large": path("lying_large.png", "oversize", "loader"),
        },
        "special files": {
            "fifo": path("pipe.jpg", "not_a_regular_file"),
            "socket": path("sock.jpg", "not_a_regular_file"),
            "char_device_inside": path("chardev.jpg", "not_a_regular_file"),
            "symlink_to_dev_zero": path("zero.jpg", "path_outside_root"),
            "dev_zero": path("/dev/zero", "path_outside_root"),
            "dev_stdin": path("/dev/stdin", "path_outside_root"),
            "proc_environ": path("/proc/self/environ", "path_outside_root"),
        },
    }
    present = {"socket": imgs / "sock.jpg", "char_device_inside": imgs / "chardev.jpg"}
    rows = []
    for category, named in table.items():
        for name, (build, outcome) in named.items():
            if name in present and not os.path.lexists(present[name]):
                continue
            rows.append((name, category, build, outcome))
    return rows


def good_records(t: dict[str, Path], n: int, rng: random.Random) -> list[bytes]:
    """``n`` good JSONL lines: text only, paths relative to --image-root, absolute, file://, a symlink inside,
    a file in the source's folder, two images."""
    imgs, top = t["imgs"], str(t["src"] / "top.png")
    refs = [
        None,
        "ok0.jpg",
        "ok.png",
        str(imgs / "ok2.jpg"),
        f"file://{imgs / 'ok3.jpg'}",
        "link_in.jpg",
        top,
        ["ok1.jpg", top],
    ]
    return [_line(_rec(refs[i % len(refs)], q=f"Question {i} {rng.random():.6f}?")) for i in range(n)]


# ---------------------------------------------------------------------------------------- runs
def first_line_probe(root: Path, table: list, good: bytes) -> dict[str, str]:
    """Each line-level hostile case as the FIRST line of a two-line JSONL file (then a good line):
    "ok" when convert writes the good record and counts one skip, else what happened."""
    from energon_pack.cli.convert import convert

    from .watchdog import Hang, hang_alarm

    root.mkdir(parents=True, exist_ok=True)
    found = {}
    for name, category, build, outcome in table:
        if category != "encodings":
            continue
        (root / f"{name}.jsonl").write_bytes(build() + b"\n" + good + b"\n")
        try:
            with hang_alarm(60):
                s = convert(root / f"{name}.jsonl", root / name, workers=0, progress=False, overwrite=True)
            want = (1, 2) if outcome[0] != "convert" else (1, 1)
            found[name] = (
                "ok"
                if (s.written == want[1] and s.records == 2 and s.skipped_total == 2 - want[1])
                else f"records {s.records}, written {s.written}, skipped {s.skipped}"
            )
        except Hang:
            found[name] = "hang"
        except Exception as exc:  # noqa: BLE001 - the figure is what convert did
            found[name] = f"{type(exc).__name__}: {exc}"[:240]
    return found


def _members(out: Path) -> tuple[Counter, bytes]:
    """(records written per key, all member bytes) of a convert output."""
    keys: Counter = Counter()
    blob = io.BytesIO()
    for shard in sorted(out.glob("data-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                keys[key] += ext == "json"
                blob.write(tar.extractfile(m).read())
    return keys, blob.getvalue()


def _stream(out: Path, workers: int) -> tuple[Counter, Counter, str | None]:
    """(keys delivered, loader skips by reason, crash) of one finite pass over the output."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from energon_pack.packing import PackingStatsTracker
    from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder

    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=2048)
    ds = get_val_dataset(
        str(out),
        split_part="train",
        batch_size=1,
        task_encoder=te,
        packing_buffer_size=16,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
    )
    tracker, keys = PackingStatsTracker(), Counter()
    try:
        for batch in get_loader(ds):
            tracker.update(batch["packing_stats"])
            keys.update(batch["__keys__"])
    except Exception as exc:  # noqa: BLE001 - a crash is a figure
        return keys, Counter(tracker.total.skips), f"{type(exc).__name__}: {exc}"[:500]
    return keys, Counter(tracker.total.skips), None


def run_convert_fuzz(out_dir, scale: str = "bounded", seed: int = 0, workers: int = 2) -> dict:
    """Convert a shuffled mix of good and hostile records, as JSONL and as a JSON array, and stream each
    output; returns the figures summed over both (per container under ``containers``)."""
    out_dir = stress_out_dir(out_dir, scale)
    copies, n_good = SCALE_SIZES[scale]
    rng = random.Random(seed)
    tree = build_tree(out_dir / "tree")
    table = cases(tree)
    items = [(line, ("good", "-", ("kept",))) for line in good_records(tree, n_good, rng)]
    items += [(build(), (name, category, outcome)) for _ in range(copies) for name, category, build, outcome in table]
    rng.shuffle(items)
    items.sort(key=lambda item: item[1][0] != "good")  # a good first line: see first_line_failures
    items[1:] = rng.sample(items[1:], len(items) - 1)
    (tree["src"] / "records.jsonl").write_bytes(b"".join(line + b"\n" for line, _ in items))
    # a JSON array streams element by element; a broken element unbalances the brackets of the rest, so none;
    # a BOM inside an array (after ",\n") is no JSON: invalid_json there
    in_array = [
        (line, (label[0], label[1], ARRAY_OUTCOMES.get(label[0], label[2])))
        for line, label in items
        if label[0] != "broken_json"
    ]
    (tree["src"] / "records.json").write_bytes(b"[" + b",\n".join(line for line, _ in in_array) + b"]")
    goods = [item for item in items if item[1][0] == "good"][: max(2, n_good // 4)]
    allowed = (_line(_rec(str(tree["outside"] / "secret.jpg"))), ("outside_file_allowed", "paths", ("kept",)))
    devices = (
        goods[1:]
        + [allowed]
        + [(build(), (name, "special files", outcome)) for _ in range(copies) for name, build, outcome in DEVICES]
    )
    devices = goods[:1] + rng.sample(devices, len(devices))
    (tree["src"] / "devices.jsonl").write_bytes(b"".join(line + b"\n" for line, _ in devices))
    result: dict[str, Any] = dict(
        scale=scale, records=0, hostile=0, good=0, cases=len(table) + len(DEVICES), containers={}
    )
    start = time.perf_counter()
    runs = (
        ("jsonl", "records.jsonl", items, False),
        ("json array", "records.json", in_array, False),
        ("devices, --allow-outside-paths", "devices.jsonl", devices, True),
    )
    for container, name, mix, allow in runs:
        part = _convert_and_stream(
            tree, tree["src"] / name, out_dir / f"converted_{name.replace('.', '_')}", mix, workers, allow
        )
        result["containers"][container] = part
        result["records"] += len(mix)
        result["good"] += sum(label[0] == "good" for _, label in mix)
        for key, value in part.items():
            if isinstance(value, (int, Counter)) and not isinstance(value, bool):
                result[key] = result.get(key, 0) + value
            elif key == "records_add_up":
                result[key] = result.get(key, True) and value
        result["errors"] = result.get("errors", []) + part["errors"]
    result["hostile"] = result["records"] - result["good"]
    for key in ("convert_skips", "convert_skips_wanted", "loader_skips", "loader_skips_wanted"):
        result[key] = dict(
            sorted(sum((Counter(p.get(key, {})) for p in result["containers"].values()), Counter()).items())
        )
    result["by_case"] = {name: outcome[1] if len(outcome) > 1 else "kept" for name, _, _, outcome in table}
    result["by_case"].update({f"{name} (--allow-outside-paths)": outcome[1] for name, _, outcome in DEVICES})
    result["first_line"] = first_line_probe(out_dir / "first_line", table, good_records(tree, 1, rng)[0])
    result["first_line_failures"] = sum(v != "ok" for v in result["first_line"].values())
    result["seconds"] = round(time.perf_counter() - start, 2)
    (out_dir / "convert_fuzz.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _run_cli(cmd: list[str], out: Path) -> tuple[int | None, str, str]:
    """(return code or None on a hang, stdout, stderr) of the CLI, its stdin an open pipe nobody writes to
    (``/dev/stdin`` is then a FIFO that never ends); stdout/stderr go to files (no pipe to fill)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    with open(log.with_suffix(".out"), "wb+") as so, open(log.with_suffix(".err"), "wb+") as se:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=so, stderr=se)
        try:
            rc = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        finally:
            proc.stdin.close()
        so.seek(0)
        se.seek(0)
        return rc, so.read().decode(errors="replace"), se.read().decode(errors="replace")


def _convert_and_stream(
    tree: dict[str, Path], src: Path, out: Path, items: list, workers: int, allow_outside: bool = False
) -> dict:
    """The real CLI on ``src`` (whose records are ``items``, in order), then the loader on ``out``."""
    labels = {f"{i:09d}": label for i, (_, label) in enumerate(items)}
    want_written = {k for k, (_, _, o) in labels.items() if o[0] != "convert"}
    want_delivered = {k for k, (_, _, o) in labels.items() if o[0] == "kept"}
    want_convert = Counter(o[1] for _, _, o in labels.values() if o[0] == "convert")
    want_loader = Counter(o[1] for _, _, o in labels.values() if o[0] == "loader")
    result: dict[str, Any] = dict(crashes=0, hangs=0, errors=[])
    cmd = [
        sys.executable,
        "-m",
        "energon_pack.cli",
        "convert",
        str(src),
        str(out),
        "--image-root",
        str(tree["imgs"]),
        "--workers",
        str(workers),
        "--no-progress",
        "--json",
        "--max-media-mb",
        str(MAX_MEDIA_MB),
        "--samples-per-shard",
        str(max(50, len(items) // 4)),
        "--overwrite",
        "--max-skipped-share",  # hostile records are most of the mix: every skip is counted, none fails the run
        "1",
    ] + ["--allow-outside-paths"] * allow_outside
    t0 = time.perf_counter()
    rc, stdout, stderr = _run_cli(cmd, out)
    if rc is None:
        return {**result, "hangs": 1, "errors": [f"{src.name}: convert gave no answer in {TIMEOUT} s"]}
    result["convert_seconds"] = round(time.perf_counter() - t0, 2)
    if rc or "Traceback" in stderr:
        return {**result, "crashes": 1, "errors": [f"{src.name}: convert rc={rc}: {stderr[-1500:]}"]}
    summary = json.loads(stdout)
    written, blob = _members(out)
    outside = [] if allow_outside else [MARKER, PASSWD, (tree["outside"] / "secret.jpg").read_bytes()[:4096]]
    if allow_outside:  # the control: the byte check does see an outside file that was allowed in
        result["outside_control_seen"] = MARKER in blob
    counted = Counter(summary["skipped"])
    delivered, loader_skips, crash = _stream(out, workers)
    result.update(
        written=summary["written"],
        convert_skips=dict(sorted(counted.items())),
        convert_skips_wanted=dict(sorted(want_convert.items())),
        skip_reason_mismatches=sum(((counted - want_convert) + (want_convert - counted)).values()),
        written_unwanted=len(set(written) - want_written),
        wanted_not_written=len(want_written - set(written)),
        written_twice=sum(n > 1 for n in written.values()),
        outside_bytes_in_shards=sum(b in blob for b in outside),
        records_add_up=summary["written"] + sum(counted.values()) == summary["records"] == len(items),
        crashes=int(crash is not None),
        errors=[f"{src.name}: loader: {crash}"] if crash else [],
        delivered=sum(delivered.values()),
        loader_skips=dict(sorted(loader_skips.items())),
        loader_skips_wanted=dict(sorted(want_loader.items())),
        delivered_twice=sum(n > 1 for n in delivered.values()),
        delivered_unwritten=len(set(delivered) - set(written)),
        delivered_unwanted=len(set(delivered) - want_delivered),
        wanted_not_delivered=len(want_delivered - set(delivered)),
        written_unaccounted=summary["written"] - sum(delivered.values()) - sum(loader_skips.values()),
        loader_reason_mismatches=sum(((loader_skips - want_loader) + (want_loader - loader_skips)).values()),
    )
    return result
