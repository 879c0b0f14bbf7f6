"""Stress tier: ``pytest -m stress``. Bounded by default (each test well under 90 s on 2 cores);
``ENERGON_PACK_STRESS=full`` runs the full sweep (>= 200 resume cut points, every layout)."""

import os

import pytest


@pytest.fixture(scope="session")
def stress_scale() -> str:
    scale = os.environ.get("ENERGON_PACK_STRESS", "bounded")
    if scale not in ("bounded", "full"):
        raise pytest.UsageError(f"ENERGON_PACK_STRESS must be 'bounded' or 'full', got {scale!r}")
    return scale
