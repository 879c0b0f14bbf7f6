"""Benchmarks: scripts that print a table and write a JSON result (never timed unit tests).

The stress harness is not installed: it lives with the tests, in ``tests/stress/``."""
