"""LLaMA-Factory's ``dataset_info.json`` read by dataset name: ``energon-pack convert data/dataset_info.json#mllm_demo
OUT`` converts the entry's ``file_name`` (relative to the file's folder, LLaMA-Factory's ``dataset_dir``) with its
``formatting`` (``alpaca`` by default, or ``sharegpt``), its ``columns`` renamed to the fields convert reads and its
sharegpt ``tags`` (role / content keys and role names) rewritten to ShareGPT's ``from`` / ``value`` turns. Media
paths resolve as LLaMA-Factory's ``media_dir`` default does: against the ``dataset_info.json`` folder."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_pack.errors import ConfigError

INFO_FILE = "dataset_info.json"
#: LLaMA-Factory column name -> the record field convert reads, per formatting (common columns in both)
_COMMON = ("system", "tools", "images", "videos", "audios", "chosen", "rejected", "kto_tag")
_FIELDS = {
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output", "history": "history"},
    "sharegpt": {"messages": "conversations"},
}
#: sharegpt tag -> (LLaMA-Factory's default, what the turn gets here); role tags map to ShareGPT's role names
_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
_REMOTE_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


@dataclass(frozen=True)
class DatasetEntry:
    """One ``dataset_info.json`` entry, ready for :func:`~.shards.convert`."""

    name: str
    file: Path
    dataset_dir: Path  # LLaMA-Factory's dataset_dir, its media_dir default
    format: str  # "alpaca" | "sharegpt"
    columns: tuple  # (entry column, field convert reads) for each column that differs
    tags: tuple  # (tag, value) when the entry names tags (its turns are rewritten to from / value)


def split_dataset_ref(source: str | Path) -> tuple[Path, str] | None:
    """(dataset_info.json, name) of ``PATH/dataset_info.json#NAME``, or of a bare ``dataset_info.json`` (name "");
    None for any other source."""
    text = str(source)
    if Path(text).name == INFO_FILE:
        return Path(text), ""
    path, sep, name = text.rpartition("#")
    return (Path(path), name) if sep and Path(path).name == INFO_FILE else None


def read_entry(info: Path, name: str) -> DatasetEntry:
    """The entry ``name`` of ``info``; a ConfigError naming the fix for a missing file or name, a remote entry or an
    unknown formatting."""
    fix = f"pass {info}#NAME with NAME one of its entries"
    try:
        entries = json.loads(info.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "source", f"cannot read {info}: {exc}", "pass LLaMA-Factory's data/dataset_info.json"
        ) from None
    if not isinstance(entries, dict):
        raise ConfigError("source", f"{info} is not a JSON object of datasets", fix)
    names = ", ".join(sorted(entries)[:12]) + (", ..." if len(entries) > 12 else "")
    if not name or name not in entries:
        problem = f"no dataset named {name!r} in {info}" if name else f"{info} names {len(entries)} dataset(s)"
        raise ConfigError("source", f"{problem} ({names})", fix)
    entry = entries[name]
    if not isinstance(entry, dict):
        raise ConfigError("source", f"{info}#{name} is not an object", fix)
    remote = next((k for k in _REMOTE_KEYS if k in entry), None)
    if "file_name" not in entry:
        problem = f"{info}#{name} has no file_name" + (
            f" (it is read from {remote}: {entry[remote]})" if remote else ""
        )
        raise ConfigError("source", problem, "download the data and convert its local file (convert never downloads)")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in _FIELDS:
        raise ConfigError(
            "source",
            f"{info}#{name} has formatting {formatting!r}",
            "convert reads LLaMA-Factory's alpaca and sharegpt formatting; convert the file itself with --format",
        )
    known = {**{c: c for c in _COMMON}, **_FIELDS[formatting]}
    given = entry.get("columns") or {}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(
            "source", f"{info}#{name} names unknown {formatting} columns {unknown}", f"use {', '.join(sorted(known))}"
        )
    columns = tuple((given[c], known[c]) for c in sorted(given) if given[c] and given[c] != known[c])
    tags = entry.get("tags") or {}
    if formatting != "sharegpt" or not isinstance(tags, dict):
        tags = {}
    return DatasetEntry(
        name,
        info.parent / entry["file_name"],
        info.parent,
        formatting,
        columns,
        tuple(sorted((k, v) for k, v in tags.items() if k in _TAGS)),
    )


def rename_columns(rec: dict, columns: tuple, tags: tuple) -> dict:
    """``rec`` with a dataset_info entry's columns renamed to the fields convert reads, and (when the entry names
    tags) each turn of its conversation rewritten to ShareGPT's ``from`` / ``value`` with its role names."""
    out = {k: v for k, v in rec.items() if k not in {src for src, _ in columns}}
    out.update({dst: rec[src] for src, dst in columns if src in rec})
    if tags and isinstance(out.get("conversations"), list):
        tag = {**_TAGS, **dict(tags)}
        roles = {tag[t]: _TAGS[t] for t in _TAGS if t not in ("role_tag", "content_tag")}
        out["conversations"] = [_turn(t, tag["role_tag"], tag["content_tag"], roles) for t in out["conversations"]]
    return out


def _turn(turn: Any, role_tag: str, content_tag: str, roles: dict) -> Any:
    if not isinstance(turn, dict) or role_tag not in turn:
        return turn  # left to the loader's checks (a counted skip)
    rest = {k: v for k, v in turn.items() if k not in (role_tag, content_tag)}
    role = turn[role_tag]
    return {**rest, "from": roles.get(role, role) if isinstance(role, str) else role, "value": turn.get(content_tag)}
