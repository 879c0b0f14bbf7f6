"""Write the shards: :func:`convert` validates the knobs, sends chunks of records to a worker pool
(one tar per chunk, so the output does not depend on the worker count), moves the tars into the
output folder in source order, indexes them for Energon and writes the summary. Nothing here imports
torch or Megatron-Energon (shards are written with the standard library's tarfile, the index in pure
Python on a tested Energon release), so a small convert starts in a fraction of a second."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from energon_pack.chat.conversation import check_preference
from energon_pack.energon.media_store import STORED_ONCE_DATASET_YAML
from energon_pack.energon.prepare import prepare_webdataset
from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.processes import process_pool
from energon_pack.records import decode_json_record
from energon_pack.storage import is_remote, list_names, store_errors, upload_tree

from .dataset_info import INFO_FILE, read_entry, split_dataset_ref
from .dedup import MediaHomes, stash_media
from .detect import _open_source, _Source
from .media import _MissingRelative, media_roots
from .options import (
    DEFAULT_BRIDGE_PRESET,
    DEFAULT_MAX_MEDIA_MB,
    DEFAULT_MAX_SKIPPED_SHARE,
    LAYOUTS,
    MEDIA_STORES,
    VERIFY_MODES,
    _Context,
)
from .outdir import (
    IN_PROGRESS_FILE,
    MANIFEST_FILE,
    SUMMARY_FILE,
    TMP_DIR,
    _locked_out_dir,
    _prepare_out_dir,
    _write_manifest,
)
from .records import _BLANK, _iter_records, build_sample
from .summary import MAX_EXAMPLES, SHARD_NAME, ConvertSummary, skip_fix
from .tar_sink import TarSink

MEDIA_DIR = "media"  # the temporary store of --media-store dedup, under the run's temporary folder


@dataclass
class _ChunkResult:
    """What one chunk became: its counts, skips with examples, and its tar (None when nothing was written)."""

    index: int
    records: int = 0
    written: int = 0
    blank: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)
    images: int = 0
    image_bytes: int = 0
    videos: int = 0
    video_bytes: int = 0
    tool_records: int = 0  # written records with tool calls or tools (only some presets' templates train them)
    missing_relative: int = 0  # missing_image skips of a relative path
    found: Counter = field(default_factory=Counter)  # media root -> relative media paths found under it
    tar: str | None = None
    tar_bytes: int = 0


def _convert_chunk(ctx: _Context, index: int, container: str, items: list) -> _ChunkResult:
    """Convert one chunk of records into one tar under ``ctx.tmp_dir`` (runs in a worker process)."""
    res = _ChunkResult(index)
    path = Path(ctx.tmp_dir) / f"chunk-{index:06d}.tar"
    store = os.path.join(ctx.tmp_dir, MEDIA_DIR) if ctx.media_store == "dedup" else None
    with TarSink(str(path)) as sink:
        for rec_index, where, payload in items:
            res.records += 1
            try:
                if isinstance(payload, SampleSkipped):
                    raise payload
                rec = decode_json_record(payload) if isinstance(payload, (bytes, bytearray)) else payload
                fields, nimages, nbytes, nvideos, nvbytes, tools = build_sample(rec, f"{rec_index:09d}", ctx, res.found)
            except Exception as exc:  # any single bad record is a counted skip, never the end of the run
                skip = (
                    exc
                    if isinstance(exc, SampleSkipped)
                    else SampleSkipped("unexpected_error", f"{type(exc).__name__}: {str(exc)[:200]}")
                )
                res.skipped[skip.reason] += 1
                res.missing_relative += isinstance(skip, _MissingRelative)
                ex = res.examples.setdefault(skip.reason, [])
                if len(ex) < MAX_EXAMPLES:
                    ex.append(f"{where}: {skip.detail}" if skip.detail else where)
                continue
            sink.write(stash_media(fields, store) if store else fields)
            res.written += 1
            res.images += nimages
            res.image_bytes += nbytes
            res.videos += nvideos
            res.video_bytes += nvbytes
            res.tool_records += tools
    if res.written:
        res.tar, res.tar_bytes = str(path), path.stat().st_size
    else:
        path.unlink()
    return res


def _iter_chunks(src: _Source, size: int) -> Iterator[tuple[int, list, int]]:
    """(chunk index, [(record index, where, payload)], blank lines) in source order."""
    chunk, blank, n, index = [], 0, 0, 0
    for where, payload in _iter_records(src):
        if payload is _BLANK:
            blank += 1
            continue
        chunk.append((n, where, payload))
        n += 1
        if len(chunk) == size:
            yield index, chunk, blank
            chunk, blank, index = [], 0, index + 1
    if chunk or blank:
        yield index, chunk, blank


def convert(
    source: str | Path,
    out_dir: str | Path,
    *,
    image_root: str | Path | None = None,
    layout: str = "ours",
    format: str = "auto",
    samples_per_shard: int = 1000,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    verify: str = "header",
    prepare_workers: int = 2,
    allow_outside_paths: bool = False,
    max_media_mb: float = DEFAULT_MAX_MEDIA_MB,
    preset: str | None = None,
    preference: str = "refuse",
    max_skipped_share: float = DEFAULT_MAX_SKIPPED_SHARE,
    media_store: str | None = None,
) -> ConvertSummary:
    """Convert ``source`` (LLaVA / ShareGPT JSON or JSONL, OpenAI-messages JSONL, Parquet) into
    Energon-prepared WebDataset shards in ``out_dir``; returns a :class:`ConvertSummary`.

    ``workers`` processes (default: all CPUs; 0 or 1 converts in this process) convert chunks of
    ``samples_per_shard`` records, one shard per chunk: the output does not depend on
    ``workers``. A finished output is refused unless ``overwrite``, which deletes only what the
    previous run's manifest lists; a folder holding anything else, or locked by another convert,
    is always refused. ``verify="decode"`` fully decodes every image
    (catches truncated files) instead of reading its header only.

    Image paths are read only when they resolve (symlinks and ``file://`` included) inside the
    source's folder or ``image_root`` (``allow_outside_paths`` lifts that), name a regular file
    of at most ``max_media_mb`` MB and start with an image header; anything else is a counted skip.

    ``layout="bridge"`` stores each video as the frames qwen-vl-utils' default sampling takes, at the size
    ``preset``'s video budget resizes them to (default qwen2.5-vl), as JPEG: what the loader would train on.

    ``preference="chosen"`` writes a preference record (DPO/ORPO/reward ``chosen``/``rejected``, LLaMA-Factory
    ranking) as the SFT record of its prompt and chosen answer
    (:func:`~energon_pack.chat.conversation.chosen_as_sft`); the default ``"refuse"`` counts it as a
    ``preference_data`` skip. Either way the shards hold SFT records only: loading them needs no option.

    ``source`` may name a LLaMA-Factory dataset: ``data/dataset_info.json#mllm_demo`` (:mod:`.dataset_info`).
    Without ``image_root``, relative media paths are looked up in the roots :func:`~.media.media_roots` guesses
    (the source's folder, its ``dataset_info.json`` folder, the current folder); the summary says how many were
    found under each. A run that lost a whole media kind (every image or video record a ``missing_*`` skip) or more
    than ``max_skipped_share`` of its records still writes a whole output, and says why in ``summary.failed``
    (``energon-pack convert`` then exits with status 2; 1 accepts anything).

    ``media_store="dedup"`` (the default of the ``ours`` layout) stores each distinct media file (by the SHA-256 of
    its bytes) once, in the first record that uses it; later records reference it and the loader reads it back
    (:mod:`energon_pack.energon.media_store`). ``"inline"`` copies it into every record (self-contained samples;
    the only store of ``layout="bridge"``, whose reader takes the media from the sample).
    """
    t0 = time.perf_counter()
    if layout not in LAYOUTS:
        raise ConfigError("layout", f"unknown layout {layout!r}", f"use one of {', '.join(LAYOUTS)}")
    if verify not in VERIFY_MODES:
        raise ConfigError("verify", f"unknown mode {verify!r}", f"use one of {', '.join(VERIFY_MODES)}")
    if not isinstance(max_media_mb, (int, float)) or not 0 < max_media_mb < 1 << 20:
        raise ConfigError("max_media_mb", f"must be a positive number of MB, got {max_media_mb!r}", "pass e.g. 64")
    if isinstance(max_skipped_share, bool) or not isinstance(max_skipped_share, (int, float)):
        max_skipped_share = -1.0  # refused below, named
    if not 0 <= max_skipped_share <= 1:
        raise ConfigError(
            "max_skipped_share",
            f"must be a share from 0 to 1, got {max_skipped_share!r}",
            "pass e.g. 0.1 (1 accepts any loss)",
        )
    if not isinstance(samples_per_shard, int) or samples_per_shard < 1:
        raise ConfigError(
            "samples_per_shard", f"must be a positive integer, got {samples_per_shard!r}", "pass e.g. 1000"
        )
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    _bridge_preset(layout, preset)  # refused before anything is written
    media_store = _media_store(layout, media_store)
    check_preference(preference)
    if workers < 0:
        raise ConfigError("workers", f"must be >= 0, got {workers}", "pass 0 (in process) or a process count")
    for knob, value in (("source", source), ("image_root", image_root)):
        if value is not None and is_remote(value):
            raise ConfigError(
                knob,
                f"{value} is in object storage; convert reads its source and the images it names from local disk only",
                "copy them here first; OUT may be an msc:// prefix",
            )
    if is_remote(out_dir):
        return _convert_to_object_storage(
            source,
            str(out_dir),
            image_root=image_root,
            layout=layout,
            format=format,
            samples_per_shard=samples_per_shard,
            workers=workers,
            progress=progress,
            overwrite=overwrite,
            verify=verify,
            prepare_workers=prepare_workers,
            allow_outside_paths=allow_outside_paths,
            max_media_mb=max_media_mb,
            preset=preset,
            preference=preference,
            max_skipped_share=max_skipped_share,
            media_store=media_store,
        )
    ref = split_dataset_ref(source)
    entry = read_entry(*ref) if ref else None
    if entry is not None:
        source, format = entry.file, entry.format if format == "auto" else format
    source, out = Path(source), Path(out_dir)
    src = _open_pairs(source, format, preference)
    if entry is not None:
        src.detected = f"LLaMA-Factory dataset {entry.name} ({INFO_FILE}): {src.detected}"
    root_given = image_root is not None
    if root_given and not Path(image_root).is_dir():
        raise ConfigError("image_root", f"{image_root} is not a folder", "pass the folder image paths are relative to")
    lookup = media_roots(source, Path(image_root) if root_given else None, entry and entry.dataset_dir)
    image_root = Path(lookup[0])
    if out.resolve() == source.resolve():
        raise ConfigError("out_dir", f"{out} is the source", "write to another folder")
    with _locked_out_dir(out):
        _prepare_out_dir(out, overwrite)
        folder = source if source.is_dir() else source.parent
        roots = tuple(dict.fromkeys(os.path.realpath(p) for p in (*lookup, folder)))
        ctx = _Context(
            str(image_root.resolve()),
            layout,
            src.shape,
            verify,
            str(out / TMP_DIR),
            roots,
            bool(allow_outside_paths),
            int(max_media_mb * (1 << 20)),
            _bridge_preset(layout, preset),
            preference,
            lookup,
            entry.columns if entry else (),
            entry.tags if entry else (),
            media_store,
        )
        if media_store == "dedup":
            (out / TMP_DIR / MEDIA_DIR).mkdir()
        summary = ConvertSummary(
            str(source), str(out), src.shape, src.detected, layout, workers=max(1, workers), media_store=media_store
        )
        results = _run(ctx, src, samples_per_shard, workers, progress)

        examples: dict = {}
        skipped: Counter = Counter()
        names = [SHARD_NAME % i for i in range(sum(1 for res in results if res.tar))]
        _write_manifest(out, names)
        shard, missing_relative, found = 0, 0, Counter()
        homes = MediaHomes(out / TMP_DIR / MEDIA_DIR)
        for res in results:  # chunk order: deterministic whatever the worker count
            missing_relative += res.missing_relative
            found.update(res.found)
            summary.records += res.records
            summary.written += res.written
            summary.blank_lines += res.blank
            summary.images += res.images
            summary.image_bytes += res.image_bytes
            summary.videos += res.videos
            summary.video_bytes += res.video_bytes
            summary.tool_records += res.tool_records
            skipped.update(res.skipped)
            for reason, ex in res.examples.items():
                examples.setdefault(reason, []).extend(ex[: MAX_EXAMPLES - len(examples.get(reason, []))])
            if res.tar and media_store == "dedup":
                summary.bytes += homes.finish(res.tar, out / (SHARD_NAME % shard))
                shard += 1
            elif res.tar:
                os.replace(res.tar, out / (SHARD_NAME % shard))
                summary.bytes += res.tar_bytes
                shard += 1
        summary.media_stored, summary.media_stored_bytes = len(homes.homes), homes.stored_bytes
        shutil.rmtree(out / TMP_DIR, ignore_errors=True)
        summary.shards = shard
        summary.skipped = dict(sorted(skipped.items()))
        summary.examples = {k: examples[k] for k in summary.skipped}
        if not root_given:
            summary.media_roots = {root: found[root] for root in lookup if found[root]}
        if missing_relative and not root_given:
            summary.hints.append(
                f"{missing_relative} record(s) skipped as missing_image: their relative image paths "
                f"were looked up in {', '.join(lookup)} (the roots guessed without --image-root); pass "
                "--image-root DIR, the folder they are relative to"
            )
        if summary.written == 0:  # nothing to keep: the folder is left empty
            for name in (IN_PROGRESS_FILE, MANIFEST_FILE):
                (out / name).unlink(missing_ok=True)
            detail = "; ".join(f"{r}={n} (e.g. {summary.examples[r][0]})" for r, n in summary.skipped.items())
            raise ConfigError(
                "source",
                f"none of the {summary.records} records of {source} could be converted: {detail or 'no records'}",
                "; ".join(summary.hints) or skip_fix(summary.skipped),
            )
        with contextlib.redirect_stdout(io.StringIO()):  # Energon prints its progress
            prepare_webdataset(out, workers=max(1, min(prepare_workers, shard)))
        if homes.shared:  # the subflavor that has the loader read shared media through its media store
            (out / ".nv-meta" / "dataset.yaml").write_text(STORED_ONCE_DATASET_YAML)
        if f"{src.shape} (JSON array," in src.detected:  # streamed: the count is known now
            summary.detected = src.detected.replace("JSON array", f"JSON array of {summary.records} records", 1)
        summary.failed = summary.losses(max_skipped_share)
        summary.seconds = round(time.perf_counter() - t0, 3)
        (out / SUMMARY_FILE).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
        (out / IN_PROGRESS_FILE).unlink(missing_ok=True)
        return summary


def _media_store(layout: str, media_store: str | None) -> str:
    """The media store of a run: ``dedup`` by default, ``inline`` for ``--layout bridge`` (Bridge's reader takes the
    media from the sample); a ConfigError for an unknown store or a dedup Bridge output."""
    if media_store is None:
        return "inline" if layout == "bridge" else "dedup"
    if media_store not in MEDIA_STORES:
        raise ConfigError(
            "media_store", f"unknown media store {media_store!r}", f"use one of {', '.join(MEDIA_STORES)}"
        )
    if layout == "bridge" and media_store == "dedup":
        raise ConfigError(
            "media_store",
            "--layout bridge keeps each record's media in the record (Megatron-Bridge reads the pickled media of the "
            "sample itself)",
            "leave --media-store out or pass --media-store inline with --layout bridge",
        )
    return media_store


def _open_pairs(source: Path, format: str, preference: str) -> _Source:
    """The source, detected; with ``preference="chosen"`` a JSON(L) file of pairs auto-detection cannot tell by their
    keys (TRL ``prompt`` / ``chosen``, alpaca ``chosen`` without ``output``) is read as messages records: each
    record's chosen answer becomes its ``messages`` (or alpaca ``output``) in :func:`build_sample`."""
    try:
        return _open_source(source, format)
    except ConfigError as exc:
        if preference != "chosen" or format != "auto" or not exc.problem.startswith("cannot tell the record shape"):
            raise
    src = _open_source(source, "messages")
    src.detected = src.detected.replace("as given", "preference pairs, read as their chosen answers")
    return src


def _bridge_preset(layout: str, preset: str | None) -> str:
    """The preset that sizes ``--layout bridge`` video frames; a ConfigError for an unknown one, or for
    one given with the ``ours`` layout (which stores videos as they are: the loader sizes them)."""
    from energon_pack.cli.common import PRESET_NAMES

    if preset is None:
        return DEFAULT_BRIDGE_PRESET
    if preset not in PRESET_NAMES:
        raise ConfigError("preset", f"unknown preset {preset!r}", f"use one of {', '.join(PRESET_NAMES)}")
    if layout != "bridge":
        raise ConfigError(
            "preset",
            f"only --layout bridge sizes video frames; the {layout} layout stores videos as they are",
            "leave --preset out (the loader's preset sizes them), or pass --layout bridge",
        )
    return preset


def _convert_to_object_storage(source: str | Path, out: str, *, overwrite: bool, **kw: Any) -> ConvertSummary:
    """:func:`convert` into an ``msc://`` prefix: converted and prepared in a temporary local folder
    (removed after), then uploaded as it is. A prefix that holds objects is refused before anything is
    converted (``overwrite`` does not apply: a remote output is never deleted)."""
    import tempfile

    with store_errors(out):
        held = list_names(out)
    if held:
        raise ConfigError(
            "out_dir",
            f"{out} already holds {len(held)} object(s) (e.g. {held[0]})"
            + ("; --overwrite replaces local outputs only" if overwrite else ""),
            "write to a new prefix",
        )
    with tempfile.TemporaryDirectory(prefix="energon_pack_convert_") as tmp:
        local = Path(tmp) / "out"
        summary = convert(source, local, **kw)
        summary.out_dir = out
        (local / SUMMARY_FILE).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
        with store_errors(out):
            upload_tree(local, out)
    return summary


def _run(ctx: _Context, src: _Source, size: int, workers: int, progress: bool) -> list[_ChunkResult]:
    from tqdm import tqdm

    results: list[_ChunkResult] = []
    chunks = _iter_chunks(src, size)
    bar_kw = dict(total=src.records, unit="rec", desc="convert", disable=not progress, file=sys.stderr, smoothing=0.1)

    def done(res: _ChunkResult, bar) -> None:
        results.append(res)
        bar.update(res.records)
        bar.set_postfix(
            written=sum(r.written for r in results),
            skipped=sum(sum(r.skipped.values()) for r in results),
            refresh=False,
        )

    if workers <= 1:
        with tqdm(**bar_kw) as bar:
            for index, items, blank in chunks:
                res = _convert_chunk(ctx, index, src.container, items)
                res.blank = blank
                done(res, bar)
    else:
        from concurrent.futures import FIRST_COMPLETED, wait

        blanks: dict[int, int] = {}
        with process_pool(workers) as pool, tqdm(**bar_kw) as bar:
            pending: set = set()
            for index, items, blank in chunks:
                blanks[index] = blank
                pending.add(pool.submit(_convert_chunk, ctx, index, src.container, items))
                if len(pending) >= 2 * workers:  # bound what is held in memory
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        done(fut.result(), bar)
            for fut in wait(pending).done:
                done(fut.result(), bar)
        for res in results:
            res.blank = blanks[res.index]
    return sorted(results, key=lambda r: r.index)
