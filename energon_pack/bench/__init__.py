"""Benchmarks: scripts that print a table and write a JSON result (never timed unit tests)."""
