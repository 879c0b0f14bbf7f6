"""What the commands share beyond argparse: what a dataset path holds and the error that names
the command fixing it, local-only outputs, demo data, ``--tokenizer`` specs, ``--check`` exits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

DEMO_DIR = "demo_data"
PRESET_NAMES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")
RAW_SUFFIXES = (".json", ".jsonl", ".parquet")


class CliError(Exception):
    """A user error: printed as one line (``energon-pack CMD: error: ...``), exit status 2."""


def dataset_kind(path: str | Path) -> str:
    """What ``path`` holds: ``missing``, ``prepared`` (``.nv-meta/dataset.yaml``), ``prepared_jsonl``
    (a ``.jsonl`` with Energon's ``.idx``), ``raw`` (JSON / JSONL / Parquet file, or a folder with
    such files), ``shards`` (``*.tar`` not prepared), ``empty`` (an empty folder) or ``unusable``.
    An ``msc://`` path is looked at in object storage (:func:`remote_dataset_kind`)."""
    from energon_pack.storage import is_remote

    if is_remote(path):
        return remote_dataset_kind(str(path))
    path = Path(path)
    if not path.exists():
        return "missing"
    if path.is_file():
        if path.suffix == ".jsonl" and Path(str(path) + ".idx").exists():
            return "prepared_jsonl"
        return "raw" if path.suffix.lower() in RAW_SUFFIXES else "unusable"
    if (path / ".nv-meta" / "dataset.yaml").is_file():
        return "prepared"
    if not any(path.iterdir()):
        return "empty"
    if next(path.rglob("*.tar"), None) is not None:
        return "shards"
    if any(p.suffix.lower() in RAW_SUFFIXES for p in path.iterdir() if p.is_file()):
        return "raw"
    return "unusable"


def remote_dataset_kind(url: str) -> str:
    """:func:`dataset_kind` of an object-storage path: a file is one object; a folder is a prefix, and
    one without objects is ``missing`` (object stores have no empty folders). One HEAD and, for a
    prefix, one listing."""
    from energon_pack.storage import epath, list_names, store_errors

    with store_errors(url):
        if epath(url).is_file():
            if url.endswith(".jsonl") and epath(url + ".idx").is_file():
                return "prepared_jsonl"
            return "raw" if url.lower().endswith(RAW_SUFFIXES) else "unusable"
        names = list_names(url)
    if ".nv-meta/dataset.yaml" in names:
        return "prepared"
    if not names:
        return "missing"
    if any(n.endswith(".tar") for n in names):
        return "shards"
    return "raw" if any("/" not in n and n.lower().endswith(RAW_SUFFIXES) for n in names) else "unusable"


def raw_sources(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in RAW_SUFFIXES)


def convert_command(path: Path) -> str:
    """The ``energon-pack convert ... OUT`` command that accepts the raw data at ``path``: the file itself,
    a folder of Parquet files as it is, else one JSON/JSONL file of the folder (convert reads one such file)."""
    src = raw_sources(path)
    if len(src) == 1:
        return f"`energon-pack convert {src[0]} OUT`"
    json_files = [p for p in src if p.suffix.lower() != ".parquet"]
    if not json_files:
        return f"`energon-pack convert {path} OUT`"
    return (
        f"`energon-pack convert {json_files[0]} OUT` (convert reads one JSON/JSONL file, or a folder of Parquet "
        f"files: convert each of the {len(src)} files into its own OUT, or join JSONL files into one first)"
    )


def is_metadataset(path: str | Path) -> bool:
    """Whether ``path`` is a local Energon Metadataset YAML (``__class__: MetadatasetV2``, e.g. a blend)."""
    path = Path(str(path))
    return path.suffix in (".yaml", ".yml") and path.is_file() and "Metadataset" in path.read_text(errors="replace")


def require_prepared(path: str | Path, *, jsonl_ok: bool = False) -> str | Path:
    """``path`` if it is a prepared Energon dataset (an ``msc://`` one as the string); otherwise a
    :class:`CliError` naming the command that fixes it. Never writes anything."""
    from energon_pack.storage import is_remote

    if is_metadataset(path):  # a blend of prepared datasets: Energon checks its entries when it loads it
        return Path(path)
    kind = dataset_kind(path)
    if kind == "prepared" or (jsonl_ok and kind == "prepared_jsonl"):
        return str(path) if is_remote(path) else Path(path)
    if is_remote(path):
        raise CliError(
            f"{path} is not a prepared Energon dataset in object storage (it {REMOTE_KIND[kind]}): "
            f"point --data at the prefix that holds .nv-meta/dataset.yaml (prepare shards there with "
            f"`energon-pack prepare {path}`)"
        )
    path = Path(path)
    if kind == "missing":
        hint = (
            f"`energon-pack make-demo {path}` writes demo data there"
            if str(path) == DEMO_DIR
            else "check the path, or write demo data with `energon-pack make-demo DIR`"
        )
        raise CliError(f"{path} does not exist: {hint}")
    if kind == "shards":
        raise CliError(
            f"{path} holds *.tar shards but is not a prepared Energon dataset (no .nv-meta/dataset.yaml): "
            f"run `energon-pack prepare {path}` first"
        )
    if kind in ("raw", "prepared_jsonl"):
        what = (
            "a JSONL file prepared for the text encoder" if kind == "prepared_jsonl" else "raw JSON/JSONL/Parquet data"
        )
        raise CliError(f"{path} is {what}, not an Energon WebDataset: run {convert_command(path)} and pass --data OUT")
    if kind == "empty":
        raise CliError(
            f"{path} is an empty folder: convert your data into it with "
            f"`energon-pack convert SOURCE {path}`, "
            f"or write demo data with `energon-pack make-demo {path}`"
        )
    raise CliError(
        f"{path} holds no Energon dataset, *.tar shards or JSON/JSONL/Parquet data: point --data at a "
        f"folder prepared with `energon-pack convert` or `energon-pack prepare`"
    )


def index_files(shards: int) -> str:
    """The files preparing ``shards`` *.tar shards writes (Energon's index), for the line that announces them."""
    return (
        ".nv-meta/ (dataset.yaml, split.yaml, .info.json, index.sqlite, index.uuid) and a .tar.idx beside "
        f"each of the {shards} shard(s)"
    )


#: the arguments that name what a command writes (reports, packs): local paths only
OUTPUT_ARGS = ("out", "out_dir", "json_out", "cache_dir")

#: what a remote path holds, for messages (the kinds of :func:`remote_dataset_kind`)
REMOTE_KIND = {
    "missing": "holds no object",
    "prepared_jsonl": "is a prepared JSONL file",
    "raw": "holds raw JSON/JSONL/Parquet data",
    "shards": "holds *.tar shards without .nv-meta/dataset.yaml",
    "unusable": "holds no shards",
    "prepared": "is a prepared dataset",
}


def refuse_remote_output(path: Any, what: str) -> None:
    """A :class:`CliError` when ``path`` (something a command would write) is in object storage."""
    from energon_pack.storage import is_remote

    if path is not None and is_remote(path):
        raise CliError(
            f"{path}: {what} is written to local disk only, not to object storage: pass a local path "
            f"(and copy the result with your storage tools)"
        )


def demo_dataset(path: str | Path, samples: int) -> str | Path:
    """``energon-pack demo``: a prepared dataset is used as is (also one in object storage); demo data
    is written only into a local folder that is absent or empty; any other folder is refused (see
    :func:`require_prepared`)."""
    from energon_pack.storage import is_remote

    kind = dataset_kind(path)
    if is_remote(path) and kind != "prepared":
        raise CliError(
            f"{path} is not a prepared dataset (it {REMOTE_KIND[kind]}) and demo data is written to local "
            f"disk only: write it with `energon-pack make-demo DIR`, copy DIR (with .nv-meta/) there and "
            f"pass --data {path}"
        )
    if not is_remote(path):
        path = Path(path)
    if kind in ("missing", "empty"):
        from energon_pack.energon.demo_data import make_demo_shards

        print(f"writing {samples} demo samples to {path}/ ...", flush=True)
        make_demo_shards(path, samples)
        return path
    return require_prepared(path)


def ensure_demo_data(path: str | Path, samples: int) -> str | Path:  # kept for callers of the old name
    return demo_dataset(path, samples)


def resolve_tokenizer(spec: str | None, default: str = "qwen2.5-vl") -> tuple[Any, str]:
    """(tokenizer, description) for ``--tokenizer``: None -> the real tokenizer named ``default`` (a
    Qwen-VL name, built offline); ``demo`` -> the shipped demo tokenizer; a Qwen-VL name, a
    ``tokenizer.json`` file or a local Hugging Face folder otherwise. Never downloads."""
    from energon_pack.chat.tokenizer import describe_tokenizer, is_demo_tokenizer, qwen_vocab_version
    from energon_pack.chat.tokenizer import load_tokenizer as load

    tok = load(spec or default, where="--tokenizer")
    if is_demo_tokenizer(tok):
        return tok, f"demo tokenizer ({tok.inner.get_vocab_size()} tokens; lengths are not your model's)"
    if qwen_vocab_version(tok) is not None:
        return tok, describe_tokenizer(tok)
    size = tok.get_vocab_size() if hasattr(tok, "get_vocab_size") else len(tok)
    return tok, f"{spec} ({size} tokens)"


def targets_exit(targets: list[dict], check: bool, formatter: Any = None) -> int:
    missed = [t for t in targets if not t["met"]]
    if not check:
        if targets:
            print(
                "(the targets above are the project's own benchmark goals on its demo data, shown for "
                "information; --check makes a missed target exit 1)"
            )
        return 0
    if missed:
        print(f"--check: {len(missed)} of {len(targets)} targets missed", file=sys.stderr)
        return 1
    return 0


def jsonl_file(spec: str) -> Path:
    """``spec`` as a local JSONL file; a :class:`CliError` otherwise (object storage included: the GPT-SFT
    reader seeks by a line index of a local file)."""
    from energon_pack.storage import is_remote

    if is_remote(spec):
        raise CliError(
            f"{spec}: JSONL files are read from local disk only (the line index seeks in the file): copy it here first"
        )
    path = Path(spec)
    if not path.is_file():
        raise CliError(f"{path} is not a file: pass a JSONL file" + (" (a folder was given)" if path.is_dir() else ""))
    return path
