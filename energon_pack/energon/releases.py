"""Which Megatron-Energon releases energon_pack was tested on, and which one is installed, read without
importing Energon (and so torch): the gate of the loader guards (:mod:`.compat`) and of the pure-Python
dataset index (:mod:`.index_writer`)."""

from __future__ import annotations

#: Releases whose ``savable_loader.py`` the guards were read against and tested on, and whose webdataset
#: index (``prepare.py``, ``indexing.py``, ``itar.py``: the same source in both) the index writer mirrors:
#: 7.4.1 (the main environment) and 7.4.0 (the lowest ``pyproject.toml`` allows, ``scripts/compat_envs.py``).
TESTED_ENERGON_VERSIONS = ("7.4.0", "7.4.1")


def installed_energon_version() -> str:
    """The installed megatron-energon release from its package metadata ("unknown" when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-energon")
    except PackageNotFoundError:
        return "unknown"
