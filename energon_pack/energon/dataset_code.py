"""A dataset's own Python code runs only when the user opts in (part of the Energon guards).

Energon runs code that a dataset's config names: ``sample_loader:`` / ``part_filter:`` strings in
``.nv-meta/dataset.yaml`` (``hook.py:fn``) are executed from the dataset folder
(``ModuleLoader.get_function``), and a ``__module__`` with ``__class__`` / ``__function__`` in a dataset or
metadataset config is imported and called (``JsonParser._resolve_object``). A dataset is data (its pickles never
run either: :data:`~energon_pack.energon.chatml.ALLOW_UNSAFE_PICKLE_ENV`), so the two guards here, installed with
the others by :func:`~energon_pack.energon.compat.install_energon_guards`, refuse such code before Energon loads
it with one :class:`~energon_pack.errors.ConfigError` naming the config, the hook and the opt-in
``ENERGON_PACK_ALLOW_DATASET_CODE=1``. Energon's own classes, ours and Megatron-Bridge's ChatML dataset stay allowed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from energon_pack.errors import ConfigError

from .bridge_layout import BRIDGE_CHATML_DATASET_CLASSES

#: ``1``: run the Python code a dataset's config names (only for datasets whose code you trust).
ALLOW_DATASET_CODE_ENV = "ENERGON_PACK_ALLOW_DATASET_CODE"
#: packages whose classes a dataset config may name without the opt-in (a module or a submodule of one)
TRUSTED_PACKAGES = ("megatron.energon", "energon_pack")
TRUSTED_MODULES = frozenset(module for module, _cls in BRIDGE_CHATML_DATASET_CLASSES)


def dataset_code_allowed() -> bool:
    """Whether the user opted in to running dataset code (:data:`ALLOW_DATASET_CODE_ENV` is ``1``)."""
    return os.environ.get(ALLOW_DATASET_CODE_ENV, "") == "1"


def _fix(what: str) -> str:
    return (
        f"set {ALLOW_DATASET_CODE_ENV}=1 only for a dataset whose code you trust, or {what} "
        "(a field_map, or our cookers, read the samples without code of the dataset's own)"
    )


def refuse_dataset_hooks(original: Callable) -> Callable:
    """``ModuleLoader.get_function`` that refuses a dataset's ``sample_loader`` / ``part_filter`` hook."""

    def get_function(self, module_fn, default_fn_name=None, relative_path=None):
        if not dataset_code_allowed():
            kind = default_fn_name or "a hook"
            config = relative_path / "dataset.yaml" if relative_path is not None else None
            where = str(config) if config is not None and config.is_file() else f"a dataset config in {relative_path}"
            source = module_fn.rsplit(":", 1)[0] if ":" in module_fn else module_fn
            if relative_path is not None:
                source = relative_path / source
            raise ConfigError(
                ALLOW_DATASET_CODE_ENV,
                f"{where} names {kind}: {module_fn!r}, Python code ({source}) that Energon would run in this "
                "process; a dataset's code is not run without your consent",
                _fix(f"remove {kind} from that config"),
            )
        return original(self, module_fn, default_fn_name, relative_path)

    return get_function


def refuse_dataset_imports(original: Callable) -> Callable:
    """``JsonParser._resolve_object`` that refuses a config's ``__module__`` outside :data:`TRUSTED_PACKAGES`."""

    def resolve_object(self, module_name, object_name, *args, **kwargs):
        trusted = module_name in TRUSTED_MODULES or any(
            module_name == p or module_name.startswith(p + ".") for p in TRUSTED_PACKAGES
        )
        if not trusted and not dataset_code_allowed():
            raise ConfigError(
                ALLOW_DATASET_CODE_ENV,
                f"a dataset or metadataset config names __module__: {module_name!r} ({object_name!r}), code that "
                f"Energon would import and run in this process; only {', '.join(TRUSTED_PACKAGES)} and "
                "Megatron-Bridge's ChatML dataset are loaded without your consent",
                _fix("name a megatron.energon class there"),
            )
        return original(self, module_name, object_name, *args, **kwargs)

    return resolve_object
