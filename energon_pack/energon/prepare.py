"""Non-interactive Energon dataset preparation (what ``energon prepare`` does, without prompts)."""

from __future__ import annotations

import json
from pathlib import Path

from energon_pack.errors import ConfigError
from energon_pack.storage import epath, is_remote, list_names

DATASET_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"


def prepare_jsonl(path: str | Path) -> int:
    """Index a JSONL file for Energon (``energon prepare x.jsonl``); returns the line count."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.jsonl.crude_jsonl_dataset import CrudeJsonlDatasetFactory

    if is_remote(path):
        raise ConfigError(
            "path",
            f"{path}: JSONL files are indexed on local disk only (Energon's JSONL reader "
            "needs the file and its .idx side by side)",
            "copy the file here and prepare it, or convert it into shards with `energon-pack convert` and upload those",
        )
    if not Path(path).is_file():
        raise FileNotFoundError(f"no JSONL file at {path}: check the path (`energon-pack prepare FILE.jsonl`)")
    try:
        return CrudeJsonlDatasetFactory.prepare_dataset(EPath(str(path)))
    except AssertionError:  # Energon's indexer asserts on the first line that is not one {...} object
        raise _jsonl_index_error(Path(path)) from None


def _jsonl_index_error(path: Path) -> ConfigError:
    """What Energon's JSONL indexer refused (it needs every non-blank line to be one ``{...}``), by line."""
    bad: list[str] = []
    lines = 0
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            lines += 1
            text = line.strip()
            if not text or (text.startswith(b"{") and text.endswith(b"}")):
                continue
            why = (
                "starts with a UTF-8 byte-order mark"
                if text.startswith(b"\xef\xbb\xbf")
                else "holds several records separated by CR only"
                if b"\r" in text
                else f"is not one JSON object: {text[:40]!r}"
            )
            bad.append(f"line {lineno} {why}")
            if len(bad) == 3:
                break
    if not lines or not bad:
        return ConfigError("jsonl", f"{path} holds no JSON record", "write one JSON object per line")
    return ConfigError(
        "jsonl",
        f"Energon's JSONL indexer needs every non-blank line of {path} to be one {{...}} object; " + "; ".join(bad),
        "fix or remove those lines (strip a BOM, convert CR line ends with `tr '\\r' '\\n'`), or load the file with "
        "JsonlSFTDataset, which counts such lines as skips",
    )


def prepare(path: str | Path, **kw) -> int:
    """Prepare a ``.jsonl`` file or a folder of ``*.tar`` shards for Energon."""
    return prepare_jsonl(path) if str(path).endswith(".jsonl") else prepare_webdataset(path, **kw)


def prepare_webdataset(
    root: str | Path, *, split: tuple[float, float, float] = (1.0, 0.0, 0.0), workers: int = 2
) -> int:
    """Index the ``*.tar`` shards under ``root`` for Energon and declare them a CrudeWebdataset.

    Writes ``.nv-meta/{split.yaml,.info.json,index.sqlite,index.uuid,dataset.yaml}`` and one ``.tar.idx``
    per shard. ``split`` is the (train, val, test) ratio of shards. Returns the sample count.
    A local folder on a tested Energon release is indexed in pure Python
    (:func:`~energon_pack.energon.index_writer.write_webdataset_index`: the same files, without importing
    torch or Energon, one shard after the other); otherwise Energon's ``prepare_dataset`` runs on
    ``workers`` processes. ``root`` may be in object storage (``msc://...``): Energon reads each shard
    once and writes the index there (the sqlite index is built in a temporary local file first).
    """
    from .index_writer import index_writer_matches_energon, write_webdataset_index

    shards = [name for name in list_names(root) if name.endswith(".tar")]
    if not shards:
        raise FileNotFoundError(
            f"no *.tar shards under {root}: for JSON/JSONL/Parquet VLM data run "
            f"`energon-pack convert SOURCE OUT` (it writes and prepares the shards)"
        )
    ratio = [("train", split[0]), ("val", split[1]), ("test", split[2])]
    if not is_remote(root) and index_writer_matches_energon() and not any("{" in name for name in shards):
        counts = write_webdataset_index(root, shards, split_parts_ratio=ratio)
        (Path(root) / ".nv-meta" / "dataset.yaml").write_text(DATASET_YAML)
        return sum(counts.values())
    from megatron.energon import BaseWebdatasetFactory

    where = epath(root)
    BaseWebdatasetFactory.prepare_dataset(where, shards, split_parts_ratio=ratio, shuffle_seed=None, workers=workers)
    meta = where / ".nv-meta"
    (meta / "dataset.yaml").write_text(DATASET_YAML)
    return sum(json.loads((meta / ".info.json").read_text())["shard_counts"].values())
