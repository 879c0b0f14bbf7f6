"""Non-interactive Energon dataset preparation (what ``energon prepare`` does, without prompts)."""

from __future__ import annotations

import json
from pathlib import Path

DATASET_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"


def prepare_jsonl(path: str | Path) -> int:
    """Index a JSONL file for Energon (``energon prepare x.jsonl``); returns the line count."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.jsonl.crude_jsonl_dataset import CrudeJsonlDatasetFactory

    if not Path(path).is_file():
        raise FileNotFoundError(f"no JSONL file at {path}: check the path (`energon-pack prepare FILE.jsonl`)")
    return CrudeJsonlDatasetFactory.prepare_dataset(EPath(str(path)))


def prepare(path: str | Path, **kw) -> int:
    """Prepare a ``.jsonl`` file or a folder of ``*.tar`` shards for Energon."""
    return prepare_jsonl(path) if str(path).endswith(".jsonl") else prepare_webdataset(path, **kw)


def prepare_webdataset(root: str | Path, *, split: tuple[float, float, float] = (1.0, 0.0, 0.0), workers: int = 2) -> int:
    """Index the ``*.tar`` shards under ``root`` for Energon and declare them a CrudeWebdataset.

    Writes ``.nv-meta/{split.yaml,.info.json,index.sqlite,dataset.yaml}`` and one ``.tar.idx``
    per shard. ``split`` is the (train, val, test) ratio of shards. Returns the sample count.
    """
    from megatron.energon import BaseWebdatasetFactory

    root = Path(root)
    shards = sorted(str(p.relative_to(root)) for p in root.rglob("*.tar"))
    if not shards:
        raise FileNotFoundError(f"no *.tar shards under {root}: for JSON/JSONL/Parquet VLM data run "
                                f"`energon-pack convert SOURCE OUT` (it writes and prepares the shards)")
    BaseWebdatasetFactory.prepare_dataset(
        root,
        shards,
        split_parts_ratio=[("train", split[0]), ("val", split[1]), ("test", split[2])],
        shuffle_seed=None,
        workers=workers,
    )
    meta = root / ".nv-meta"
    (meta / "dataset.yaml").write_text(DATASET_YAML)
    return sum(json.loads((meta / ".info.json").read_text())["shard_counts"].values())
