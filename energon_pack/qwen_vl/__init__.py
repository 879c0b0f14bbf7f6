"""Qwen-VL sample encoding (pure functions; no Energon import)."""
