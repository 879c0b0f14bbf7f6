"""The compatibility matrix: each row of ``scripts/compat_envs.py`` runs its tests in its own environment.

``setup.sh`` builds the environments under ``.venv-compat/`` (the main venv's packages, with the
row's releases pinned in front: the oldest supported transformers, Megatron-Bridge's newest allowed
and the GPU image's; the lowest megatron-energon, Pillow and numpy allowed). Here every row runs
``<env>/bin/python -m pytest -q <its tests>`` in a subprocess and must pass; two rows run at a time.
A missing environment fails (run ``bash setup.sh``), it is not skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("compat_envs", ROOT / "scripts" / "compat_envs.py")
compat = sys.modules.setdefault("compat_envs", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(compat)

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("ENERGON_PACK_COMPAT_ENV")), reason="already inside a compat environment"
)


def _row_names(items) -> list[str]:
    return [
        item.callspec.params["name"]
        for item in items
        if item.module.__name__ == __name__ and hasattr(item, "callspec") and "name" in item.callspec.params
    ]


@pytest.fixture(scope="module")
def runs(request):
    """The selected rows' runs, started together on a pool of two (each waits for its own)."""

    def one(name):
        if not compat.python_of(name).exists():
            return None
        return compat.run(name)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(one, name) for name in _row_names(request.session.items)}
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize("name", list(compat.ENVS))
def test_compat_row_passes_in_its_environment(runs, name):
    row = compat.ENVS[name]
    assert compat.python_of(name).exists(), f"compat env {name} is missing: run `bash setup.sh` ({row.why})"
    wrong = compat.pinned_versions_seen(name)
    assert not wrong, f"compat env {name} does not see its pins {wrong}: run `bash setup.sh`"
    result = runs[name].result()
    output = result.stdout + result.stderr
    summary = output.strip().splitlines()[-1] if output.strip() else "(no output)"
    print(f"\n[{name}] {' '.join(row.pins)}: {summary}")
    assert result.returncode == 0, (
        f"{name} ({row.why}): `{compat.python_of(name)} -m pytest -q {' '.join(row.tests)}` failed:\n{output[-6000:]}"
    )
    assert re.search(r"\d+ passed", summary) and not re.search(r"\d+ (failed|errors?)\b", summary), summary


def test_every_row_pins_exact_releases_and_names_existing_tests():
    for name, row in compat.ENVS.items():
        assert row.pins and all("==" in p for p in row.pins), name
        assert row.tests and all((ROOT / t.split("::")[0]).is_file() for t in row.tests), name
