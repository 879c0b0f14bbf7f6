"""Issue targets as benchmark rows: a named value against a bound, and how a report prints it."""

from __future__ import annotations

from typing import Any


def check(name: str, value: float, op: str, bound: float) -> dict[str, Any]:
    """One target: ``value op bound`` with ``op`` in ``>=`` / ``<=``."""
    met = value >= bound if op == ">=" else value <= bound
    return {"target": name, "value": round(value, 6), "bound": bound, "op": op, "met": bool(met)}


def format_target(t: dict[str, Any]) -> str:
    return f"[{'met' if t['met'] else 'MISSED'}] {t['target']}: {t['value']} ({t['op']} {t['bound']})"
