"""``energon-pack prepare DIR``: Energon's ``prepare``, non-interactive, for a shard folder (local or
``msc://``) or a ``.jsonl`` file, with the shards each split got."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import REMOTE_KIND, CliError, convert_command, dataset_kind, index_files, raw_sources
from .options import OBJECT_WAIT_FLAGS, add_command, object_wait_options

NAME = "prepare"
KNOB_FLAGS: dict[str, str] = dict(OBJECT_WAIT_FLAGS)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, NAME, "energon prepare, non-interactive: a folder of *.tar shards or a .jsonl file")
    p.add_argument("dir", help="shard folder (indexed as a CrudeWebdataset) or a .jsonl file")
    p.add_argument(
        "--split",
        type=_split,
        default=(1.0, 0.0, 0.0),
        help="train,val,test ratio of *shards* (missing parts are 0); the default puts everything in "
        "train, so get_val_dataset yields nothing: e.g. 0.9,0.1 for a val split (needs several shards)",
    )
    object_wait_options(p)
    return p


def _split(text: str) -> tuple[float, float, float]:
    """``train[,val[,test]]`` shard ratios; missing parts are 0."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give train,val,test ratios, e.g. 0.9,0.1,0") from None
    if not 1 <= len(values) <= 3 or any(v < 0 for v in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give 1 to 3 non-negative ratios (train,val,test) with a positive sum, e.g. 0.9,0.1,0"
        )
    values += [0.0] * (3 - len(values))
    return tuple(values)  # type: ignore[return-value]


def run(args: argparse.Namespace) -> int:
    from energon_pack.energon.prepare import prepare
    from energon_pack.storage import is_remote

    if is_remote(args.dir):
        return _prepare_remote(args.dir, args.split)
    path = Path(args.dir)
    kind = dataset_kind(path)
    if kind == "missing":
        raise CliError(f"{path} does not exist: pass a folder of *.tar shards or a .jsonl file")
    if path.is_file() and path.suffix != ".jsonl":
        raise CliError(
            f"{path} is not a .jsonl file or a shard folder: convert JSON/JSONL/Parquet VLM data with "
            f"`energon-pack convert {path} OUT` (it prepares OUT)"
        )
    if path.is_dir() and kind not in ("shards", "prepared"):
        hint = (
            f"convert it with {convert_command(path)}"
            if raw_sources(path)
            else "write shards with `energon-pack convert SOURCE OUT` or `energon-pack make-demo DIR`"
        )
        raise CliError(f"{path} holds no *.tar shards: {hint}")
    count = prepare(path, **({} if path.is_file() else {"split": tuple(args.split)}))
    print(f"prepared {path}: {count} samples")
    if path.is_dir():
        print(f"wrote {path}/{index_files(_shard_count(path))}")
        _report_splits(path, args.split)
    else:
        print(f"wrote {path}.idx (Energon's line index)")
    return 0


def _prepare_remote(url: str, split: tuple[float, float, float]) -> int:
    """``energon-pack prepare msc://...``: a prefix of *.tar shards is indexed in place (Energon reads
    each shard once); anything else is refused before a byte is written."""
    from energon_pack.energon.prepare import prepare_webdataset

    kind = dataset_kind(url)
    if kind not in ("shards", "prepared"):
        fix = (
            "JSONL files are indexed on local disk only: copy it here and prepare it there"
            if url.endswith(".jsonl")
            else "pass the prefix of your *.tar shards"
        )
        raise CliError(f"{url} {REMOTE_KIND[kind]}: {fix}")
    count = prepare_webdataset(url, split=tuple(split))
    print(f"prepared {url}: {count} samples")
    print(f"wrote {url.rstrip('/')}/{index_files(_shard_count(url))}")
    _report_splits(url, split)
    return 0


def _shard_count(path: str | Path) -> int:
    """How many shards a prepared folder or prefix indexes (its ``.nv-meta/.info.json``)."""
    import json

    from energon_pack.storage import epath

    return len(json.loads((epath(path) / ".nv-meta" / ".info.json").read_text())["shard_counts"])


def _report_splits(path: str | Path, split: tuple[float, float, float]) -> None:
    """Shards per split of a prepared folder or prefix, with a warning for a requested split left empty."""
    import yaml
    from braceexpand import braceexpand

    from energon_pack.storage import epath

    parts = yaml.safe_load((epath(path) / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    # Energon collapses runs of shard names into brace patterns (demo-{000000..000002}.tar)
    shards = {name: sum(1 for p in parts.get(name) or [] for _ in braceexpand(p)) for name in ("train", "val", "test")}
    print("shards per split: " + ", ".join(f"{k} {v}" for k, v in shards.items()))
    for name, ratio in zip(shards, split):
        if ratio > 0 and shards[name] == 0:
            print(
                f"warning: the {name} split got no shard (ratios apply to whole shards, {sum(shards.values())} "
                f"here): write more, smaller shards (e.g. `energon-pack convert --samples-per-shard`) or "
                f"change --split",
                file=sys.stderr,
            )
    if shards["val"] == 0:
        print(
            "no val split: get_val_dataset yields nothing; `energon-pack prepare DIR --split 0.9,0.1` makes one "
            "(needs several shards)"
        )
