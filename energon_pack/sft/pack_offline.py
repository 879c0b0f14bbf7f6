"""Offline GPT-SFT packs in Megatron-Bridge's packed Parquet format, from a JSONL of any size.

Bridge's runtime (``GPTSFTPackedParquetDataset``) reads rows of three list columns:
``input_ids`` (each sample's full token ids back to back, its last token included: the runtime
drops it from the input and uses it as the last label), ``loss_mask`` (int8, already rolled:
``loss_mask[i]`` = token ``i + 1`` is supervised) and ``seq_start_id`` (each sample's start).
A sample of ``n`` tokens takes ``aligned(n - 1, pad_seq_to_mult)`` runtime positions; with
``pad_seq_to_mult > 1`` it is stored padded with the EOS id (Bridge finds the logical length as
the last non-EOS token) to that length plus one. The packing-metadata JSON beside it
(``{seq_length}_metadata.jsonl``: a list of dicts) carries Bridge's keys, which
``pad_cu_seqlens`` requires, the topology the packs are for (``packed_sequence_size``,
``pad_seq_to_mult``, ``context_parallel_size``, ``tensor_model_parallel_size``,
``sequence_parallel``: what the GPT-SFT config check compares) and ours under ``"energon_pack"``.

Memory stays bounded: a length pass (parallel, line ranges) tokenises every line once and streams
its tokens to a temporary file, best-fit-decreasing packs the lengths, then the packs are read
back line by line and written one row group at a time (same inputs and seed -> the same bytes,
whatever ``workers``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..chat import ENDOFTEXT
from ..env import environ_set
from ..errors import AllSkippedError, ConfigError, Hint, skip_counts_text
from ..packing import best_fit_decreasing
from ..processes import process_pool
from ..thd import alignment_multiple
from .dataset import JsonlSFTDataset
from .formats import tokenizer_fingerprint
from .index import file_changed_error, file_fingerprint, file_identity
from .length_pass import (
    MAX_LOGGED_DETAILS,
    PARALLEL_MIN_BYTES,
    RANGE_LINES,
    RANGES_PER_WORKER,
    _length_range,
    _worker_init,
    _worker_range,
)
from .staged_output import staged_output

ROW_GROUP_SIZE = 500  # Bridge's write_packed_parquet default
METADATA_VERSION = 1
SPLITS = ("training", "validation", "test")


def parquet_schema():
    """The schema Bridge's own ``write_packed_parquet`` produces (ids and starts inferred as int64)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int8())),
            ("seq_start_id", pa.list_(pa.int64())),
        ]
    )


def output_paths(out_dir: str | os.PathLike, seq_length: int, split: str = "training") -> tuple[Path, Path]:
    """(packs, metadata) named as Bridge's GPT-SFT builder names them in its pack folder."""
    out = Path(out_dir)
    return out / f"{split}_{seq_length}.idx.parquet", out / f"{seq_length}_metadata.jsonl"


def bridge_eos_id(fmt: Any) -> int:
    """The id Bridge's runtime treats as EOS/padding: the format's EOS, else the tokenizer's, else <|endoftext|>."""
    eos = getattr(fmt, "eos_id", None)
    if isinstance(eos, int):
        return eos
    tok = fmt.tokenizer
    eos = getattr(getattr(tok, "inner", tok), "eos_token_id", None)
    if isinstance(eos, int):
        return eos
    eos = tok.token_to_id(ENDOFTEXT)
    if not isinstance(eos, int):
        raise ConfigError(
            "eos_id",
            "the tokenizer has no eos_token_id nor <|endoftext|>",
            "pass eos_id= (--eos-id): the id Bridge's tokenizer reports as eos_id",
        )
    return eos


def runtime_lengths(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Runtime positions per usable line (``aligned(n - 1, multiple)``); 0 for an unusable line."""
    n = np.maximum(lengths.astype(np.int64) - 1, 0)
    return np.where(lengths > 0, -(-n // multiple) * multiple, 0)


def plan_packs(lengths: np.ndarray, seq_length: int, multiple: int, seed: int) -> list[list[int]]:
    """Line numbers (0-based) per pack: best-fit-decreasing over the runtime lengths, packs in a
    seeded order, lines ascending inside a pack."""
    usable = np.flatnonzero(lengths > 0)
    costs = runtime_lengths(lengths[usable], multiple)
    groups = best_fit_decreasing(costs.reshape(-1, 1), (seq_length,), on_oversize="skip").groups
    order = np.random.default_rng(seed).permutation(len(groups))
    return [sorted(int(usable[k]) for k in groups[g]) for g in order]


def token_pass(ds: JsonlSFTDataset, workers: int, token_path: Path) -> np.ndarray:
    """The length pass, tokenising each line once: lengths (int32, as ``ds.lengths``: a negative
    reason code for an unusable line) returned and set on ``ds``; every usable line's tokens
    (int32 ``id * 2 + supervised``) appended to ``token_path`` in line order. Line ranges run in
    ``workers`` forked processes (at most 2 x workers ranges in flight; they die with this process, and
    a failure or SIGTERM ends them at once), merged in order: memory holds a few ranges, never the file's tokens."""
    n = len(ds)
    pieces = max(1, min(n, max(workers * RANGES_PER_WORKER, -(-n // RANGE_LINES))))
    bounds = np.linspace(0, n, pieces + 1).astype(np.int64).tolist()
    tasks = [(bounds[k], bounds[k + 1], True) for k in range(pieces) if bounds[k + 1] > bounds[k]]
    clone = object.__new__(type(ds))
    clone.__dict__.update({**ds.__dict__, "cache_tokens": True, "_tokens": None, "_lengths": None, "_starts": None})
    lengths = np.empty(n, dtype=np.int32)
    codes: dict[str, int] = {}
    details: dict[int, str] = {}

    def results():
        if workers <= 1 or len(tasks) <= 1:
            for task in tasks:
                yield _length_range(clone, *task)
            return
        from collections import deque

        with process_pool(workers, _worker_init, (clone,)) as pool:
            pending: deque = deque()
            with environ_set("TOKENIZERS_PARALLELISM", "false"):  # the first submit forks: silences the warning
                for task in tasks[: 2 * workers]:
                    pending.append(pool.submit(_worker_range, task))
            for task in tasks[2 * workers :]:
                yield pending.popleft().result()
                pending.append(pool.submit(_worker_range, task))
            while pending:
                yield pending.popleft().result()

    with contextlib.closing(results()) as parts, open(token_path, "wb") as sink:  # a failure ends the workers now
        for (start, stop, _), (part, reasons, part_details, tokens) in zip(tasks, parts):
            remap = np.asarray([codes.setdefault(r, len(codes)) for r in reasons], dtype=np.int32)
            bad = part < 0
            if bad.any():
                part[bad] = -1 - remap[-1 - part[bad]]
            lengths[start:stop] = part
            details.update(list(part_details.items())[: max(0, MAX_LOGGED_DETAILS - len(details))])
            sink.write(np.ascontiguousarray(tokens, dtype=np.int32).tobytes())
    ds._set_lengths(lengths, None)
    ds._reasons, ds._details = list(codes), details
    return lengths


class TokenFile:
    """Reads one line's tokens (ids, supervised mask) from :func:`token_pass`'s file."""

    def __init__(self, path: Path, lengths: np.ndarray) -> None:
        usable = np.maximum(lengths.astype(np.int64), 0)
        self.starts = np.concatenate([[0], np.cumsum(usable)[:-1]]) if len(usable) else usable
        self.lengths = lengths
        self.fd = os.open(path, os.O_RDONLY)

    def read(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = int(self.lengths[i])
        raw = os.pread(self.fd, 4 * n, 4 * int(self.starts[i]))
        packed = np.frombuffer(raw, dtype=np.int32).astype(np.int64)
        return packed >> 1, (packed & 1).astype(bool)

    def close(self) -> None:
        os.close(self.fd)


def pack_rows(tokens: TokenFile, packs: list[list[int]], multiple: int, eos_id: int) -> dict[str, Any]:
    """One row group: flat columns + row offsets, and counts (tokens, supervised, Bridge-dropped)."""
    ids_parts, mask_parts, starts, row_offsets, start_offsets = [], [], [], [0], [0]
    real = supervised = eos_dropped = 0
    for pack in packs:
        pos = 0
        for i in pack:
            input_ids, target = tokens.read(i)
            n = len(input_ids)
            stored = -(-(n - 1) // multiple) * multiple + 1
            ids = np.full(stored, eos_id, dtype=np.int64)
            ids[:n] = input_ids
            loss = np.zeros(stored, dtype=np.int8)
            loss[: n - 1] = target[1:]
            ids_parts.append(ids)
            mask_parts.append(loss)
            starts.append(pos)
            pos += stored
            real += n - 1
            supervised += int(loss.sum())
            eos_dropped += int(loss[: n - 1][input_ids[: n - 1] == eos_id].sum())
        row_offsets.append(row_offsets[-1] + pos)
        start_offsets.append(len(starts))
    return {
        "input_ids": np.concatenate(ids_parts),
        "loss_mask": np.concatenate(mask_parts),
        "seq_start_id": np.asarray(starts, dtype=np.int64),
        "row_offsets": np.asarray(row_offsets, dtype=np.int32),
        "start_offsets": np.asarray(start_offsets, dtype=np.int32),
        "real": real,
        "supervised": supervised,
        "eos_dropped": eos_dropped,
    }


def _table(rows: dict[str, Any]):
    import pyarrow as pa

    def column(values: np.ndarray, offsets: np.ndarray, kind: Any):
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, kind))

    return pa.Table.from_arrays(
        [
            column(rows["input_ids"], rows["row_offsets"], pa.int64()),
            column(rows["loss_mask"], rows["row_offsets"], pa.int8()),
            column(rows["seq_start_id"], rows["start_offsets"], pa.int64()),
        ],
        schema=parquet_schema(),
    )


@dataclass
class OfflinePackSummary:
    """What ``pack_offline`` wrote and skipped."""

    packs_path: str
    metadata_path: str
    lines: int
    samples: int
    packs: int
    skips: dict[str, int]
    real_tokens: int
    supervised_tokens: int
    fill: float  # runtime positions (alignment included) / capacity: Bridge's packing_efficiency
    real_fill: float  # real runtime tokens / capacity
    seconds: dict[str, float] = field(default_factory=dict)
    bridge_metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"{self.packs} packs of {self.samples} samples from {self.lines} lines, fill {self.fill * 100:.2f}%; "
            f"skipped: {skip_counts_text(self.skips)}\n  {self.packs_path}\n  {self.metadata_path}"
        )


def read_metadata(path: Path) -> list[dict[str, Any]]:
    """The packing-metadata list at ``path`` ([] when absent); anything else there is one clear error."""
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            "out", f"{path} is not a packing-metadata file (not JSON: {err})", "remove it, or write to a fresh folder"
        ) from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(
            "out",
            f"{path} is not a packing-metadata list (Bridge writes a list with one object per split)",
            "remove it, or write to a fresh folder",
        )
    return entries


def _split_of(entry: dict[str, Any]) -> str | None:
    ours = entry.get("energon_pack")
    return ours.get("split") if isinstance(ours, dict) else None


def _refuse_finished(packs_path: Path, entries: list[dict[str, Any]], split: str, meta_path: Path) -> None:
    """A finished output of this split is replaced only when asked (as ``convert`` refuses a written folder)."""
    if packs_path.exists() or any(_split_of(e) == split for e in entries):
        raise ConfigError(
            "overwrite",
            f"{packs_path.parent} already holds a finished {split} output ({packs_path.name}, {meta_path.name})",
            "pass overwrite=True to replace it, or write to another folder",
        )


def pack_offline(
    path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    seq_length: int,
    tokenizer: Any,
    format: str = "prompt_completion",
    pad_seq_to_mult: int | None = None,
    cp: int = 1,
    tp: int = 1,
    sp: bool = False,
    seed: int = 0,
    workers: int | None = None,
    split: str = "training",
    eos_id: int | None = None,
    overlength: str = "skip",
    cache_dir: str | os.PathLike | None = None,
    row_group_size: int = ROW_GROUP_SIZE,
    overwrite: bool = False,
    **format_kw: Any,
) -> OfflinePackSummary:
    """Pack a GPT-SFT JSONL into ``OUT/{split}_{seq_length}.idx.parquet`` + ``OUT/{seq_length}_metadata.jsonl``.

    ``pad_seq_to_mult`` defaults to ``alignment_multiple(cp, tp, sp)``; an explicit value must be a
    multiple of it, and ``seq_length`` a multiple of the result. ``workers`` processes tokenize
    (default: the usable cores; one below the length pass's 32 MiB threshold), each line once; the
    tokens wait in a temporary file beside the output (4 bytes a token) until their pack is written. A line
    that cannot be used is a counted skip (``summary.skips``).

    The output is whole or absent (:func:`~energon_pack.sft.staged_output.staged_output`): one run at a time per
    folder, everything written into a staging folder and swapped in at once, so a failed, killed or concurrent run
    leaves the old output or the new one, never a mix. A folder that already holds this split's output is refused
    unless ``overwrite``; other splits' files in it are kept.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "pyarrow",
            "pack-offline writes Parquet and needs pyarrow",
            "pip install 'energon-pack[convert]' (or pyarrow>=14)",
        ) from None
    rule = alignment_multiple(cp, tp, sp)
    multiple = rule if pad_seq_to_mult is None else pad_seq_to_mult
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1 or multiple % rule:
        raise ConfigError(
            "pad_seq_to_mult",
            f"{pad_seq_to_mult!r} does not satisfy cp={cp}, tp={tp}, sp={sp} (needs a multiple of {rule})",
            f"leave it unset (it is then {rule}) or use a multiple of {rule}",
        )
    if isinstance(seq_length, bool) or not isinstance(seq_length, int) or seq_length < 2 or seq_length % multiple:
        raise ConfigError(
            "seq_length",
            f"{seq_length!r} is not a multiple of pad_seq_to_mult {multiple}",
            f"use a multiple of {multiple}, e.g. {max(multiple, seq_length // multiple * multiple)}",
        )
    if split not in SPLITS:
        raise ConfigError("split", f"unknown split {split!r}", f"use one of {SPLITS}")
    if row_group_size < 1:
        raise ConfigError("row_group_size", f"must be >= 1, got {row_group_size!r}", f"use {ROW_GROUP_SIZE}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = cores if workers is None else workers
    if Path(path).stat().st_size < PARALLEL_MIN_BYTES:
        workers = 1  # processes cost more than they save on a small file (the length pass's own rule)
    t0 = time.perf_counter()
    ds = JsonlSFTDataset(
        path, tokenizer, format, max_length=seq_length + 1, overlength=overlength, cache_dir=cache_dir, **format_kw
    )
    eos = bridge_eos_id(ds.format) if eos_id is None else eos_id
    identity = file_identity(ds.path)
    if identity != ds.index.identity:
        raise file_changed_error(
            ds.path,
            f"size, mtime_ns, inode {ds.index.identity} when the line index was built, {identity} now",
            during="pack-offline",
        )
    packs_path, meta_path = output_paths(out_dir, seq_length, split)
    if not overwrite:  # checked before the work; checked again under the lock
        _refuse_finished(packs_path, read_metadata(meta_path), split, meta_path)
    with staged_output(packs_path.parent) as stage:
        entries = read_metadata(meta_path)
        if not overwrite:
            _refuse_finished(packs_path, entries, split, meta_path)
        summary = _pack_into(
            stage, ds, pq, seq_length, split, multiple, seed, workers, row_group_size, eos, identity, t0
        )
        ours = {
            "version": METADATA_VERSION,
            "split": split,
            "file": packs_path.name,
            "source": file_fingerprint(ds.path),
            "format": format,
            "format_fingerprint": ds.format.fingerprint(),
            "tokenizer": tokenizer_fingerprint(ds.format.tokenizer),
            "eos_id": eos,
            "seed": seed,
            "seq_length": seq_length,
            "pad_seq_to_mult": multiple,
            "topology": {"cp": cp, "tp": tp, "sp": bool(sp), "alignment_multiple": rule},
            "packer": "best_fit_decreasing",
            "overlength": overlength,
            **summary.pop("ours"),
        }
        topology = {  # the names integrations.bridge_sft.check_gpt_sft_config compares with the training config
            "packed_sequence_size": seq_length,
            "pad_seq_to_mult": multiple,
            "context_parallel_size": cp,
            "tensor_model_parallel_size": tp,
            "sequence_parallel": bool(sp),
        }
        entry = {**summary["bridge_metadata"], **topology, "energon_pack": ours}
        staged_meta = stage / meta_path.name
        staged_meta.unlink(missing_ok=True)  # a hard link of the old file: write a new one, never into it
        kept = [e for e in entries if _split_of(e) != split]
        staged_meta.write_text(json.dumps(kept + [entry], indent=1, sort_keys=True))
    return OfflinePackSummary(str(packs_path), str(meta_path), **summary)


def _pack_into(
    stage: Path,
    ds: JsonlSFTDataset,
    pq: Any,
    seq_length: int,
    split: str,
    multiple: int,
    seed: int,
    workers: int,
    row_group_size: int,
    eos: int,
    identity: Any,
    t0: float,
) -> dict[str, Any]:
    """Tokenise, plan and write the packs Parquet into ``stage``: the summary's fields, and under ``"ours"`` the
    counts the metadata records (``t0``: when the run started, for the length pass's seconds)."""
    packs_path = stage / output_paths(stage, seq_length, split)[0].name
    token_path = stage / f".{packs_path.name}.tokens.tmp"
    tmp = stage / f".{packs_path.name}.tmp"
    try:
        lengths = token_pass(ds, workers, token_path)
        if file_identity(ds.path) != identity:
            raise file_changed_error(ds.path, "changed while it was tokenised", during="pack-offline")
        t1 = time.perf_counter()
        packs = plan_packs(lengths, seq_length, multiple, seed)
        if not packs:
            raise AllSkippedError(
                f"{ds.path}: all {len(lengths)} lines were skipped",
                who=str(ds.path),
                skips=ds.skips,
                hints=(Hint.plain(ds.mismatch_hint()),),
            )
        t2 = time.perf_counter()
        real = supervised = eos_dropped = 0
        tokens = TokenFile(token_path, lengths)
        try:
            with pq.ParquetWriter(str(tmp), parquet_schema()) as writer:
                for k in range(0, len(packs), row_group_size):
                    rows = pack_rows(tokens, packs[k : k + row_group_size], multiple, eos)
                    writer.write_table(_table(rows), row_group_size=row_group_size)
                    real, supervised = real + rows["real"], supervised + rows["supervised"]
                    eos_dropped += rows["eos_dropped"]
        finally:
            tokens.close()
        packs_path.unlink(missing_ok=True)  # a hard link of the old file: replaced, never written into
        os.replace(tmp, packs_path)
    finally:
        token_path.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    t3 = time.perf_counter()

    runtime = runtime_lengths(lengths, multiple)
    packed = [int(runtime[p].sum()) for p in packs]
    samples = sum(len(p) for p in packs)
    bridge = {  # Bridge's create_packing_strategy keys, same definitions
        "dataset_max_seqlen": int(runtime.max()),
        "max_samples_per_bin": max(len(p) for p in packs),
        "packing_factor": round(samples / len(packs), 2),
        "packing_efficiency": round(sum(packed) / len(packs) / seq_length * 100, 2),
        "pack_size": seq_length,
        "min_packed_seqlen": min(packed),
    }
    ours = {
        "lines": len(lengths),
        "samples": samples,
        "packs": len(packs),
        "skips": dict(ds.skips),
        "real_tokens": real,
        "supervised_tokens": supervised,
        "supervised_eos_inputs": eos_dropped,  # Bridge's collate zeroes the loss where the input token is eos_id
    }
    return dict(
        lines=len(lengths),
        samples=samples,
        packs=len(packs),
        skips=dict(ds.skips),
        real_tokens=real,
        supervised_tokens=supervised,
        fill=sum(packed) / (len(packs) * seq_length),
        real_fill=real / (len(packs) * seq_length),
        seconds={"length_pass": round(t1 - t0, 3), "plan": round(t2 - t1, 3), "write": round(t3 - t2, 3)},
        bridge_metadata=bridge,
        ours=ours,
    )
