"""The dataset-provider class both Bridge roads build: a dataclass subclassing Bridge's ``DatasetProvider``.

Bridge dispatches on ``isinstance(cfg.dataset, DatasetProvider)`` and calls its ``build_datasets(context)``;
without Bridge importable the class is a plain dataclass with Bridge's dataloader fields, so configs can be
built and checked anywhere.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

#: Bridge's ``DatasetProvider`` dataloader fields (name, type, default), declared here only where Bridge is absent
DATALOADER_FIELDS = (
    ("num_workers", int, 2),
    ("data_sharding", bool, True),
    ("pin_memory", bool, True),
    ("drop_last", bool, True),
    ("persistent_workers", bool, True),
    ("trust_remote_code", bool | None, None),
    ("dataloader_save", str | None, None),
    ("dataloader_load", str | None, None),
)
_CLASSES: dict[str, type] = {}


def bridge_dataset_provider() -> type | None:
    """Bridge's ``DatasetProvider``: ``data.base`` since 0.4, ``training.config`` in 0.3; None without Bridge."""
    for module in ("megatron.bridge.data.base", "megatron.bridge.training.config"):
        try:
            return importlib.import_module(module).DatasetProvider
        except Exception:  # absent, or a Bridge whose import needs what this machine lacks
            continue
    return None


def provider_class(
    name: str, module: str, fields: list[tuple[str, Any, Any]], build_datasets: Callable, doc: str, **namespace: Any
) -> type:
    """The provider dataclass ``name`` (made once per process): ``fields`` as (name, type, default or
    ``dataclasses.field``), ``build_datasets`` as Bridge's hook, ``namespace`` extra attributes."""
    if name not in _CLASSES:
        base = bridge_dataset_provider()
        extra = list(DATALOADER_FIELDS) if base is None else []
        made = [
            (n, t, d if isinstance(d, dataclasses.Field) else dataclasses.field(default=d))
            for n, t, d in extra + fields
        ]
        cls = dataclasses.make_dataclass(
            name,
            made,
            bases=(base,) if base is not None else (),
            kw_only=True,
            namespace={"build_datasets": build_datasets, "__doc__": doc, **namespace},
        )
        cls.__module__ = module
        cls.__abstractmethods__ = frozenset()
        _CLASSES[name] = cls
    return _CLASSES[name]
